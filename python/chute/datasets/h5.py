"""Rows of HDF5 datasets across one or many files, read by native threads.

At open, h5py describes every dataset once: where its bytes are (a file
offset for contiguous storage; for chunked storage each chunk's coordinates,
byte offset, stored size and filter mask) and how they are filtered. From
then on the engine reads with `pread`, inflates deflate chunks, undoes the
shuffle filter and checks fletcher32 on its own threads; h5py is not called
again.

Remote files (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://``
urls, and globs on buckets; ``pip install 'chute[remote]'``) are described
the same way, h5py reading the metadata through a file object that fetches
ranges of the object. Without a ``cache_dir`` the engine then reads exactly
the extents and chunks each batch needs with ranged requests (all of a
batch's at once, neighbours merged; chunks in the chunk cache are not
fetched again). With a ``cache_dir`` each file is downloaded once into that
node-shared cache and read as a local file (mapped, at local speed).
Ranged reads are the default because they need no disk and start at once,
and a batch costs only its bytes; a cache pays off when epochs repeat over
files that fit on local disk.

Slow path: storage the engine does not read natively — lzf, szip,
scale-offset, n-bit or any other filter, compact, virtual or external
storage, complex numbers — is read through h5py instead, in the consuming
thread, once per batch (sorted unique indices, then reordered). It is
correct but serial; a `SlowPathWarning` names each such dataset once at
open.
"""

from __future__ import annotations

import errno
import hashlib
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from chute import _core
from chute.common.warning_types import SlowPathWarning
from chute.datasets.indexed import IndexedDataset, ProcessState
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.h5layout import RemoteStat, describe_dataset, native_layout
from chute.sources.remote_urls import (
    cached_copy,
    dataset_remote_options,
    expand_file_patterns,
)

# 256 MiB holds the decompressed chunks of a typical working set (e.g. 200k
# rows of 64 float32 is 51 MB) so a shuffled epoch inflates each chunk once;
# it is an upper bound, not an allocation, and is shared by all fields.
DEFAULT_CHUNK_CACHE_BYTES = 256 << 20


PathLike = str | os.PathLike[str]


