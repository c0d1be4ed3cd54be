"""Rows of HDF5 datasets across one or many files, read by native threads.

At open, h5py describes every dataset once: where its bytes are (a file
offset for contiguous storage; for chunked storage each chunk's coordinates,
byte offset, stored size and filter mask) and how they are filtered. From
then on the engine reads with `pread`, inflates deflate chunks, undoes the
shuffle filter and checks fletcher32 on its own threads; h5py is not called
again.

Slow path: storage the engine does not read natively — lzf, szip,
scale-offset, n-bit or any other filter, compact, virtual or external
storage, complex numbers — is read through h5py instead, in the consuming
thread, once per batch (sorted unique indices, then reordered). It is
correct but serial; a `ChuteSlowPathWarning` names each such dataset once at
open.
"""

from __future__ import annotations

import errno
import glob
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from chute import _core
from chute.h5layout import describe_dataset, native_layout
from chute.indexed import IndexedDataset, ProcessState

# 256 MiB holds the decompressed chunks of a typical working set (e.g. 200k
# rows of 64 float32 is 51 MB) so a shuffled epoch inflates each chunk once;
# it is an upper bound, not an allocation, and is shared by all fields.
DEFAULT_CHUNK_CACHE_BYTES = 256 << 20

_GLOB_CHARS = set("*?[")


class ChuteSlowPathWarning(UserWarning):
    """A dataset is read through the Python slow path (see the module doc)."""


PathLike = str | os.PathLike[str]


