"""chute: a compiled data loader for PyTorch."""

from chute._core import DataError, ReadError
from chute.common.limits import get_max_image_pixels, set_max_image_pixels
from chute.common.warning_types import (
    ChuteIndexWarning,
    ChuteSlowPathWarning,
    ForeignLoaderWarning,
    IndexNotSavedWarning,
    SameDataOnEveryRankWarning,
    SkippedSampleWarning,
    SlowPathWarning,
    WorkerFallbackWarning,
    WorkerInitFnWarning,
)
from chute.datasets.arrays import ArrayDataset
from chute.datasets.arrow import ArrowDataset
from chute.datasets.curriculum import Curriculum
from chute.datasets.h5 import H5Dataset
from chute.datasets.indexed import IndexedDataset
from chute.datasets.mds import MDSDataset
from chute.datasets.mix import MixedDataset, mix
from chute.datasets.mix_stream import MixedStream
from chute.datasets.parquet import ParquetDataset
from chute.datasets.splits import create_loader
from chute.datasets.tardataset import TarDataset
from chute.datasets.tokens import TokenDataset, cu_seqlens
from chute.loader.dataloader import DataLoader, set_epoch
from chute.loader.validate import ValidationError, validate_batch, validate_first_batch
from chute.sources.tarindex import TarIndexError
from chute.table_streams import ParquetStream
from chute.tokenize import tokenize_shards
from chute.wds import WebDataset, WebLoader

__all__ = [
    "ArrowDataset",
    "ArrayDataset",
    "ChuteIndexWarning",
    "ChuteSlowPathWarning",
    "Curriculum",
    "DataError",
    "DataLoader",
    "ForeignLoaderWarning",
    "H5Dataset",
    "IndexNotSavedWarning",
    "IndexedDataset",
    "MDSDataset",
    "MixedDataset",
    "MixedStream",
    "ParquetDataset",
    "ParquetStream",
    "ReadError",
    "SameDataOnEveryRankWarning",
    "SkippedSampleWarning",
    "SlowPathWarning",
    "TarDataset",
    "TarIndexError",
    "TokenDataset",
    "ValidationError",
    "WebDataset",
    "WebLoader",
    "WorkerFallbackWarning",
    "WorkerInitFnWarning",
    "create_loader",
    "cu_seqlens",
    "get_max_image_pixels",
    "mix",
    "set_epoch",
    "set_max_image_pixels",
    "tokenize_shards",
    "validate_batch",
    "validate_first_batch",
]
__version__ = "0.1.0"
