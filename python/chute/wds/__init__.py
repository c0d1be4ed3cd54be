"""webdataset's pipeline over tar shards, run by chute: the names a
webdataset user types (``import chute.wds as wds``).

The stages, their compiler and webdataset's ``filters`` and ``autodecode``
are in ``chute.stream`` (which ``TarDataset`` and ``ParquetDataset`` share);
this package re-exports them. Its own modules, each importing only modules
listed before it (tests/test_import_floors.py): ``tarread`` reads shards in
Python (for ``select_files=``/``rename_files=``); ``even`` equalises batch
counts across DDP ranks; ``runnable`` is what an epoch's run needs of its
dataset; ``elastic_stream`` deals an epoch's samples to the ranks;
``resume`` is the state dict; ``run`` and ``parallel`` iterate one epoch
(Python stages in this process, or on worker processes); and ``dataset``,
``shardlists``, ``pipeline`` and ``webloader`` hold ``WebDataset``, the
shard sources, ``DataPipeline`` and ``WebLoader``.

``ParquetStream`` is not a webdataset name: it lives in
``chute.table_streams`` (``chute.ParquetStream``); ``chute.wds.ParquetStream``
stays as an alias for code written when it lived here.
"""

from typing import TYPE_CHECKING

from chute.common import handlers
from chute.common.errors import DecodingError
from chute.common.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from chute.stream import autodecode, filters
from chute.stream.autodecode import (
    Continue,
    Decoder,
    ImageHandler,
    gzfilter,
    handle_extension,
    imagehandler,
)
from chute.stream.filters import (
    Cached,
    LMDBCached,
    associate,
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
from chute.wds import shardlists
from chute.wds.dataset import WebDataset
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
from chute.wds.webloader import WebLoader

# The alias's value is set by chute.table_streams when chute is imported
# (which importing chute.wds does first); this import is the type checker's.
if TYPE_CHECKING:
    from chute.table_streams.parquet import ParquetStream


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
    "ParquetStream",
    "ResampledShards",
    "SimpleShardList",
    "WebDataset",
    "WebLoader",
    "associate",
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
