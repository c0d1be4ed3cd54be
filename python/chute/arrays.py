"""Rows of in-memory or memory-mapped arrays, gathered by native threads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.indexed import IndexedDataset

ArrayLike = np.ndarray | torch.Tensor | str | os.PathLike[str]


class ArrayDataset(IndexedDataset):
    """Map-style rows of arrays that share their first dimension.

    `ArrayDataset(emb=table, ids=torch.arange(n), scores="scores.npy")`.
    Each value is a numpy array, a CPU torch tensor, or the path of a `.npy`
    file (opened with `np.load(mmap_mode="r")`, so rows are paged in on
    demand and the file is never loaded whole).

    Memory: the dataset reads the caller's memory directly and keeps it alive.
    A copy is made once, at construction, only when the engine cannot read
    the rows in place: a tensor that is not contiguous (`.contiguous()`), a
    numpy array whose rows are not C-contiguous or not in native byte order.
    Writes to the original array after construction are visible to later
    batches, as with torch's TensorDataset.
    """

    def __init__(self, **arrays: ArrayLike) -> None:
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        self._paths: dict[str, str] = {}
        self._arrays: dict[str, np.ndarray] = {}
        for name, value in arrays.items():
            if isinstance(value, str | os.PathLike):
                self._paths[name] = str(Path(value))
                self._arrays[name] = _load_npy(self._paths[name])
            else:
                self._arrays[name] = _as_rows(name, value)
        lengths = {name: int(a.shape[0]) for name, a in self._arrays.items()}
        if len(set(lengths.values())) > 1:
            listing = ", ".join(f"{k}={v}" for k, v in lengths.items())
            raise ValueError(f"ArrayDataset arrays must have the same length: {listing}")
        self._len = next(iter(lengths.values()))
        self._init_indexed(None)

    def __len__(self) -> int:
        return self._len

    def field_names(self) -> list[str]:
        return list(self._arrays)

    def _native_field_names(self) -> list[str]:
        return list(self._arrays)

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        return [_core.ArraySource(name, a) for name, a in self._arrays.items()], {}

    def __getstate__(self) -> dict[str, Any]:
        # Memory-mapped files are reopened by path in the receiving process
        # rather than pickled as a full copy.
        state = super().__getstate__()
        state["_arrays"] = {k: v for k, v in self._arrays.items() if k not in self._paths}
        state["_order"] = list(self._arrays)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        order = state.pop("_order")
        arrays = state.pop("_arrays")
        super().__setstate__(state)
        self._arrays = {k: arrays[k] if k in arrays else _load_npy(self._paths[k]) for k in order}

    def __repr__(self) -> str:
        shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in self._arrays.items()}
        return f"ArrayDataset({shapes})"


def _load_npy(path: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise FileNotFoundError(2, "npy file not found", path)
    a = np.load(path, mmap_mode="r")
    return _as_rows(path, a)


def _as_rows(name: str, given: Any) -> np.ndarray:
    # `given` is Any (arrays, tensors, memmaps); `value` is what we return.
    value: np.ndarray
    if isinstance(given, torch.Tensor):
        if given.device.type != "cpu":
            raise ValueError(f"ArrayDataset: tensor {name!r} is on {given.device}, not the CPU")
        value = given.detach().contiguous().numpy()
    elif isinstance(given, np.ndarray):
        value = given
    else:
        raise TypeError(f"ArrayDataset: {name!r} must be a numpy array, tensor or .npy path")
    if value.ndim == 0:
        raise ValueError(f"ArrayDataset: {name!r} is a scalar, not rows")
    if not _torch_has(value.dtype):
        raise ValueError(
            f"ArrayDataset: {name!r} has dtype {value.dtype}, which torch has no tensor type for"
            " (numbers, bool and complex only)"
        )
    if not value.dtype.isnative:
        value = value.astype(value.dtype.newbyteorder("="))
    if value.ndim > 1 and not value[:1].flags.c_contiguous:
        value = np.ascontiguousarray(value)
    return value


def _torch_has(dtype: np.dtype[Any]) -> bool:
    """Whether torch.from_numpy takes arrays of `dtype` (any byte order)."""
    if dtype.fields is not None or dtype.kind not in "biufc":
        return False
    try:
        torch.from_numpy(np.zeros(0, dtype=dtype.newbyteorder("=")))
    except TypeError:
        return False
    return True
