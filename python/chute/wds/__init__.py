"""webdataset's pipeline over tar shards, run by chute: the names a
webdataset user types (``import chute.wds as wds``).

The package along its seams: ``stages`` is one recorded stage, ``filters``
builds them under webdataset's function names and ``fluent`` under its
method names, ``compiler`` turns stages into the description of a native
pipeline (a pure function), ``native`` builds the engine's field plans and
routes failures to handlers, ``convert`` turns the engine's batches into
webdataset's types, ``pystages`` and ``autodecode`` are the Python slow path,
``even`` equalises batch counts across DDP ranks, ``resume`` is the state
dict, and ``dataset``, ``pipeline``, ``shardlists`` and ``loader`` hold
``WebDataset``, ``DataPipeline``, the shard sources and ``WebLoader``.
"""

from chute import handlers
from chute.errors import DecodingError
from chute.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from chute.wds import autodecode, filters, shardlists
from chute.wds.autodecode import (
    Continue,
    Decoder,
    ImageHandler,
    gzfilter,
    handle_extension,
    imagehandler,
)
from chute.wds.dataset import WebDataset
from chute.wds.filters import (
    Cached,
    LMDBCached,
    batched,
    decode,
    default_collation_fn,
    detshuffle,
    extract_keys,
    getfirst,
    info,
    log_keys,
    map,
    map_dict,
    map_tuple,
    pipelinefilter,
    rename,
    rename_keys,
    rsample,
    select,
    shuffle,
    slice,
    to_tuple,
    transform_with,
    unbatched,
    unlisted,
    xdecode,
)
from chute.wds.loader import WebLoader
from chute.wds.pipeline import (
    DataPipeline,
    FluidWrapper,
    MockDataset,
    tarfile_samples,
    tarfile_to_samples,
)
from chute.wds.shardlists import (
    ResampledShards,
    SimpleShardList,
    non_empty,
    resampled,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)

__all__ = [
    "Cached",
    "Continue",
    "DataPipeline",
    "Decoder",
    "DecodingError",
    "FluidWrapper",
    "ImageHandler",
    "LMDBCached",
    "MockDataset",
    "ResampledShards",
    "SimpleShardList",
    "WebDataset",
    "WebLoader",
    "autodecode",
    "batched",
    "decode",
    "default_collation_fn",
    "detshuffle",
    "extract_keys",
    "filters",
    "getfirst",
    "gzfilter",
    "handle_extension",
    "handlers",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "info",
    "log_keys",
    "map",
    "map_dict",
    "map_tuple",
    "non_empty",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "reraise_exception",
    "resampled",
    "rsample",
    "select",
    "shardlists",
    "shardspec",
    "shuffle",
    "single_node_only",
    "slice",
    "split_by_node",
    "split_by_worker",
    "tarfile_samples",
    "tarfile_to_samples",
    "to_tuple",
    "transform_with",
    "unbatched",
    "unlisted",
    "warn_and_continue",
    "warn_and_stop",
    "xdecode",
]
