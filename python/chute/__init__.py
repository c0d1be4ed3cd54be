"""chute: a compiled data loader for PyTorch."""

from chute._core import DataError, ReadError
from chute.dataloader import DataLoader
from chute.handlers import SkippedSampleWarning
from chute.webdataset import WebDataset, WebLoader

__all__ = [
    "DataError",
    "DataLoader",
    "ReadError",
    "SkippedSampleWarning",
    "WebDataset",
    "WebLoader",
]
__version__ = "0.1.0"
