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
import weakref
from collections import OrderedDict
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.common.errors import (
    EngineDataError,
    EngineReadError,
    SkippedSamples,
    engine_errors,
    translate,
)
from chute.common.handlers import Handler, reraise_exception
from chute.datasets.indexed import IndexedDataset, ProcessState
from chute.decoding.decoders import IMAGE_SPECS, NativeDecode
from chute.decoding.image_options import image_options
from chute.loader.protocol import LoaderSettings
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.remote_urls import cached_copy, expand_file_patterns, merge_options
from chute.sources.shards import file_change_key, local_path, remote_scheme_list
from chute.stream.native import ErrorHandlers, field_plan
from chute.stream.prefix import OutputField

DEFAULT_CACHE_BYTES = 1 << 30
# Row groups read ahead of the batches submitted (the pool's queue).
DEFAULT_READAHEAD = 8
# Column chunks of one row group closer than this are fetched with one request.
_MERGE_GAP = 1 << 20
# Threads reading row groups (a remote one's byte ranges are fetched with
# several requests at once).
_READERS = 4

DecodeSpec = str | Mapping[str, str] | None
FillValue = int | float | bool


def pyarrow_module() -> Any:
    """pyarrow, with its parquet module loaded (the optional extra)."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ImportError(
            "chute reads Parquet with pyarrow: pip install 'chute[parquet]'"
        ) from None
    return pyarrow


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


def _image_struct(pa: Any, type_: Any) -> bool:
    """The hub's image feature: ``struct<bytes: binary, path: string>``."""
    if not pa.types.is_struct(type_):
        return False
    names = [type_.field(i).name for i in range(type_.num_fields)]
    return "bytes" in names and _binary(pa, type_.field("bytes").type)


def _binary(pa: Any, type_: Any) -> bool:
    return bool(pa.types.is_binary(type_) or pa.types.is_large_binary(type_))


def _numeric(pa: Any, type_: Any) -> bool:
    return bool(
        pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
    )


def column_kind(type_: Any) -> str:
    """What ParquetDataset makes of a column of Arrow type `type_`: "image"
    (the hub's struct, decodable), "binary" (decodable when named), "tensor"
    (numeric) or "list" (pyarrow's values)."""
    pa = pyarrow_module()
    if _image_struct(pa, type_):
        return "image"
    if _binary(pa, type_):
        return "binary"
    return "tensor" if _numeric(pa, type_) else "list"


