"""Rows of in-memory or memory-mapped arrays, gathered by native threads."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.common.errors import EngineReadError
from chute.datasets.indexed import IndexedDataset

ArrayLike = np.ndarray | torch.Tensor | str | os.PathLike[str]


class ArrayDataset(IndexedDataset):
    """Map-style rows of arrays that share their first dimension.

    `ArrayDataset(emb=table, ids=torch.arange(n), scores="scores.npy")`.
    Each value is a numpy array, a CPU torch tensor, or the path of a `.npy`
    file (opened with `np.load(mmap_mode="r")`, so rows are paged in on
    demand and the file is never loaded whole).

    A `.npy` path is mapped by chute rather than numpy: if the file is cut
    while mapped, the rows past its new end fail with ``chute.ReadError``
    naming it (the process does not die of SIGBUS, nor are zeros delivered).

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
        self._mapped: dict[str, _MappedNpy] = {}
        for name, value in arrays.items():
            if isinstance(value, str | os.PathLike):
                self._paths[name] = str(Path(value))
                self._arrays[name], mapped = _load_npy(self._paths[name])
                if mapped is not None:
                    self._mapped[name] = mapped
            else:
                self._arrays[name] = _as_rows(name, value)
        lengths = {name: int(a.shape[0]) for name, a in self._arrays.items()}
        if len(set(lengths.values())) > 1:
            listing = ", ".join(f"{k}={v}" for k, v in lengths.items())
            raise ValueError(f"ArrayDataset arrays must have the same length: {listing}")
        self._len = next(iter(lengths.values()))
        self._init_indexed(None)

    def reads_remote(self) -> bool:
        return False

    def __len__(self) -> int:
        return self._len

    def field_names(self) -> list[str]:
        return list(self._arrays)

    def _native_field_names(self) -> list[str]:
        return list(self._arrays)

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        return [_core.ArraySource(name, a) for name, a in self._arrays.items()], {}

    def _check_rows(self, idx: np.ndarray) -> None:
        for mapped in self._mapped.values():
            mapped.check_rows(idx)

    def __getstate__(self) -> dict[str, Any]:
        # Memory-mapped files are reopened by path in the receiving process
        # rather than pickled as a full copy.
        state = super().__getstate__()
        state["_arrays"] = {k: v for k, v in self._arrays.items() if k not in self._paths}
        state["_order"] = list(self._arrays)
        state["_mapped"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        order = state.pop("_order")
        arrays = state.pop("_arrays")
        super().__setstate__(state)
        self._arrays = {}
        for k in order:
            if k in arrays:
                self._arrays[k] = arrays[k]
                continue
            self._arrays[k], mapped = _load_npy(self._paths[k])
            if mapped is not None:
                self._mapped[k] = mapped

    def state_identity(self) -> dict[str, Any]:
        """What a loader state over this dataset is bound to (see
        ``chute.DataLoader.load_state_dict``): the rows, each field's dtype
        and row shape, and for a ``.npy`` path the file (path and size). The
        values of arrays in memory are not hashed: that would read them all."""
        fields: dict[str, Any] = {}
        for name, a in self._arrays.items():
            field: dict[str, Any] = {"dtype": a.dtype.str, "row_shape": list(a.shape[1:])}
            path = self._paths.get(name)
            if path is not None:
                field["path"] = os.path.abspath(path)
                field["size"] = os.path.getsize(path)
            fields[name] = field
        return {"type": "ArrayDataset", "rows": self._len, "fields": fields}

    def __repr__(self) -> str:
        shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in self._arrays.items()}
        return f"ArrayDataset({shapes})"


class _MappedNpy:
    """A .npy file mapped by chute (see ``chute._core._map_file``): where its
    rows lie, to tell whether the rows of a batch were still in the file."""

    def __init__(self, path: str, mapped: Any, offset: int, row_bytes: int) -> None:
        self.path = path
        self.mapped = mapped
        self.offset = offset
        self.row_bytes = row_bytes

    def check_rows(self, idx: np.ndarray) -> None:
        if idx.size == 0 or not self.mapped.check_size():
            return
        valid = int(self.mapped.valid_size)
        last = int(idx.max())
        if self.offset + (last + 1) * self.row_bytes > valid:
            first_lost = max(0, (valid - self.offset) // max(1, self.row_bytes))
            raise EngineReadError(
                f"'{self.path}' was cut while mapped: it now ends at byte {valid}, so rows "
                f"{first_lost} and on are gone (this batch asked for row {last})"
            )


def _load_npy(path: str) -> tuple[np.ndarray, _MappedNpy | None]:
    if not os.path.isfile(path):
        raise FileNotFoundError(2, "npy file not found", path)
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            # No public reader of later headers: numpy maps those itself.
            return _as_rows(path, np.load(path, mmap_mode="r")), None
        offset = f.tell()
    count = math.prod(shape)
    size = os.path.getsize(path)
    if offset + count * dtype.itemsize > size:
        raise ValueError(
            f"{path}: truncated .npy: its header declares {count * dtype.itemsize} bytes of "
            f"data after byte {offset}, the file has {size - offset}"
        )
    if dtype.hasobject:
        raise ValueError(f"ArrayDataset: {path!r} has unsupported dtype {dtype}")
    # (typed Any: it exports the buffer protocol, which the stub cannot say)
    mapped: Any = _core._map_file(path) if count else None
    if mapped is None:  # empty, or too many files mapped at once
        return _as_rows(path, np.load(path, mmap_mode="r")), None
    array = np.frombuffer(memoryview(mapped), dtype=dtype, count=count, offset=offset).reshape(
        shape, order="F" if fortran else "C"
    )
    rows = _as_rows(path, array)
    if rows.base is None or not np.shares_memory(rows, array):
        return rows, None  # copied at load (not C-contiguous or byte-swapped)
    row_bytes = int(rows.strides[0]) if rows.ndim else rows.itemsize
    return rows, _MappedNpy(path, mapped, offset, row_bytes)


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
