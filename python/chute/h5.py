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
from chute.indexed import IndexedDataset, _ProcessState

# 256 MiB holds the decompressed chunks of a typical working set (e.g. 200k
# rows of 64 float32 is 51 MB) so a shuffled epoch inflates each chunk once;
# it is an upper bound, not an allocation, and is shared by all fields.
DEFAULT_CHUNK_CACHE_BYTES = 256 << 20

_NATIVE_FILTERS = {
    h5py.h5z.FILTER_DEFLATE: "deflate",
    h5py.h5z.FILTER_SHUFFLE: "shuffle",
    h5py.h5z.FILTER_FLETCHER32: "fletcher32",
}
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
                    layout, reason = _describe_dataset(obj, path, st)
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

    def _field_names(self) -> list[str]:
        return list(self._fields)

    def _native_field_names(self) -> list[str]:
        return [n for n in self._fields if n not in self._slow]

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        context = _core.H5Context(self._chunk_cache_bytes, self._max_open_files, self._mmap)
        sources = [
            _core.H5Source(context, name, [_native_layout(d) for d in self._layouts[name]])
            for name in self._native_field_names()
        ]
        return sources, {"context": context, "h5files": {}}

    def _native_stats(self, state: _ProcessState) -> dict[str, int]:
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


def _describe_dataset(
    d: h5py.Dataset, path: str, st: os.stat_result
) -> tuple[dict[str, Any], str | None]:
    """The engine's layout for `d`, and why it must take the slow path (or None)."""
    dtype = d.dtype
    layout: dict[str, Any] = {
        "path": path,
        "dataset": d.name,
        "dtype": dtype.str,
        "row_shape": [int(x) for x in d.shape[1:]],
        "num_rows": int(d.shape[0]),
        "fill": np.array(d.fillvalue, dtype=dtype).tobytes(),
        "file_size": int(st.st_size),
        "mtime_ns": int(st.st_mtime_ns),
        "inode": int(st.st_ino),
    }
    if dtype.kind == "c":
        return layout, f"complex dtype {dtype} in {d.name!r}"
    dcpl = d.id.get_create_plist()
    kind = dcpl.get_layout()
    if d.is_virtual or kind == h5py.h5d.VIRTUAL:
        return layout, f"{d.name!r} is a virtual dataset"
    if dcpl.get_external_count() > 0:
        return layout, f"{d.name!r} uses external storage"
    if kind == h5py.h5d.COMPACT:
        return layout, f"{d.name!r} uses compact storage"
    if kind == h5py.h5d.CONTIGUOUS:
        offset = d.id.get_offset()
        if offset is None:
            layout["kind"] = "unallocated"
        else:
            layout["kind"] = "contiguous"
            layout["offset"] = int(offset)
        return layout, None
    if kind != h5py.h5d.CHUNKED:
        return layout, f"{d.name!r} has an unknown storage layout {kind}"
    filters = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, _values, fname = dcpl.get_filter(i)
        if code not in _NATIVE_FILTERS:
            label = fname.decode(errors="replace") if isinstance(fname, bytes) else str(fname)
            return layout, f"{d.name!r} uses the {label or code} filter"
        filters.append(_NATIVE_FILTERS[code])
    if dtype.itemsize > 1 and "shuffle" in filters and dtype.kind == "b":
        return layout, f"{d.name!r} shuffles a boolean dtype"
    offsets, addresses, sizes, masks = _chunk_table(d)
    grid = 1
    for extent, chunk in zip(d.shape, d.chunks, strict=True):
        grid *= max(1, -(-int(extent) // int(chunk)))
    if grid > (1 << 26):
        return layout, f"{d.name!r} has too many chunks ({grid})"
    layout.update(
        kind="chunked",
        chunk_shape=[int(c) for c in d.chunks],
        filters=filters,
        chunk_offsets=offsets,
        chunk_addresses=addresses,
        chunk_sizes=sizes,
        chunk_masks=masks,
    )
    return layout, None


_NATIVE_KINDS = {
    "contiguous": _core.H5LayoutKind.CONTIGUOUS,
    "chunked": _core.H5LayoutKind.CHUNKED,
    "unallocated": _core.H5LayoutKind.UNALLOCATED,
}
_NATIVE_FILTER_CODES = {
    "deflate": _core.H5Filter.DEFLATE,
    "shuffle": _core.H5Filter.SHUFFLE,
    "fletcher32": _core.H5Filter.FLETCHER32,
}


def _native_layout(d: dict[str, Any]) -> _core.H5Layout:
    """The engine's typed layout for a description from `_describe_dataset`
    (kept as a plain dict so that the dataset pickles)."""
    layout = _core.H5Layout()
    layout.path = d["path"]
    layout.dataset = d["dataset"]
    layout.dtype = d["dtype"]
    layout.row_shape = d["row_shape"]
    layout.num_rows = d["num_rows"]
    layout.fill = d["fill"]
    layout.file_size = d["file_size"]
    layout.mtime_ns = d["mtime_ns"]
    layout.inode = d["inode"]
    layout.kind = _NATIVE_KINDS[d["kind"]]
    if d["kind"] == "contiguous":
        layout.offset = d["offset"]
    elif d["kind"] == "chunked":
        layout.chunk_shape = d["chunk_shape"]
        layout.filters = [_NATIVE_FILTER_CODES[f] for f in d["filters"]]
        layout.set_chunks(
            d["chunk_offsets"], d["chunk_addresses"], d["chunk_sizes"], d["chunk_masks"]
        )
    return layout


def _chunk_table(d: h5py.Dataset) -> tuple[np.ndarray, ...]:
    n = d.id.get_num_chunks()
    rank = d.ndim
    offsets = np.zeros((n, rank), dtype=np.int64)
    addresses = np.zeros(n, dtype=np.uint64)
    sizes = np.zeros(n, dtype=np.uint64)
    masks = np.zeros(n, dtype=np.uint32)
    position = 0

    def record(info: Any) -> None:
        nonlocal position
        offsets[position] = info.chunk_offset
        addresses[position] = info.byte_offset
        sizes[position] = info.size
        masks[position] = info.filter_mask
        position += 1

    if hasattr(d.id, "chunk_iter"):
        # One walk of the chunk index; get_chunk_info(i) re-walks it per call,
        # which is quadratic on files with many chunks.
        d.id.chunk_iter(record)
    else:
        for i in range(n):
            record(d.id.get_chunk_info(i))
    if position != n:
        raise ValueError(f"{d.file.filename}: dataset {d.name!r}: chunk index changed while read")
    return offsets, addresses, sizes, masks
