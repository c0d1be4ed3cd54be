"""The engine's description of an HDF5 dataset: where its bytes are and how
they are filtered, read once through h5py when a dataset is opened (and by
``chute inspect``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from chute import _core

_NATIVE_FILTERS = {
    h5py.h5z.FILTER_DEFLATE: "deflate",
    h5py.h5z.FILTER_SHUFFLE: "shuffle",
    h5py.h5z.FILTER_FLETCHER32: "fletcher32",
}


@dataclass(frozen=True)
class RemoteStat:
    """What identifies a remote object's content, in ``os.stat_result``'s
    names: its size, and its version (ETag, else modification time)."""

    st_size: int
    version: str
    st_mtime_ns: int = 0
    st_ino: int = 0


def describe_dataset(
    d: h5py.Dataset, path: str, st: os.stat_result | RemoteStat
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
        "version": st.version if isinstance(st, RemoteStat) else "",
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


def native_layout(d: dict[str, Any]) -> _core.H5Layout:
    """The engine's typed layout for a description from `describe_dataset`
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
    layout.version = d.get("version", "")
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
