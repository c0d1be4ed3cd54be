"""chute: a compiled data loader for PyTorch."""

from chute._core import DataError, ReadError
from chute.common.handlers import SkippedSampleWarning
from chute.common.limits import get_max_image_pixels, set_max_image_pixels
from chute.datasets.arrays import ArrayDataset
from chute.datasets.curriculum import Curriculum
from chute.datasets.h5 import ChuteSlowPathWarning, H5Dataset
from chute.datasets.indexed import IndexedDataset
from chute.datasets.mix import MixedDataset, mix
from chute.datasets.mix_stream import MixedStream
from chute.datasets.parquet import ParquetDataset
from chute.datasets.splits import create_loader
from chute.datasets.tardataset import TarDataset
from chute.datasets.text_tokens import tokenize_shards
from chute.datasets.tokens import TokenDataset, cu_seqlens
from chute.loader.dataloader import DataLoader, WorkerInitFnWarning, set_epoch
from chute.loader.validate import ValidationError, validate_batch, validate_first_batch
from chute.sources.tarindex import ChuteIndexWarning, TarIndexError
from chute.wds import ParquetStream, WebDataset, WebLoader
from chute.workers.pool import WorkerFallbackWarning

__all__ = [
    "ArrayDataset",
    "ChuteIndexWarning",
    "ChuteSlowPathWarning",
    "Curriculum",
    "DataError",
    "DataLoader",
    "H5Dataset",
    "IndexedDataset",
    "MixedDataset",
    "MixedStream",
    "ParquetDataset",
    "ParquetStream",
    "ReadError",
    "SkippedSampleWarning",
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
