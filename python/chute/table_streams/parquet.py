"""``ParquetStream``: Parquet files in webdataset's pipeline, their row
groups the shards.

Every row group of every file becomes one shard of the stream, named by a
url ``FILE#row-group=G``, so the stream machinery (the shard shuffle, node
and worker splitters, even batch counts, state dicts, elastic resume) deals
row groups where it deals tar shards, and nothing of it changes. The engine
opens its next row groups ahead of need; each open is a request that this
module's readers (a few Python threads per engine) take in order, read with
pyarrow (only the columns asked for; remote files by ranged reads of their
column chunks, or from the node cache: ``chute.parquet``), and hand over as
Arrow holds them (``_core.BlockFeed``). A row is a sample; each column a
member named by the column.

Column types decide what a member becomes: binary columns and the hub's
image struct (``struct<bytes, path>``) are encoded images, decoded
natively by a ``.decode(spec)`` stage (its ``only=`` picks columns) and raw
bytes otherwise; numeric and bool columns are decoded natively as scalars
(numpy arrays after ``.batched()``, as webdataset collates ``.npy``
members; tensors through a DataLoader); string columns are str.

Sample counts come from the footers (no data read): ``ParquetCounter``,
registered with ``chute.sources.sample_counts``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chute import _core
from chute.common.errors import EngineDataError
from chute.common.handlers import Handler, reraise_exception
from chute.datasets import parquet as parquet_files
from chute.datasets.parquet_columns import column_kind
from chute.decoding.decoders import IMAGE_SPECS, NativeDecode
from chute.decoding.extensions import SAMPLE_FIELDS
from chute.remote import RemoteOptions, is_remote_url
from chute.sources import reader_threads
from chute.sources.parquet_files import pyarrow_module, release_unused_memory
from chute.sources.sample_counts import CountSettings, ShardSamples, register_sample_counter
from chute.sources.shards import Splitter, split_by_node, split_by_worker
from chute.stream.compiler import CompiledPipeline
from chute.stream.native import EngineSettings, ErrorHandlers
from chute.stream.prefix import MEMBER
from chute.wds.dataset import WebDataset

ROW_GROUP_MARK = "#row-group="
# Readers per engine: row groups read at once (pyarrow releases the GIL).
READER_THREADS = 4
# An elastic resume replays shuffle buffers from sample sizes, which a
# footer does not give: an elastic stream's buffer is bounded in samples only.
UNBOUNDED_BYTES = 1 << 62

# Fields every sample has, set by the stream (the column of that name, if any, would be hidden).
_OWN_FIELDS = (*SAMPLE_FIELDS, "__local_path__")


def row_group_url(file_url: str, group: int) -> str:
    return f"{file_url}{ROW_GROUP_MARK}{group}"


def split_row_group_url(url: str) -> tuple[str, int] | None:
    """(file url, row group) of a row group's url, or None for another url."""
    file_url, mark, group = url.rpartition(ROW_GROUP_MARK)
    if not mark or not group.isdigit():
        return None
    return file_url, int(group)


def _column_role(type_: Any) -> str:
    """What a column becomes in the stream: "image" (binary or the hub's
    image struct), "numeric", "text", or "" for a type the stream does not read."""
    pa = pyarrow_module()
    role = column_kind(type_)
    if role in ("image", "binary"):
        return "image"
    if role == "tensor":
        return "numeric"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "text"
    return ""