class ParquetDataset(IndexedDataset):
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
        storage_options, cache_dir, cache_limit_bytes, remote: how remote
            files are reached (as for ``TarDataset``).
        **decode_options: the image options of ``WebDataset.decode``
            (``size=(h, w)``, ``crop``, ``flip``, ``normalize``, ``dtype``, ...).

    A batch is a dict ``{column: value}``: decoded images and numeric columns
    as tensors of ``[batch, ...]``, any other column a list of pyarrow's
    values; ``ds[i]`` is the dict of one row.
    """

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
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        remote: RemoteOptions | None = None,
        **decode_options: Any,
    ) -> None:
        pa = pyarrow_module()
        self._remote = merge_options(
            remote,
            storage_options=storage_options,
            cache_dir=os.path.expanduser(os.fspath(cache_dir)) if cache_dir is not None else None,
            cache_limit_bytes=cache_limit_bytes,
        )
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
        self.columns = list(schema.names) if columns is None else [str(c) for c in columns]
        if not self.columns:
            raise ValueError("ParquetDataset: no columns given")
        twice = [c for c in dict.fromkeys(self.columns) if self.columns.count(c) > 1]
        if twice:
            raise ValueError(f"columns names {twice[0]!r} twice: {self.columns}")
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
        self._decoded = self._decoded_columns(pa, decode)
        self._fills = self._fill_values(pa, fill_null or {})
        self.handler = handler
        # Every failure the engine can skip is about one row's image.
        self._handlers = ErrorHandlers(read=handler, member=handler, field=handler)
        self._skipped = 0
        self._stopping = False  # a handler asked to end this epoch
        if decode_options and not self._decoded:
            raise ValueError(f"decode options {sorted(decode_options)} need decode=...")
        self._decode_opts = {
            spec: image_options(spec, **decode_options) for spec in set(self._decoded.values())
        }
        self.seed = int(seed)
        self._epoch = 0
        self._epoch_set = False
        self._draw_epoch = 0
        self._cache_bytes = max(0, int(cache_bytes))
        self._readahead = max(1, int(readahead))
        self._worker_process = False  # set in chute.DataLoader's worker processes
        group_rows = [n for f in self._files for n in f.group_rows]
        self._block_starts = np.concatenate([[0], np.cumsum(group_rows, dtype=np.int64)]).astype(
            np.int64
        )
        self._block_names = [
            f"file '{f.url}', row group {g}" for f in self._files for g in range(len(f.group_rows))
        ]
        # Where each global row group is: its file and its index in the file.
        self._block_file = np.array(
            [k for k, f in enumerate(self._files) for _ in f.group_rows], dtype=np.int64
        )
        self._block_group = np.array(
            [g for f in self._files for g in range(len(f.group_rows))], dtype=np.int64
        )
        self._init_indexed(num_threads)

    # -- opening -----------------------------------------------------------------------

    def _describe(self, url: str) -> _File:
        pq = pyarrow_module().parquet
        if is_remote_url(url):
            ranges = get_session(self._remote).ranges(url)
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
                self._open_ranges[f.path] = ranges
        if str(ranges.version) != f.version or int(ranges.size) != f.size:
            raise EngineReadError(
                f"'{f.url}' changed since it was opened (size {f.size}, version "
                f"{f.version!r}; now {int(ranges.size)}, {str(ranges.version)!r})"
            )
        return ranges

    def _decoded_columns(self, pa: Any, decode: DecodeSpec) -> dict[str, str]:
        """The columns the engine decodes, each with its image spec."""
        if decode is None:
            return {}
        if isinstance(decode, str):
            images = [c for c in self.columns if _image_struct(pa, self._types[c])]
            if not images:
                raise ValueError(
                    f"decode={decode!r} decodes the image columns (struct<bytes, path>), and "
                    f"none of {self.columns} is one: name binary columns to decode with "
                    f"decode={{column: {decode!r}}}"
                )
            wanted = dict.fromkeys(images, decode)
        else:
            wanted = {str(k): str(v) for k, v in decode.items()}
        for name, spec in wanted.items():
            if name not in self.columns:
                raise ValueError(f"decode names column {name!r}, which is not among {self.columns}")
            type_ = self._types[name]
            if not (_binary(pa, type_) or _image_struct(pa, type_)):
                raise ValueError(
                    f"column {name!r} of '{self._files[0].url}' is {type_}, not binary: it "
                    "cannot be decoded as an image"
                )
            if spec not in IMAGE_SPECS:
                raise ValueError(f"unknown image spec {spec!r} for column {name!r}")
            atype, _, mode = IMAGE_SPECS[spec]
            if atype == "pil" or mode == "rgba":
                raise ValueError(
                    f"image spec {spec!r} decodes in Python; ParquetDataset decodes natively "
                    "(rgb8, l8, torchrgb8, torchl8, torch, ...)"
                )
        return wanted

    def _fill_values(self, pa: Any, fill_null: Mapping[str, FillValue]) -> dict[str, Any]:
        """`fill_null` as pyarrow scalars of each column's type."""
        fills = {}
        for name, value in fill_null.items():
            if name not in self.columns:
                raise ValueError(
                    f"fill_null names column {name!r}, which is not among {self.columns}"
                )
            type_ = self._types[name]
            if not _numeric(pa, type_):
                raise ValueError(
                    f"fill_null: column {name!r} is {type_}, not numeric (its nulls come back "
                    "as None)"
                )
            fills[name] = _fill_scalar(pa, name, type_, value)
        return fills

    # -- map-style protocol ------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._block_starts[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        idx = self._one_index(index)
        result = self._read_native(idx)
        batch = self._assemble(result, idx)
        if not batch:  # the handler skipped it: a single row has nothing else to give
            raise translate(result[1].errors[0])
        return {name: value[0] for name, value in batch.items()}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows of `indices` (without those the handler skipped)."""
        batch = self.read_batch(self._as_indices(indices))
        n = _batch_rows(batch)
        return [{name: value[i] for name, value in batch.items()} for i in range(n)]

    def field_names(self) -> list[str]:
        return list(self.columns)

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

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the decoders' random draws (``chute.DataLoader.set_epoch``
        reaches it)."""
        self._epoch = int(epoch)
        self._epoch_set = True
        self._draw_epoch = self._epoch

    def _begin_epoch(self) -> None:
        self._draw_epoch = self._epoch
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        self._begin_epoch()
        return super().loader_batches(settings, index_batches)

    def worker_epoch(self) -> Any:
        self._begin_epoch()
        return self._draw_epoch

    def enter_worker_epoch(self, state: Any) -> None:
        self._draw_epoch = int(state)
        # A worker is dealt a few index batches at a time and waits for the
        # next while the loader waits for its results: it must not pull ahead.
        self._worker_process = True

    def reads_remote(self) -> bool:
        return any(is_remote_url(f.path) for f in self._files)

    # -- the engine ----------------------------------------------------------------------

    def _native_field_names(self) -> list[str]:
        return list(self._decoded)

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        decoded = list(self._decoded)
        source = _core.BlockSampleSource(
            [f"c{k}" for k in range(len(decoded))],
            decoded,
            self._block_starts.tolist(),
            self._block_names,
            [self._files[int(k)].url for k in self._block_file],
        )
        groups = _RowGroups(self, source)
        return [source], {"groups": groups}

    def _make_engine(
        self, state: ProcessState, threads: int, in_flight: int, hooks: tuple[int, int] | None
    ) -> Any:
        plan = _core.IndexedPlan()
        plan.samples = state.sources[0]
        plan.set_fields(
            [
                field_plan(
                    OutputField(
                        name=name,
                        extensions=[f"c{k}"],
                        decode_name=name,
                        native=NativeDecode(_core.FieldDecoder.IMAGE, spec),
                    ),
                    stack=True,
                    optional=False,
                    decode_opts=self._decode_opts[spec],
                )
                for k, (name, spec) in enumerate(self._decoded.items())
            ]
        )
        plan.on_error = self._handlers.policy
        # The rows a handler skipped are found by the keys (row numbers) left.
        plan.collect_keys = plan.on_error == _core.ErrorPolicy.SKIP
        plan.seed = self.seed
        plan.num_threads = threads
        plan.max_in_flight = in_flight
        if hooks is not None:
            plan.set_pin_hooks(*hooks)
        return _Engine(_core.IndexedEngine(plan), state.extra["groups"], self)

    def _submit(self, engine: Any, idx: np.ndarray) -> None:
        engine.submit(idx, self._draw_epoch)

    def _wait(self, engine: Any, timeout: float) -> Any:
        try:
            return engine.next(timeout)
        except (_core.DataError, _core.ReadError):
            with engine_errors():  # as chute.common.errors maps it
                raise

    def _pin(self, batch: Any) -> Any:
        return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def _assemble(self, result: Any, idx: np.ndarray) -> Any:
        """The batch of `idx` (see the class doc); ``{}`` when the handler
        skipped every row."""
        native, skipped, columns = result
        if skipped is not None:
            self._skipped += len(skipped.errors)
            if self._handlers.report(skipped.errors):
                self._stopping = True
            if native.size == 0:
                return {}
            keep = torch.from_numpy(skipped.kept)
            columns = {
                name: value[keep]
                if isinstance(value, torch.Tensor)
                else [v for v, k in zip(value, keep.tolist(), strict=True) if k]
                for name, value in columns.items()
            }
        images = dict(zip(self._decoded, _native_columns(native, len(self._decoded)), strict=True))
        out: dict[str, Any] = {}
        for name in self.columns:
            if name in images:
                spec = self._decoded[name]
                opts = self._decode_opts[spec]
                out[name] = _image_tensor(images[name], opts)
            else:
                out[name] = columns[name]
        return out

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        groups: _RowGroups = state.extra["groups"]
        return {
            "row_groups_read": groups.reads,
            "row_group_bytes_held": groups.held_bytes,
            "bytes_read": int(state.sources[0].bytes_read),
            "samples_skipped": self._skipped,
        }

    def iter_batches(
        self,
        index_batches: Iterable[Sequence[int]],
        num_threads: int,
        prefetch: int,
        timeout: float = 0,
        pin_memory: bool = False,
    ) -> Iterator[Any]:
        """For each index batch, ``{column: value}`` (see the class doc); the
        row groups of the batches ahead are read while earlier ones decode. A
        batch whose every row the handler skipped is left out."""
        for batch, stop in self._batches(index_batches, num_threads, prefetch, timeout, pin_memory):
            if batch:
                yield batch
            if stop:
                return

    def loader_batch_outputs(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]]
    ) -> Generator[tuple[list[Any], bool], None, None]:
        batches = self._batches(
            index_batches,
            settings.threads,
            settings.prefetch,
            settings.timeout,
            settings.pin_memory,
        )
        try:
            for batch, stop in batches:
                results = []
                if batch:
                    if settings.collate_fn is None:
                        results.append(batch)
                    else:  # the documented slow path, rows one by one
                        n = _batch_rows(batch)
                        rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
                        results.append(settings.collate_fn(rows))
                del batch
                yield results, stop
                del results
                if stop:
                    return
        finally:
            batches.close()

    def _batches(
        self,
        index_batches: Iterable[Sequence[int]],
        num_threads: int,
        prefetch: int,
        timeout: float,
        pin_memory: bool,
    ) -> Generator[tuple[dict[str, Any], bool], None, None]:
        """Each index batch's batch (``{}`` when the handler skipped all its
        rows), and whether a handler asked to end the epoch there."""
        if not self._worker_process:
            groups: _RowGroups = self._state().extra["groups"]
            index_batches = groups.read_ahead(index_batches)
        self._stopping = False
        batches = super().iter_batches(index_batches, num_threads, prefetch, timeout, pin_memory)
        try:
            for batch in batches:
                yield batch, self._stopping
                if self._stopping:
                    return
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    # -- rows ---------------------------------------------------------------------------

    def blocks_of(self, idx: np.ndarray) -> np.ndarray:
        """The global row group of each row of `idx` (int64, in range)."""
        n = len(self)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise IndexError(
                f"index {int(idx[bad][0])} is out of range for a dataset of length {n}"
            )
        return np.searchsorted(self._block_starts, idx, side="right") - 1

    def gather(self, tables: dict[int, Any], idx: np.ndarray, blocks: np.ndarray) -> dict[str, Any]:
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
            if _numeric(pa, type_):
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
                table = _reader(self, f).read_row_group(group, columns=self.columns)
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
        return [value_buffers(table.column(name)) for name in self._decoded]

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


