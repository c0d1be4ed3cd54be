"""``ParquetDataset``: rows of Parquet files (the Hugging Face hub's format)
as a map-style dataset, image columns decoded and transformed natively.

Row ``i`` counts the rows of the files in the order given; each file's footer
says how its rows fall into row groups, the unit Parquet is read in. A batch
reads the row groups its rows are in (only the columns asked for), with
pyarrow (``pip install 'chute[parquet]'``), on a small thread pool that works
ahead of the batches submitted and with the GIL released inside pyarrow's
reader. Row groups stay in memory, least recently used dropped first, within
``cache_bytes`` (those a batch in flight needs are kept whatever the bound).

Image columns are handed to the engine as Arrow lays them out (one buffer of
all the row group's encoded images and their offsets), without a copy: the
native decoders and transforms (``decode="torchrgb8"``, ``size``,
``crop="random_resized"``, ``flip``, ``normalize``, ``dtype``; the options of
``WebDataset.decode``) run on the engine's threads with no Python per image.
Numeric columns become tensors and every other column comes back as pyarrow
reads it (``to_pylist``: str, bytes, dicts, lists), gathered once per batch.

Shuffling is the sampler's, as for every index-driven dataset
(``chute.DataLoader(ds, shuffle=True)``, ``distributed=True``): an exact
shuffle of the whole dataset. Under an exact shuffle a batch's rows lie in as
many row groups as it has rows, so every row group is read once per epoch only
when all of them fit in ``cache_bytes``; datasets larger than memory are
better read in order, or with a sampler that keeps to a few row groups at a
time.

Remote files (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://``,
globs on buckets; ``pip install 'chute[remote]'``) are read through chute's
storage layer: the footer with ranged reads at open, then for each row group
only the byte ranges of the asked-for column chunks (neighbours merged into
one request), on the same thread pool, ahead of the batches. With a
``cache_dir`` each file is downloaded once into the node's cache and read as
a local file.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.common.errors import (
    EngineDataError,
    EngineReadError,
)
from chute.common.handlers import Handler, reraise_exception
from chute.datasets.blocks import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_READAHEAD,
    BlockDataset,
    ColumnKind,
    DecodeSpec,
    FillValue,
)
from chute.datasets.indexed import ProcessState
from chute.datasets.parquet_columns import (
    fill_scalar,
    image_bytes,
    is_binary,
    is_image_struct,
    is_numeric,
    value_buffers,
)
from chute.datasets.parquet_row_groups import RowGroupCache, RowGroupEngine
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.remote.parquet_ranges import RemoteFooter
from chute.sources import reader_threads
from chute.sources.parquet_files import (
    RangedRowGroupFile,
    RowGroupFile,
    pyarrow_module,
)
from chute.sources.remote_urls import (
    cached_copy,
    dataset_remote_options,
    expand_file_patterns,
)
from chute.sources.shards import file_change_key, local_path, remote_scheme_list


@dataclass
class _File:
    """One Parquet file as its footer describes it."""

    url: str
    path: str  # the local path, or the url of a remote object
    size: int
    version: str  # a remote object's ETag (else modification time); "" for local files
    metadata: Any  # pyarrow FileMetaData
    footer_digest: str
    # A local file's (device, inode, size, mtime, ctime) when its footer was
    # last found to be the one read at open; None for remote objects.
    stat: tuple[int, ...] | None = None

    @property
    def group_rows(self) -> list[int]:
        return [self.metadata.row_group(i).num_rows for i in range(self.metadata.num_row_groups)]


class ParquetDataset(BlockDataset):
    """Map-style rows of Parquet files, concatenated in the order given.

    Args:
        urls: a file, a brace pattern (``"train-{00000..00009}.parquet"``),
            a glob (sorted), or a list of these; local paths (or ``file:``
            urls) or remote urls (see the module doc).
        columns: the columns to read, in output order (default: every
            column of the first file). Every file must have them, with the
            same types.
        decode: an image spec (``"torchrgb8"``, ``"rgb8"``, ``"l8"``,
            ``"torch"``, ...) for every image column among `columns` (the
            hub's ``struct<bytes, path>`` columns), or ``{column: spec}``
            naming binary or image columns to decode; None decodes nothing.
        fill_null: ``{column: value}`` for numeric columns that may hold
            nulls: each null becomes `value` (which the column's type must
            hold exactly). A null in a numeric column not named here raises,
            naming file, row group, row and column.
        handler: what an image that does not decode does (webdataset's
            handlers, as ``TarDataset(handler=...)``): ``reraise_exception``
            (the default) raises naming file, row group, row and column;
            ``warn_and_continue`` / ``ignore_and_continue`` drop the row, so
            its batch comes out shorter (every column alike), and
            ``warn_and_stop`` / ``ignore_and_stop`` end the epoch there.
        cache_bytes: bound of the row groups held in memory (see the module doc).
        readahead: row groups read ahead of the batches submitted.
        num_threads: engine threads behind ``ds[i]`` and ``__getitems__``
            (default: the CPUs this process may use).
        seed: seeds the decoders' random draws (``crop="random_resized"``,
            ``flip``): those of row i derive from (seed, epoch, i).
        image_base: where the relative paths of image references are (an
            image column's row with null ``bytes`` and a ``path``, as
            ``datasets``' ``to_parquet`` keeps images made from files: the
            file at ``path`` is read); default: the current directory when
            the dataset is made, where ``datasets`` opens them.
        storage_options, cache_dir, cache_limit_bytes, remote: how remote
            files are reached (as for ``TarDataset``).
        **decode_options: the image options of ``WebDataset.decode``
            (``size=(h, w)``, ``crop``, ``flip``, ``normalize``, ``dtype``, ...).

    A batch is a dict ``{column: value}``: decoded images and numeric columns
    as tensors of ``[batch, ...]``, any other column a list of pyarrow's
    values; ``ds[i]`` is the dict of one row.
    """

    dataset_name = "ParquetDataset"
    image_columns_are = " (struct<bytes, path>)"
    # Its engine's threads wait for the row groups being read (a failed
    # one reaches the handler row by row).
    min_engine_threads = 1

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        decode: DecodeSpec = None,
        *,
        fill_null: Mapping[str, FillValue] | None = None,
        handler: Handler = reraise_exception,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        readahead: int = DEFAULT_READAHEAD,
        num_threads: int | None = None,
        seed: int = 0,
        image_base: str | os.PathLike[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        remote: RemoteOptions | None = None,
        **decode_options: Any,
    ) -> None:
        pa = pyarrow_module()
        self._image_base = os.path.abspath(os.fspath(image_base) if image_base else os.getcwd())
        self._remote = dataset_remote_options(remote, storage_options, cache_dir, cache_limit_bytes)
        self.urls = expand_file_patterns(urls, self._remote, "Parquet file")
        if not self.urls:
            raise ValueError("ParquetDataset: no files given")
        # Each remote file's ranged reader (its HEAD sent) or node-cache copy
        # (path, or None when it cannot be cached), one per process, shared
        # by the threads that read its row groups.
        self._open_ranges: dict[str, Any] = {}
        self._copies: dict[str, str | None] = {}
        self._held_copies: list[Any] = []  # open cache entries: not evicted
        self._opening: dict[str, threading.Lock] = {}
        # Each thread's pyarrow readers of the files (see `_reader`).
        self._thread_readers = threading.local()
        with ThreadPoolExecutor(max_workers=min(16, len(self.urls))) as pool:
            self._files: list[_File] = list(pool.map(self._describe, self.urls))
        schema = self._files[0].metadata.schema.to_arrow_schema()
        self._set_columns(list(schema.names) if columns is None else [str(c) for c in columns])
        self._types: dict[str, Any] = {}
        for f in self._files:
            file_schema = f.metadata.schema.to_arrow_schema()
            for name in self.columns:
                if name not in file_schema.names:
                    raise ValueError(
                        f"'{f.url}' has no column {name!r} (its columns: "
                        f"{', '.join(file_schema.names)})"
                    )
                type_ = file_schema.field(name).type
                first = self._types.setdefault(name, type_)
                if type_ != first:
                    raise ValueError(
                        f"column {name!r} is {type_} in '{f.url}' but {first} in "
                        f"'{self._files[0].url}'"
                    )
        group_rows = [n for f in self._files for n in f.group_rows]
        self._init_blocks(
            columns=self.columns,
            kinds={name: _column_kind(pa, type_) for name, type_ in self._types.items()},
            block_rows=group_rows,
            block_names=[
                f"file '{f.url}', row group {g}"
                for f in self._files
                for g in range(len(f.group_rows))
            ],
            block_urls=[f.url for f in self._files for _ in f.group_rows],
            where=f"'{self._files[0].url}'",
            decode=decode,
            fill_null=fill_null,
            handler=handler,
            cache_bytes=cache_bytes,
            readahead=readahead,
            num_threads=num_threads,
            seed=seed,
            decode_options=decode_options,
        )
        # Where each global row group is: its file and its index in the file.
        self._block_file = np.array(
            [k for k, f in enumerate(self._files) for _ in f.group_rows], dtype=np.int64
        )
        self._block_group = np.array(
            [g for f in self._files for g in range(len(f.group_rows))], dtype=np.int64
        )

    # -- opening -----------------------------------------------------------------------

    def _describe(self, url: str) -> _File:
        pq = pyarrow_module().parquet
        if is_remote_url(url):
            ranges = get_session(self._remote).ranges(url)
            reader_threads.close_at_exit(ranges)
            try:
                metadata = pq.read_metadata(RemoteFooter(ranges, url))
            except (OSError, ValueError) as e:
                raise EngineDataError(f"'{url}' is not a readable Parquet file: {e}") from e
            size, version, path = int(ranges.size), str(ranges.version), url
            self._open_ranges[url] = ranges
        else:
            path = local_path(url) or ""
            if not path:
                raise ValueError(
                    f"ParquetDataset reads local files and {remote_scheme_list()} urls; "
                    f"{url!r} is neither"
                )
            if not os.path.isfile(path):
                raise FileNotFoundError(2, "Parquet file not found", path)
            # Taken before the footer is read: a change in between shows at the first read.
            stat = file_change_key(path)
            try:
                metadata = pq.read_metadata(path)
            except (OSError, ValueError) as e:
                raise EngineDataError(f"'{url}' is not a readable Parquet file: {e}") from e
            return _File(url, path, stat[2], "", metadata, _footer_digest(metadata), stat)
        return _File(url, path, size, version, metadata, _footer_digest(metadata))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # Native readers and locks: a process opens its own.
        state.update(_open_ranges={}, _copies={}, _held_copies=[], _opening={})
        del state["_thread_readers"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._thread_readers = threading.local()

    def remote_copy(self, f: _File) -> str | None:
        """The node cache's copy of remote file `f` (downloaded once per node,
        opened once per process), or None when it cannot be cached."""
        with _ranges_lock:
            opening = self._opening.setdefault(f.path, threading.Lock())
        with opening:  # one file's download does not hold up another's
            if f.path not in self._copies:
                assert self._remote.cache_dir
                session = get_session(self._remote)
                copy = cached_copy(session, f.path, self._remote.cache_dir, self._held_copies)
                self._copies[f.path] = None if copy is None else str(copy["path"])
            return self._copies[f.path]

    def remote_ranges(self, f: _File) -> Any:
        """This process's ranged reader of remote file `f` (opened once,
        checked against the size and version `f` was opened with)."""
        with _ranges_lock:
            ranges = self._open_ranges.get(f.path)
            if ranges is None:
                ranges = get_session(self._remote).ranges(f.path)
                reader_threads.close_at_exit(ranges)
                self._open_ranges[f.path] = ranges
        if str(ranges.version) != f.version or int(ranges.size) != f.size:
            raise EngineReadError(
                f"'{f.url}' changed since it was opened (size {f.size}, version "
                f"{f.version!r}; now {int(ranges.size)}, {str(ranges.version)!r})"
            )
        return ranges

    def _fill_values(self, fill_null: Mapping[str, FillValue]) -> dict[str, Any]:
        """`fill_null` as pyarrow scalars of each column's type."""
        pa = pyarrow_module()
        fills = {}
        for name, value in fill_null.items():
            if name not in self.columns:
                raise ValueError(
                    f"fill_null names column {name!r}, which is not among {self.columns}"
                )
            type_ = self._types[name]
            if not is_numeric(pa, type_):
                raise ValueError(
                    f"fill_null: column {name!r} is {type_}, not numeric (its nulls come back "
                    "as None)"
                )
            fills[name] = fill_scalar(pa, name, type_, value)
        return fills

    # -- map-style protocol ------------------------------------------------------------

    def state_identity(self) -> dict[str, Any]:
        """What a loader state of this dataset records of it, and must find
        again when loaded: the files as given, each one's size and a digest
        of its footer (row groups, column chunks and their statistics)."""
        return {
            "type": "ParquetDataset",
            "files": list(self.urls),
            "sizes": [f.size for f in self._files],
            "footer_digests": [f.footer_digest for f in self._files],
        }

    def reads_remote(self) -> bool:
        return any(is_remote_url(f.path) for f in self._files)

    # -- the engine ----------------------------------------------------------------------

    def _hold_blocks(self, source: Any) -> RowGroupCache:
        return RowGroupCache(self, source, self._block_names, self._cache_bytes, self._readahead)

    def _block_engine(self, engine: Any, held: Any) -> RowGroupEngine:
        return RowGroupEngine(engine, held, self)

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        groups: RowGroupCache = state.extra["blocks"]
        return {
            "row_groups_read": groups.reads,
            "row_groups_reading": groups.reading,
            "row_group_bytes_held": groups.held_bytes,
            # Process-wide: what Arrow's pool holds in use (the row groups
            # held and those being read, and any other pyarrow user's).
            "arrow_bytes_allocated": int(pyarrow_module().total_allocated_bytes()),
            "bytes_read": int(state.sources[0].bytes_read),
            "samples_skipped": self._skipped,
        }

    # -- rows ---------------------------------------------------------------------------

    def gather(  # type: ignore[override]  # from the row groups' tables, not Blocks
        self, tables: dict[int, Any], idx: np.ndarray, blocks: np.ndarray
    ) -> dict[str, Any]:
        """The columns the engine does not decode, for rows `idx` (in row
        groups `blocks`), from the row groups' tables: one take per column."""
        pa = pyarrow_module()
        plain = [c for c in self.columns if c not in self._decoded]
        if not plain:
            return {}
        order, inverse = np.unique(blocks, return_inverse=True)
        held = [tables[int(b)] for b in order]
        starts = np.concatenate([[0], np.cumsum([t.num_rows for t in held])]).astype(np.int64)
        positions = pa.array(
            starts[inverse.reshape(-1)] + (idx - self._block_starts[blocks]), type=pa.int64()
        )
        out: dict[str, Any] = {}
        for name in plain:
            type_ = self._types[name]
            chunks = [chunk for t in held for chunk in t.column(name).chunks]
            values = pa.chunked_array(chunks, type=type_).take(positions)
            if is_numeric(pa, type_):
                if values.null_count and name in self._fills:
                    values = values.fill_null(self._fills[name])
                elif values.null_count:
                    first = int(np.flatnonzero(~np.asarray(values.is_valid()))[0])
                    raise EngineDataError(
                        f"{self._block_names[int(blocks[first])]}, row "
                        f"{int(idx[first] - self._block_starts[blocks[first]])} (sample "
                        f"{int(idx[first])}), column {name!r}: null, which a tensor cannot "
                        f"hold; ParquetDataset(fill_null={{{name!r}: value}}) fills it"
                    )
                out[name] = torch.from_numpy(
                    values.combine_chunks().to_numpy(zero_copy_only=False, writable=True)
                )
            else:
                out[name] = values.to_pylist()
        return out

    def read_block(self, block: int) -> Any:
        """Row group `block` (global) of the columns asked for, as a pyarrow Table."""
        f = self._files[int(self._block_file[block])]
        group = int(self._block_group[block])
        while True:
            try:
                table = _reader(self, f).read_row_group(group, self.columns)
            except _core.ReadError as e:  # the storage failed, not the data
                raise EngineReadError(f"{self._block_names[block]}: {e}") from e
            except (OSError, ValueError) as e:  # pyarrow's ArrowIOError, ArrowInvalid
                self._check_unchanged(f, block)  # a rewrite is the better explanation
                raise EngineDataError(f"{self._block_names[block]}: {e}") from e
            if self._check_unchanged(f, block):
                return table
            # Rewritten with the same footer while read: read as it is now.

    def _check_unchanged(self, f: _File, block: int) -> bool:
        """Whether local file `f` is as it was when row group `block` was
        read. A file rewritten since the dataset opened it is read from the
        footer read at open, whose offsets may then point at other columns'
        or row groups' pages: it raises, naming the file, unless its footer
        is still the one read at open (False: read the row group again)."""
        if f.stat is None:
            return True  # a remote object: its reads are checked against its version
        name = self._block_names[block]
        try:
            now = file_change_key(f.path)
        except FileNotFoundError:
            raise EngineReadError(
                f"{name}: the file was removed after the dataset opened it"
            ) from None
        if now == f.stat:
            return True
        try:
            metadata = pyarrow_module().parquet.read_metadata(f.path)
        except (OSError, ValueError) as e:
            raise EngineDataError(
                f"{name}: the file changed after the dataset opened it (size {f.size}, now "
                f"{now[2]}) and its footer no longer reads ({e}); open the dataset again"
            ) from None
        if _footer_digest(metadata) != f.footer_digest:
            raise EngineDataError(
                f"{name}: the file changed after the dataset opened it (size {f.size}, now "
                f"{now[2]}): its footer describes other row groups or column chunks than "
                "the one read at open; open the dataset again"
            )
        f.stat = now
        return False

    def native_columns(self, table: Any, block: int) -> list[tuple[Any, np.ndarray, Any]]:
        """The decoded columns of row group `block`'s table as the native
        source takes them: (data buffer, int64 offsets, present or None)."""
        return [self.column_buffers(table, name, block) for name in self._decoded]

    def column_buffers(self, table: Any, name: str, block: int) -> tuple[Any, np.ndarray, Any]:
        """Column `name` of row group `block`'s table as `value_buffers`
        gives it, an image column's references read from their files."""
        pa = pyarrow_module()
        column = table.column(name)
        if is_image_struct(pa, column.type):
            referenced = image_bytes(column, name, self._block_names[block], self._image_base)
            column = pa.chunked_array([referenced])
        return value_buffers(column)

    def __repr__(self) -> str:
        return (
            f"ParquetDataset({len(self._files)} files, {len(self)} rows, "
            f"{len(self._block_names)} row groups, columns {self.columns})"
        )


