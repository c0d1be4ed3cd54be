"""chute: a compiled data loader for PyTorch."""

from chute._core import DataError, ReadError
from chute.arrays import ArrayDataset
from chute.dataloader import DataLoader
from chute.h5 import ChuteSlowPathWarning, H5Dataset
from chute.handlers import SkippedSampleWarning
from chute.indexed import IndexedDataset
from chute.webdataset import WebDataset, WebLoader

__all__ = [
    "ArrayDataset",
    "ChuteSlowPathWarning",
    "DataError",
    "DataLoader",
    "H5Dataset",
    "IndexedDataset",
    "ReadError",
    "SkippedSampleWarning",
    "WebDataset",
    "WebLoader",
]
__version__ = "0.1.0"