class H5Dataset(IndexedDataset):
    """Map-style rows of HDF5 datasets, concatenated over files in file order.

    Args:
        files: a path, a brace pattern (``"part-{0..3}.h5"``, as for tar
            shards), a glob (its matches in sorted order), or a list of these.
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
        storage_options, cache_dir, cache_limit_bytes, remote: how remote
            files are reached, as for ``WebDataset`` (see the module doc for
            what a ``cache_dir`` changes).

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
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        self._remote = dataset_remote_options(remote, storage_options, cache_dir, cache_limit_bytes)
        self._paths = _expand_files(files, self._remote)
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
        # Per field, per file: the file that holds its rows and their
        # dataset's name there (another file's, behind an external link).
        sources: dict[str, list[tuple[str, str]]] = {n: [] for n in names}
        slow_reason: dict[str, str] = {}
        first: dict[str, tuple[str, np.dtype[Any], tuple[int, ...]]] = {}
        rows_per_file: list[int] = []
        files: list[dict[str, Any]] = []  # each file's identity (see state_identity)
        for path in self._paths:
            st: os.stat_result | RemoteStat
            if is_remote_url(path):
                fileobj = get_session(self._remote).file(path)
                st = RemoteStat(fileobj.size, fileobj.version)
                opened = h5py.File(fileobj, "r")
            else:
                st = os.stat(path)
                opened = h5py.File(path, "r")
            with opened as f:
                file_rows: tuple[str, int] | None = None
                for name in names:
                    ds_path = self._fields[name]
                    obj = _find_dataset(f, path, ds_path)
                    # An external link leads into another file: its bytes
                    # are there, and so is its identity.
                    where, where_st = path, st
                    if obj.file != f:
                        if is_remote_url(path):
                            raise _remote_external_link(path, ds_path, obj.file.filename)
                        where = os.path.abspath(obj.file.filename)
                        where_st = os.stat(where)
                    sources[name].append((where, str(obj.name)))
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
                    layout, reason = describe_dataset(obj, where, where_st)
                    if reason is not None and name not in slow_reason:
                        slow_reason[name] = f"{path}: {reason}"
                    layouts[name].append(layout)
                assert file_rows is not None
                rows_per_file.append(file_rows[1])
                files.append(
                    {
                        "path": path,
                        "size": int(st.st_size),
                        "version": st.version if isinstance(st, RemoteStat) else "",
                        "rows": file_rows[1],
                    }
                )
        for name, reason in slow_reason.items():
            warnings.warn(
                f"chute reads HDF5 dataset {self._fields[name]!r} (field {name!r}) through"
                f" h5py, one batch at a time in the consuming thread: {reason}",
                SlowPathWarning,
                stacklevel=3,
            )
        self._layouts = {n: v for n, v in layouts.items() if n not in slow_reason}
        self._slow = set(slow_reason)
        self._slow_sources = {n: sources[n] for n in self._slow}
        self._dtypes = {n: first[n][1] for n in names}
        self._starts = np.concatenate([[0], np.cumsum(rows_per_file)]).astype(np.int64)
        self._identity = _identity(files, self._fields, layouts)

    # -- IndexedDataset hooks ----------------------------------------------------------

    def reads_remote(self) -> bool:
        return any(is_remote_url(p) for p in self._paths)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def field_names(self) -> list[str]:
        return list(self._fields)

    def _native_field_names(self) -> list[str]:
        return [n for n in self._fields if n not in self._slow]

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        context = _core.H5Context(self._chunk_cache_bytes, self._max_open_files, self._mmap)
        local: dict[str, dict[str, Any]] = {}  # remote url -> its cached copy's identity
        held: list[Any] = []
        if any(is_remote_url(p) for p in self._paths):
            session = get_session(self._remote)
            context.set_remote(session.queue)
            if self._remote.cache_dir:
                for url in (p for p in self._paths if is_remote_url(p)):
                    copy = cached_copy(session, url, self._remote.cache_dir, held)
                    if copy is not None:
                        local[url] = copy
        sources = [
            _core.H5Source(
                context,
                name,
                [native_layout({**d, **local.get(d["path"], {})}) for d in self._layouts[name]],
            )
            for name in self._native_field_names()
        ]
        # `held` keeps the cached copies open (and so out of eviction's reach).
        return sources, {"context": context, "h5files": {}, "held": held, "local": local}

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
            path, dataset = self._slow_sources[name][int(fi)]
            f = h5files.get(path)
            if f is None:
                f = h5files[path] = self._open_h5(path)
            local = unique[file_of == fi] - self._starts[fi]
            parts.append(f[dataset][local])
        data = np.concatenate(parts) if parts else np.empty((0,), self._dtypes[name])
        return np.ascontiguousarray(data[inverse.reshape(-1)], dtype=self._dtypes[name])

    def _open_h5(self, path: str) -> h5py.File:
        """h5py's view of a file in this process: a remote one's cached
        copy, else ranges of the object."""
        if not is_remote_url(path):
            return h5py.File(path, "r")
        copy = self._state().extra["local"].get(path)
        if copy is not None:
            return h5py.File(copy["path"], "r")
        return h5py.File(get_session(self._remote).file(path), "r")

    def state_identity(self) -> dict[str, Any]:
        """What a loader state over this dataset is bound to (see
        ``chute.DataLoader.load_state_dict``): each file's path, size, version
        (remote) and rows, the fields, and a digest of every dataset's storage
        layout (dtype, shape, offsets, chunk table) taken at open."""
        return dict(self._identity)

    def __repr__(self) -> str:
        return (
            f"H5Dataset({len(self._paths)} files, {len(self)} rows, fields={self._fields},"
            f" slow={sorted(self._slow)})"
        )


def _find_dataset(f: h5py.File, path: str, ds_path: str) -> h5py.Dataset:
    """The dataset `ds_path` of `f` (links followed); KeyError naming what
    the file has when it is not there."""
    obj = f.get(ds_path)
    if isinstance(obj, h5py.Dataset):
        return obj
    if obj is not None:
        raise KeyError(
            f"{path}: {ds_path!r} is a {type(obj).__name__.lower()}, not a dataset; the file"
            f" has {_dataset_listing(f)}"
        )
    link = f.get(ds_path, getlink=True) if _parent_exists(f, ds_path) else None
    if isinstance(link, h5py.ExternalLink) and is_remote_url(path):
        raise _remote_external_link(path, ds_path, link.filename)
    if isinstance(link, h5py.ExternalLink | h5py.SoftLink):
        raise KeyError(
            f"{path}: {ds_path!r} is a link to {_link_target(link)} that leads nowhere"
            " (HDF5 cannot open its target)"
        )
    raise KeyError(f"{path}: dataset {ds_path!r} not found; the file has {_dataset_listing(f)}")


def _remote_external_link(path: str, ds_path: str, target: str) -> ValueError:
    return ValueError(
        f"{path}: dataset {ds_path!r} is an external link into {target!r}; chute follows"
        " external links of local files only"
    )


def _parent_exists(f: h5py.File, ds_path: str) -> bool:
    parent = ds_path.rstrip("/").rpartition("/")[0]
    return not parent or isinstance(f.get(parent), h5py.Group)


def _link_target(link: h5py.SoftLink | h5py.ExternalLink) -> str:
    if isinstance(link, h5py.ExternalLink):
        return f"{link.path!r} in {link.filename!r}"
    return repr(link.path)


_LISTED_DATASETS = 20


def _dataset_listing(f: h5py.File) -> str:
    """The datasets of `f` by path, links to datasets included (the first
    few), for an error message."""
    found: list[str] = []

    def walk(group: h5py.Group, prefix: str) -> bool:
        """Adds `group`'s datasets; False once the listing is full."""
        for name in group:
            try:
                kind = group.get(name, getclass=True)
            except (KeyError, OSError, RuntimeError):
                continue  # a link that leads nowhere
            if kind is h5py.Dataset:
                if len(found) == _LISTED_DATASETS:
                    return False
                found.append(prefix + name)
            elif (
                kind is h5py.Group
                # Only hard links are walked into: a soft link may lead back up.
                and isinstance(group.get(name, getlink=True), h5py.HardLink)
                and not walk(group[name], f"{prefix}{name}/")
            ):
                return False
        return True

    complete = walk(f, "")
    if not found:
        return "no datasets"
    listing = ", ".join(repr(n) for n in found)
    return f"datasets {listing}{'' if complete else ', ...'}"


def _identity(
    files: list[dict[str, Any]], fields: dict[str, str], layouts: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    digest = hashlib.sha256()
    for name in fields:
        for layout in layouts[name]:
            for key in sorted(layout):
                if key in ("mtime_ns", "inode"):
                    continue  # a copy of the file has others
                value = layout[key]
                data = value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode()
                digest.update(f"{key}:{len(data)}:".encode())
                digest.update(data)
    return {
        "type": "H5Dataset",
        "fields": dict(fields),
        "files": files,
        "layout": digest.hexdigest(),
    }


def _expand_files(files: PathLike | Sequence[PathLike], remote: RemoteOptions) -> list[str]:
    paths = expand_file_patterns(files, remote, "HDF5 file")
    for path in paths:
        if not is_remote_url(path) and not os.path.isfile(path):
            raise FileNotFoundError(errno.ENOENT, "HDF5 file not found", path)
    if not paths:
        raise ValueError("H5Dataset needs at least one file")
    return [p if is_remote_url(p) else str(Path(p).resolve()) for p in paths]
