"""chute: a compiled data loader for PyTorch."""

from chute._core import DataError, ReadError

__all__ = ["DataError", "ReadError"]
__version__ = "0.1.0"