def _npy_members(column: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A numeric column as one ``.npy`` of a scalar per row (the native npy
    decoder's input), built for the whole row group at once."""
    values = column.combine_chunks()
    present = None
    if values.null_count:
        present = np.asarray(values.is_valid()).astype(np.uint8)
        values = values.fill_null(False if values.type == "bool" else 0)
    array = np.ascontiguousarray(values.to_numpy(zero_copy_only=False))
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    header = io.BytesIO()
    np.lib.format.write_array(header, np.zeros((), array.dtype), allow_pickle=False)
    head = np.frombuffer(header.getvalue()[: -array.dtype.itemsize], dtype=np.uint8)
    rows, width = len(array), len(head) + array.dtype.itemsize
    out = np.empty((rows, width), dtype=np.uint8)
    out[:, : len(head)] = head
    out[:, len(head) :] = array.view(np.uint8).reshape(rows, array.dtype.itemsize)
    offsets = np.arange(rows + 1, dtype=np.int64) * width
    return out.reshape(-1), offsets, present


class ParquetStream(WebDataset):
    """webdataset's pipeline over the rows of Parquet files.

    ``chute.wds.ParquetStream(urls, columns=...)`` takes what
    ``WebDataset`` takes (``shardshuffle``, ``handler``, ``nodesplitter``,
    ``workersplitter``, ``elastic``, ``even_batches``, the remote settings,
    ``threads``, ...) and the fluent stages after it; its shards are the
    files' row groups (module doc).

    Args:
        urls: Parquet files: a path, brace pattern, glob (local or on a
            bucket) or a list, local or remote (as ``chute.ParquetDataset``).
        columns: the columns to read, the members of each sample (default:
            every column of the first file); binary, image struct,
            numeric, bool and string columns.
        nodesplitter: splits the row groups across DDP ranks (default:
            ``split_by_node``; webdataset's ``single_node_only`` refuses DDP).
        readahead: row groups the engine opens ahead of the one it reads
            (default 2 for local files, 6 for remote ones).
        image_base: where the relative paths of image references are (as
            ``chute.ParquetDataset``'s).
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        handler: Handler = reraise_exception,
        *,
        shardshuffle: bool | int | None = None,
        resampled: bool = False,
        repeat: bool = False,
        nodesplitter: Splitter | None = split_by_node,
        workersplitter: Splitter | None = split_by_worker,
        empty_check: bool = True,
        seed: int | None = None,
        readahead: int | None = None,
        threads: int | None = None,
        streams: int = 1,
        prefetch: int | None = None,
        shuffle_max_bytes: int = 1 << 30,
        timeout: float = 0.0,
        even_batches: str = "cap",
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        remote: RemoteOptions | None = None,
        elastic: bool = False,
        image_base: str | os.PathLike[str] | None = None,
    ) -> None:
        files = parquet_files.ParquetDataset(
            urls,
            columns,
            cache_bytes=0,
            readahead=1,
            image_base=image_base,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit_bytes=cache_limit_bytes,
            remote=remote,
        )
        self.files = files
        self.columns = list(files.columns)
        taken = [c for c in self.columns if c in _OWN_FIELDS]
        if taken:
            others = [c for c in self.columns if c not in _OWN_FIELDS]
            raise ValueError(
                f"column {taken[0]!r} of '{files.urls[0]}' has the name of a field "
                "ParquetStream sets itself (__key__: the row's number in its file, __url__: its "
                "row group's url, __local_path__: its file), which would hide the column's "
                f"values: read the other columns (columns={others!r}), or the file with "
                "chute.ParquetDataset, which returns every column as it is"
            )
        self.roles: dict[str, str] = {}
        for name in self.columns:
            role = _column_role(files._types[name])
            if not role:
                raise ValueError(
                    f"column {name!r} of '{files.urls[0]}' is {files._types[name]}: "
                    "ParquetStream reads binary, image struct, numeric, bool and string columns"
                )
            self.roles[name] = role
        row_groups: list[str] = []
        self.block_rows: list[int] = []
        self.block_first_keys: list[int] = []
        for f in files._files:
            rows = f.group_rows
            _COUNTER.remember(f.url, rows)
            first = 0
            for g, n in enumerate(rows):
                row_groups.append(row_group_url(f.url, g))
                self.block_rows.append(n)
                self.block_first_keys.append(first)
                first += n
        if not row_groups:
            raise ValueError(f"ParquetStream: {files.urls} hold no row groups")
        if readahead is None:
            # Local reads are quick: more at once only contend for the
            # cores; remote ones wait on round trips.
            readahead = 6 if files.reads_remote() else 2
        self.readahead = max(1, int(readahead))
        super().__init__(
            row_groups,
            handler=handler,
            resampled=resampled,
            repeat=repeat,
            shardshuffle=shardshuffle,
            nodesplitter=nodesplitter,
            workersplitter=workersplitter,
            empty_check=empty_check,
            seed=seed,
            threads=threads,
            streams=streams,
            prefetch=prefetch,
            shuffle_max_bytes=UNBOUNDED_BYTES if elastic else shuffle_max_bytes,
            timeout=timeout,
            even_batches=even_batches,
            remote=files._remote,
            elastic=elastic,
        )
        self.urls = row_groups  # as built: never brace-expanded

    # -- what the stream machinery asks of a format ---------------------------------

    def check_shard_urls(self, urls: list[str]) -> None:
        pass  # row groups of the files read at construction

    def first_sample_extensions(self, urls: list[str]) -> list[str]:
        return list(self.columns)

    def reads_remote(self) -> bool:
        return self.files.reads_remote()

    def state_fingerprint(self) -> dict[str, Any]:
        out = super().state_fingerprint()
        footers = "\n".join(f.footer_digest for f in self.files._files)
        out["order"]["footers"] = hashlib.sha256(footers.encode()).hexdigest()[:16]
        return out

    def compile_pipeline(
        self,
        first_sample_extensions: Callable[[], Sequence[str]],
        *,
        seed: int,
        shuffle_seed: int | None = None,
    ) -> CompiledPipeline:
        """The stages compiled, each column's field decoded by its type
        (module doc) rather than by a member extension."""
        compiled = super().compile_pipeline(
            first_sample_extensions, seed=seed, shuffle_seed=shuffle_seed
        )
        only = compiled.decode_only
        for f in compiled.fields:
            roles = {self.roles.get(e) for e in f.extensions}
            if not f.extensions or None in roles:
                continue  # __key__ and the like, or no column: the engine says it is missing
            if len(roles) > 1:
                raise ValueError(
                    f"field {f.name!r}: columns {';'.join(f.extensions)} are of different types"
                )
            role = roles.pop()
            if only is not None and compiled.image_spec and role != "image":
                named = [e for e in f.extensions if e in only]
                if named:
                    raise ValueError(
                        f"column {named[0]!r} of '{self.files.urls[0]}' is "
                        f"{self.files._types[named[0]]}, not binary: it cannot be decoded "
                        "as an image"
                    )
            if role == "numeric":
                f.decode_name, f.native = MEMBER, NativeDecode(_core.FieldDecoder.NPY)
            elif role == "text":
                f.decode_name, f.native = "txt", None
            elif f.decode_name is None or compiled.image_spec is None:
                f.decode_name, f.native = None, None
            else:
                spec = compiled.image_spec
                atype, _, mode = IMAGE_SPECS[spec]
                if atype == "pil" or mode == "rgba":
                    raise ValueError(
                        f"image spec {spec!r} decodes in Python; ParquetStream decodes images "
                        "natively (rgb8, l8, torchrgb8, torchl8, torch, ...)"
                    )
                f.native = NativeDecode(_core.FieldDecoder.IMAGE, spec)
        return compiled

    def make_plan(
        self,
        compiled: CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        pass_index: int,
        settings: EngineSettings,
        handlers: ErrorHandlers,
    ) -> Any:
        plan = super().make_plan(
            compiled, urls, worker, rank, epoch, pass_index, settings, handlers
        )
        # Each row group opened ahead is one being read.
        plan.parse_ahead = max(plan.parse_ahead, self.readahead)
        return plan

    def set_plan_source(self, plan: Any, urls: list[str]) -> Any:
        """The plan reads its row groups from a BlockFeed that readers of
        this process serve while the plan object lives."""
        names = [
            f"file '{f.url}', row group {g}"
            for f in self.files._files
            for g in range(len(f.group_rows))
        ]
        feed = _core.BlockFeed(
            self.columns,
            self.columns,
            self.urls,
            self.block_rows,
            names,
            self.block_first_keys,
            [f.url for f in self.files._files for _ in f.group_rows],
        )
        plan.block_feed = feed
        # The readers wait for requests without waking up in between; the
        # plan gone, nothing will ask, and closing the feed ends their wait.
        weakref.finalize(plan, feed.close)
        for _ in range(min(READER_THREADS, self.readahead)):
            reader_threads.start_reader(_serve, (self, feed), "chute-parquet-stream", feed.close)
        return feed

    def block_columns(self, block: int) -> list[tuple[Any, np.ndarray, Any]]:
        """Row group `block` (of all files, in order) as the feed takes it."""
        table = self.files.read_block(block)
        out = []
        for name in self.columns:
            column = table.column(name)
            if self.roles[name] == "numeric":
                out.append(_npy_members(column))
            else:
                out.append(self.files.column_buffers(table, name, block))
        return out

    def __repr__(self) -> str:
        return (
            f"ParquetStream({len(self.files._files)} files, {len(self.urls)} row groups, "
            f"columns {self.columns})"
        )


def _serve(stream: ParquetStream, feed: Any) -> None:
    """Reads the row groups the engine asks for until the feed is closed
    (its plan gone, or the process exiting)."""
    while not reader_threads.stopping():
        request = feed.next_request()
        if request is None:
            return
        _read(stream, feed, *request)
        # What the read allocated for a while was freed on this thread, and
        # so, by now, was the row group the engine finished before.
        release_unused_memory()


def _read(stream: ParquetStream, feed: Any, ticket: int, block: int) -> None:
    """Hands the feed row group `block` for request `ticket`, or why not."""
    try:
        columns = stream.block_columns(block)
    except EngineDataError as e:
        feed.fail(ticket, True, str(e))
        return
    except Exception as e:  # the storage failed, or anything else: the shard's reader
        feed.fail(ticket, False, f"{type(e).__name__}: {e}")
        return
    with contextlib.suppress(ValueError, OSError):
        # Columns that do not fit the row group: the source that asked raises it.
        feed.put(ticket, block, columns)


class ParquetCounter:
    """Row-group shards counted from their files' footers (no data read):
    those a ParquetStream opened in this process, else the footer read again."""

    def __init__(self) -> None:
        self._rows: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def remember(self, file_url: str, rows: list[int]) -> None:
        with self._lock:
            self._rows[file_url] = list(rows)

    def _group_rows(self, url: str, remote: RemoteOptions | None) -> int | None:
        found = split_row_group_url(url)
        assert found is not None
        file_url, group = found
        with self._lock:
            rows = self._rows.get(file_url)
        if rows is None:
            if remote is None and is_remote_url(file_url):
                return None
            opened = parquet_files.ParquetDataset(file_url, remote=remote)
            rows = opened._files[0].group_rows
            self.remember(file_url, rows)
        if group >= len(rows):
            raise ValueError(f"'{file_url}' has {len(rows)} row groups, not {group + 1}")
        return rows[group]

    def claims(self, url: str) -> bool:
        return split_row_group_url(url) is not None

    def indexed_count(self, url: str) -> int | None:
        return self._group_rows(url, None)

    def count(self, url: str, where: CountSettings) -> int:
        rows = self._group_rows(url, where.remote)
        assert rows is not None
        return rows

    def layouts(self, urls: list[str], where: CountSettings) -> list[ShardSamples]:
        out = []
        for url in urls:
            n = self.count(url, where)
            # Sizes do not matter: an elastic stream's buffer has no byte bound.
            out.append(ShardSamples(n, np.zeros(n, dtype=np.uint64)))
        return out


_COUNTER = ParquetCounter()
register_sample_counter("parquet", _COUNTER)
