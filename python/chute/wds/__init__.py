"""webdataset's pipeline over tar shards, run by chute: the names a
webdataset user types (``import chute.wds as wds``).

The package along its seams: ``stages`` records the fluent chain,
``compiler`` turns stages into the description of a native pipeline (a pure
function), ``native`` builds the engine's field plans, ``convert`` turns the
engine's batches into webdataset's types, ``pystages`` is the Python slow
path, ``even`` equalises batch counts across DDP ranks, and ``dataset`` and
``loader`` hold ``WebDataset`` and ``WebLoader``.
"""

from chute.collate import default_collate as default_collation_fn
from chute.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from chute.shards import single_node_only, split_by_node, split_by_worker
from chute.wds.dataset import WebDataset
from chute.wds.loader import WebLoader

__all__ = [
    "WebDataset",
    "WebLoader",
    "default_collation_fn",
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "warn_and_continue",
    "warn_and_stop",
]