def _fill_scalar(pa: Any, name: str, type_: Any, value: FillValue) -> Any:
    """`value` as a scalar of `type_`, which must hold it (a bool for a bool
    column, an integer in range for an integer column, a number for a float
    column)."""
    flag = isinstance(value, bool | np.bool_)
    if pa.types.is_boolean(type_):
        fits = flag
    elif pa.types.is_integer(type_):
        fits = isinstance(value, int | np.integer) and not flag
    else:
        fits = isinstance(value, int | float | np.integer | np.floating) and not flag
    if fits:
        try:
            scalar = pa.scalar(value, type_)
        except (OverflowError, ValueError, TypeError):  # ArrowInvalid is a ValueError
            scalar = None
        if scalar is not None and (pa.types.is_floating(type_) or scalar.as_py() == value):
            return scalar
    raise ValueError(f"fill_null: {value!r} is not a value of column {name!r} ({type_})")


@dataclass
class _Skipped:
    """The rows of a batch the handler skipped: which were kept, and the
    errors of the others."""

    kept: np.ndarray  # bool, one per row asked for
    errors: list[Exception]


def _batch_rows(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def value_buffers(column: Any) -> tuple[Any, np.ndarray, Any]:
    """A binary or string column (or the hub's image struct: its ``bytes``)
    as the native block sources take it, without copying the values: (data
    buffer, int64 offsets of each row's value, uint8 present per row or None)."""
    pa = pyarrow_module()
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if _image_struct(pa, array.type):
        array = array.flatten()[array.type.get_field_index("bytes")]
    _, offsets_buffer, data = array.buffers()
    wide = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    present = None
    if array.null_count:
        present = np.asarray(array.is_valid()).astype(np.uint8)
    return (data if data is not None else pa.py_buffer(b""), offsets, present)


def _native_columns(batch: Any, n: int) -> list[Any]:
    return [batch.column(k) for k in range(n)]


def _image_tensor(column: Any, opts: dict[str, Any]) -> Any:
    def one(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.view(torch.bfloat16) if opts.get("dtype") == "bfloat16" else t

    if isinstance(column, np.ndarray):
        return one(column)
    return [one(a) for a in column]


class _Engine:
    """The native engine of one iteration, with the row groups each batch in
    flight holds and the columns gathered for it in Python."""

    def __init__(self, engine: Any, groups: _RowGroups, dataset: ParquetDataset) -> None:
        self._engine = engine
        self._groups = groups
        # The dataset holds its engines: they hold it weakly, so that a
        # dataset dropped ends its threads at once, not at a later collection.
        self._dataset = weakref.proxy(dataset)
        self._pending: list[tuple[np.ndarray, np.ndarray, dict[str, Any]]] = []
        self._native = bool(dataset._decoded)
        self._skipped = SkippedSamples()

    def submit(self, idx: np.ndarray, epoch: int) -> None:
        blocks = self._dataset.blocks_of(idx)
        unique = np.unique(blocks).tolist()
        tables = self._groups.acquire(unique)
        try:
            columns = self._dataset.gather(tables, idx, blocks)
            if self._native:
                self._engine.submit(idx, epoch)
        except BaseException:
            self._groups.release(unique)
            raise
        self._pending.append((idx, np.asarray(unique), columns))

    def next(self, timeout: float) -> tuple[Any, _Skipped | None, dict[str, Any]]:
        """The oldest batch: the engine's, the rows the handler skipped in it
        (None if none) and the columns gathered in Python."""
        try:
            native = self._engine.next(timeout) if self._native else None
        except TimeoutError:
            raise  # still in flight: its row groups stay held
        except BaseException:
            self._finish_oldest()
            raise
        idx, columns = self._finish_oldest()
        if native is None or native.size == len(idx):
            return native, None, columns
        kept = np.isin(idx, np.asarray(native.keys(), dtype=np.int64))
        dropped = idx[~kept].tolist()
        errors = self._skipped.of_batch(self._engine.take_skipped(), dropped, len(dropped))
        return native, _Skipped(kept, errors), columns

    def _finish_oldest(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The oldest batch left the engine: its row groups are released;
        returns its rows and gathered columns."""
        idx, unique, columns = self._pending.pop(0)
        self._groups.release(unique.tolist())
        return idx, columns

    def outstanding(self) -> int:
        return len(self._pending)

    def stats(self) -> Any:
        return self._engine.stats()

    def close(self) -> None:
        self._engine.close()
        for _, unique, _ in self._pending:
            self._groups.release(unique.tolist())
        self._pending.clear()


class _RowGroups:
    """The row groups one process holds: read on a small pool ahead of the
    batches, handed to the native source, kept while a batch in flight
    needs them, and the least recently used beyond the byte bound dropped."""

    def __init__(self, dataset: ParquetDataset, source: Any) -> None:
        self._dataset = weakref.proxy(dataset)  # as `_Engine`'s
        self._source = source
        self._pool = ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="chute-parquet")
        # Its readers end with the dataset: row groups read ahead for a
        # dataset gone are of no use, and a read that failed for it would
        # keep the pool in a reference cycle until a collection.
        weakref.finalize(dataset, self._pool.shutdown, wait=False, cancel_futures=True)
        self._lock = threading.Lock()
        self._loading: dict[int, Future[tuple[Any, int]]] = {}
        self._tables: OrderedDict[int, tuple[Any, int]] = OrderedDict()  # block -> (table, bytes)
        self._pins: dict[int, int] = {}
        self.held_bytes = 0
        self.reads = 0

    def _load(self, block: int) -> tuple[Any, int]:
        table = self._dataset.read_block(block)
        self._source.put(block, self._dataset.native_columns(table, block))
        return table, int(table.nbytes)

    def prefetch(self, blocks: Iterable[int]) -> None:
        with self._lock:
            for b in blocks:
                if b not in self._tables and b not in self._loading:
                    self._loading[b] = self._pool.submit(self._load, b)
                    self.reads += 1

    def acquire(self, blocks: list[int]) -> dict[int, Any]:
        """The tables of `blocks` (read now if not read ahead), held until `release`."""
        self.prefetch(blocks)
        out: dict[int, Any] = {}
        for b in blocks:
            with self._lock:
                self._pins[b] = self._pins.get(b, 0) + 1
                held = self._tables.get(b)
                future = self._loading.get(b)
            if held is None:
                assert future is not None
                try:
                    held = future.result()
                except BaseException:
                    with self._lock:
                        if self._loading.get(b) is future:
                            del self._loading[b]
                    self.release([b])
                    self.release(list(out))
                    raise
                with self._lock:
                    if self._loading.get(b) is future:
                        del self._loading[b]
                        self._tables[b] = held
                        self.held_bytes += held[1]
            with self._lock:
                self._tables.move_to_end(b)
            out[b] = held[0]
        self._evict()
        return out

    def release(self, blocks: list[int]) -> None:
        with self._lock:
            for b in blocks:
                left = self._pins.get(b, 0) - 1
                if left > 0:
                    self._pins[b] = left
                else:
                    self._pins.pop(b, None)
        self._evict()

    def _evict(self) -> None:
        dropped = []
        with self._lock:
            for b in list(self._tables):
                if self.held_bytes <= self._dataset._cache_bytes:
                    break
                if b in self._pins:
                    continue
                _, nbytes = self._tables.pop(b)
                self.held_bytes -= nbytes
                dropped.append(b)
        for b in dropped:
            self._source.drop(b)

    def read_ahead(self, index_batches: Iterable[Sequence[int]]) -> Iterator[Sequence[int]]:
        """`index_batches`, with the row groups of the next ones read ahead:
        as many batches as their new row groups stay within the readahead."""
        dataset = self._dataset
        window: list[tuple[Sequence[int], int]] = []  # batch, row groups it starts reading
        reading = 0
        for indices in index_batches:
            idx = dataset._as_indices(indices)
            try:
                blocks = np.unique(dataset.blocks_of(idx)).tolist()
            except IndexError:
                blocks = []  # submitting the batch raises, naming the bad index
            with self._lock:
                new = [b for b in blocks if b not in self._tables and b not in self._loading]
            self.prefetch(new)
            window.append((indices, len(new)))
            reading += len(new)
            while window and (reading > dataset._readahead or len(window) > 64):
                batch, started = window.pop(0)
                reading -= started
                yield batch
        for batch, _ in window:
            yield batch


_ranges_lock = threading.Lock()


def _reader(dataset: ParquetDataset, f: _File) -> Any:
    """This thread's pyarrow reader of `f` (readers are not shared across
    threads); the footer is parsed once, at open. The readers belong to the
    dataset, not to the thread: one kept in the thread's own storage would
    keep the dataset, its engines and the reading threads themselves alive
    for as long as the thread runs, and the dataset's reading pool would
    then never end."""
    pq = pyarrow_module().parquet
    cache: dict[str, Any] | None = getattr(dataset._thread_readers, "files", None)
    if cache is None:
        cache = dataset._thread_readers.files = {}
    reader = cache.get(f.url)
    if reader is None:
        if is_remote_url(f.path):
            reader = _RemoteReader(dataset, f)
        else:
            # Read, not mapped: a file cut while mapped would end the process
            # with SIGBUS inside pyarrow instead of raising.
            reader = pq.ParquetFile(f.path, metadata=f.metadata)
        cache[f.url] = reader
    return reader


class _ReadOnlyFile:
    """A read-only file over parts of a remote object, as pyarrow reads
    Python files (seek, tell, read); subclasses say where bytes come from."""

    def __init__(self, url: str, size: int) -> None:
        self.name = url
        self._size = size
        self._pos = 0
        self.closed = False

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes | memoryview:
        end = self._size if n < 0 else min(self._size, self._pos + n)
        data = self._bytes(self._pos, end) if end > self._pos else b""
        self._pos = max(self._pos, end)
        return data

    def _bytes(self, start: int, end: int) -> bytes | memoryview:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


class RemoteFooter(_ReadOnlyFile):
    """A remote object's tail, where its footer is, fetched with one request
    (anything before it with another)."""

    def __init__(self, ranges: Any, url: str) -> None:
        super().__init__(url, int(ranges.size))
        self._ranges = ranges
        tail = min(self._size, 1 << 16)
        self._tail_at = self._size - tail
        self._tail = bytes(ranges.read(self._tail_at, tail)) if tail else b""

    def _bytes(self, start: int, end: int) -> bytes:
        if start >= self._tail_at:
            return self._tail[start - self._tail_at : end - self._tail_at]
        return bytes(self._ranges.read(start, end - start))


class _Spans(_ReadOnlyFile):
    """Byte ranges of a remote object fetched ahead, read by pyarrow as the
    file they came from (a read outside them is a bug, reported)."""

    def __init__(self, url: str, size: int, spans: list[tuple[int, bytes]]) -> None:
        super().__init__(url, size)
        self._spans = spans

    def _bytes(self, start: int, end: int) -> memoryview:
        for at, data in self._spans:
            if at <= start and end <= at + len(data):
                return memoryview(data)[start - at : end - at]
        raise OSError(f"'{self.name}': bytes [{start}, {end}) were not fetched")


class _RemoteReader:
    """Row groups of a remote Parquet file: the byte ranges of the asked-for
    column chunks fetched (neighbours in one request), then parsed by pyarrow
    from memory. With a node cache, the file is downloaded once and read as a
    local file."""

    def __init__(self, dataset: ParquetDataset, f: _File) -> None:
        self._file = f
        self._ranges: Any = None
        self._local: Any = None
        pq = pyarrow_module().parquet
        copy = dataset.remote_copy(f) if dataset._remote.cache_dir else None
        if copy is not None:
            self._local = pq.ParquetFile(copy, metadata=f.metadata)
        else:
            self._ranges = dataset.remote_ranges(f)

    def read_row_group(self, group: int, columns: list[str]) -> Any:
        if self._local is not None:
            return self._local.read_row_group(group, columns=columns)
        pq = pyarrow_module().parquet
        metadata = self._file.metadata
        row_group = metadata.row_group(group)
        # pyarrow reads, for a column name, every leaf whose dotted path is
        # the name or starts with it: a column's own leaves, and for a name
        # with a dot ("a.b") also those of a struct's field of that path.
        names, prefixes = set(columns), tuple(f"{c}." for c in columns)
        spans = []
        for j in range(row_group.num_columns):
            chunk = row_group.column(j)
            path = chunk.path_in_schema
            if path not in names and not path.startswith(prefixes):
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                start = chunk.dictionary_page_offset
            spans.append((start, start + chunk.total_compressed_size))
        spans.sort()
        merged: list[list[int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1] + _MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        fetched = [(start, self._ranges.read(start, end - start)) for start, end in merged]
        source = _Spans(self._file.url, self._file.size, fetched)
        return pq.ParquetFile(source, metadata=metadata).read_row_group(group, columns=columns)