class H5Dataset(IndexedDataset):
    """Map-style rows of HDF5 datasets, concatenated over files in file order.

    Args:
        files: a path, a glob pattern, or a list of paths. A pattern expands
            to its matches in sorted order.
        fields: output name → dataset path inside each file
            (`{"voxels": "betas"}`), or a list of dataset paths used as names.
        chunk_cache_bytes: bound of the decompressed-chunk cache shared by
            all fields and threads (default 256 MiB; 0 disables it).
        max_open_files: bound of the descriptors kept open; files beyond it
            are reopened on demand (and checked to be the same file).
        num_threads: engine threads behind `__getitem__`/`__getitems__`
            (default: the CPUs this process may use; 1 inside a torch worker).
        mmap: read contiguous (unchunked) datasets through a read-only
            memory mapping: rows are copied straight out of the page cache,
            without a syscall or a cache lookup per row. The pages touched
            count in the process's RSS as shared file pages (page cache the
            kernel can reclaim, not memory chute holds). False reads them with
            pread, through the chunk cache for rows up to 4 KiB.

    A row is `{name: tensor}`; all fields of one file must have the same
    number of rows. Files must not change while the dataset is open: a file
    truncated or modified afterwards raises `chute.ReadError` naming it.
    """

    def __init__(
        self,
        files: PathLike | Sequence[PathLike],
        fields: Mapping[str, str] | Sequence[str],
        *,
        chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        max_open_files: int = 64,
        num_threads: int | None = None,
        mmap: bool = True,
    ) -> None:
        self._paths = _expand_files(files)
        self._mmap = bool(mmap)
        if isinstance(fields, Mapping):
            self._fields = {str(k): str(v) for k, v in fields.items()}
        else:
            self._fields = {str(v): str(v) for v in fields}
        if not self._fields:
            raise ValueError("H5Dataset needs at least one field")
        self._chunk_cache_bytes = int(chunk_cache_bytes)
        self._max_open_files = int(max_open_files)
        self._describe()
        self._init_indexed(num_threads)

    # -- description at open --------------------------------------------------------

    def _describe(self) -> None:
        names = list(self._fields)
        layouts: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        slow_reason: dict[str, str] = {}
        first: dict[str, tuple[str, np.dtype[Any], tuple[int, ...]]] = {}
        rows_per_file: list[int] = []
        for path in self._paths:
            st = os.stat(path)
            with h5py.File(path, "r") as f:
                file_rows: tuple[str, int] | None = None
                for name in names:
                    ds_path = self._fields[name]
                    obj = f.get(ds_path)
                    if not isinstance(obj, h5py.Dataset):
                        raise KeyError(f"{path}: dataset {ds_path!r} not found")
                    if obj.ndim == 0:
                        raise ValueError(f"{path}: dataset {ds_path!r} is a scalar, not rows")
                    dtype = obj.dtype
                    if dtype.kind not in "biufc" or dtype.fields is not None:
                        raise ValueError(
                            f"{path}: dataset {ds_path!r} has non-numeric dtype {dtype}"
                        )
                    row_shape = tuple(int(d) for d in obj.shape[1:])
                    if name in first:
                        p0, dt0, rs0 = first[name]
                        if dt0 != dtype.newbyteorder("=") or rs0 != row_shape:
                            raise ValueError(
                                f"dataset {ds_path!r}: {p0} has rows {rs0} of {dt0} but {path}"
                                f" has rows {row_shape} of {dtype.newbyteorder('=')}"
                            )
                    else:
                        first[name] = (path, dtype.newbyteorder("="), row_shape)
                    n = int(obj.shape[0])
                    if file_rows is None:
                        file_rows = (ds_path, n)
                    elif file_rows[1] != n:
                        raise ValueError(
                            f"{path}: dataset {ds_path!r} has {n} rows but {file_rows[0]!r}"
                            f" has {file_rows[1]}"
                        )
                    layout, reason = describe_dataset(obj, path, st)
                    if reason is not None and name not in slow_reason:
                        slow_reason[name] = f"{path}: {reason}"
                    layouts[name].append(layout)
                assert file_rows is not None
                rows_per_file.append(file_rows[1])
        for name, reason in slow_reason.items():
            warnings.warn(
                f"chute reads HDF5 dataset {self._fields[name]!r} (field {name!r}) through"
                f" h5py, one batch at a time in the consuming thread: {reason}",
                ChuteSlowPathWarning,
                stacklevel=3,
            )
        self._layouts = {n: v for n, v in layouts.items() if n not in slow_reason}
        self._slow = set(slow_reason)
        self._dtypes = {n: first[n][1] for n in names}
        self._starts = np.concatenate([[0], np.cumsum(rows_per_file)]).astype(np.int64)

    # -- IndexedDataset hooks ----------------------------------------------------------

    def __len__(self) -> int:
        return int(self._starts[-1])

    def field_names(self) -> list[str]:
        return list(self._fields)

    def _native_field_names(self) -> list[str]:
        return [n for n in self._fields if n not in self._slow]

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        context = _core.H5Context(self._chunk_cache_bytes, self._max_open_files, self._mmap)
        sources = [
            _core.H5Source(context, name, [native_layout(d) for d in self._layouts[name]])
            for name in self._native_field_names()
        ]
        return sources, {"context": context, "h5files": {}}

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        return dict(state.extra["context"].stats())

    def _read_slow(self, name: str, indices: np.ndarray) -> np.ndarray:
        n = len(self)
        bad = (indices < 0) | (indices >= n)
        if bad.any():
            raise ValueError(
                f"index {int(indices[bad][0])} is out of range for a dataset of length {n}"
            )
        h5files: dict[str, h5py.File] = self._state().extra["h5files"]
        unique, inverse = np.unique(indices, return_inverse=True)
        file_of = np.searchsorted(self._starts, unique, side="right") - 1
        parts = []
        for fi in np.unique(file_of):
            path = self._paths[int(fi)]
            f = h5files.get(path)
            if f is None:
                f = h5files[path] = h5py.File(path, "r")
            local = unique[file_of == fi] - self._starts[fi]
            parts.append(f[self._fields[name]][local])
        data = np.concatenate(parts) if parts else np.empty((0,), self._dtypes[name])
        return np.ascontiguousarray(data[inverse.reshape(-1)], dtype=self._dtypes[name])

    def __repr__(self) -> str:
        return (
            f"H5Dataset({len(self._paths)} files, {len(self)} rows, fields={self._fields},"
            f" slow={sorted(self._slow)})"
        )


def _expand_files(files: PathLike | Sequence[PathLike]) -> list[str]:
    items = [files] if isinstance(files, str | os.PathLike) else list(files)
    paths: list[str] = []
    for item in items:
        text = os.fspath(item)
        if _GLOB_CHARS & set(text) and not os.path.exists(text):
            matches = sorted(glob.glob(text))
            if not matches:
                raise FileNotFoundError(errno.ENOENT, "no HDF5 file matches the pattern", text)
            paths.extend(matches)
        else:
            if not os.path.isfile(text):
                raise FileNotFoundError(errno.ENOENT, "HDF5 file not found", text)
            paths.append(text)
    if not paths:
        raise ValueError("H5Dataset needs at least one file")
    return [str(Path(p).resolve()) for p in paths]