def _footer_digest(metadata: Any) -> str:
    """A digest of a file's footer: its row groups, column chunks (where
    each lies) and their statistics."""
    return hashlib.sha256(
        json.dumps(metadata.to_dict(), sort_keys=True, default=str).encode()
    ).hexdigest()[:16]


def _column_kind(pa: Any, type_: Any) -> ColumnKind:
    """What the shared base makes of a column of Arrow type `type_`."""
    image = is_image_struct(pa, type_)
    if image or is_binary(pa, type_):
        kind = "encoded"
    elif is_numeric(pa, type_):
        kind = "tensor"
    else:
        kind = "list"
    return ColumnKind(kind=kind, type_name=str(type_), image=image)


_ranges_lock = threading.Lock()


def _reader(dataset: ParquetDataset, f: _File) -> Any:
    """This thread's pyarrow reader of `f` (readers are not shared across
    threads); the footer is parsed once, at open. The readers belong to the
    dataset, not to the thread: one kept in the thread's own storage would
    keep the dataset, its engines and the reading threads themselves alive
    for as long as the thread runs, and the dataset's reading pool would
    then never end. A remote file is read by the byte ranges of the asked-for
    column chunks, or, with a node cache, downloaded once and read as a
    local file."""
    cache: dict[str, Any] | None = getattr(dataset._thread_readers, "files", None)
    if cache is None:
        cache = dataset._thread_readers.files = {}
    reader = cache.get(f.url)
    if reader is None:
        if is_remote_url(f.path):
            copy = dataset.remote_copy(f) if dataset._remote.cache_dir else None
            if copy is not None:
                reader = RowGroupFile(copy, f.metadata)
            else:
                reader = RangedRowGroupFile(dataset.remote_ranges(f), f.url, f.size, f.metadata)
        else:
            # Read, not mapped: a file cut while mapped would end the process
            # with SIGBUS inside pyarrow instead of raising.
            reader = RowGroupFile(f.path, f.metadata)
        cache[f.url] = reader
    return reader
