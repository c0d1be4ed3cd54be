"""The names a webdataset user types, backed by chute: ``import chute.wds as wds``."""

from chute.collate import default_collate as default_collation_fn
from chute.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from chute.shards import single_node_only, split_by_node, split_by_worker
from chute.webdataset import WebDataset, WebLoader

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
