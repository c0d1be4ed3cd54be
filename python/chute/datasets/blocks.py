"""Map-style datasets whose rows lie in blocks read whole: the base of
``ArrowDataset`` (record batches of Arrow IPC files) and ``MDSDataset``
(Mosaic streaming's shards).

Row ``i`` counts the rows of the blocks in order. A batch needs the blocks
its rows are in; a block is read once (on a few reader threads, ahead of
the batches submitted; the consumer's wait for it is bounded by its
timeout), kept in memory while a batch in flight needs it and, past that,
within ``cache_bytes`` (least recently used dropped first). A subclass
says what its blocks are (how many rows each holds, its name in messages)
and reads one (`read_block`, a `Block`); everything else is here: the
columns decoded natively (encoded images handed to the engine without a
copy, decoded and transformed on its threads: the options of
``WebDataset.decode``), the others gathered per batch as tensors or lists,
the error handler, the epoch of the random draws, worker processes.

How blocks are read and held is in ``chute.datasets.block_reading``.
``ParquetDataset`` shares this base; its row groups are held by its own
holder (a row group that fails to read reaches the handler row by row).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.common.errors import EngineDataError, engine_errors, translate
from chute.common.handlers import Handler
from chute.datasets.block_reading import BlockEngine, HeldBlocks
from chute.datasets.decode_epochs import DecodeEpochs
from chute.datasets.indexed import ProcessState
from chute.decoding.decoders import IMAGE_SPECS, NativeDecode
from chute.decoding.image_options import image_options
from chute.loader.frameworks import check_foreign_read
from chute.loader.protocol import LoaderSettings
from chute.stream.native import ErrorHandlers, field_plan
from chute.stream.prefix import OutputField

DEFAULT_CACHE_BYTES = 1 << 30
# Blocks read ahead of the batches submitted (the readers' queue).
DEFAULT_READAHEAD = 8

DecodeSpec = str | Mapping[str, str] | None
FillValue = int | float | bool
# One encoded column of a block as the engine's block source takes it: a
# buffer holding the values, int64 offsets (rows + 1) into it, and None or
# one uint8 per row (0 where the value is null).
Encoded = tuple[Any, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class ColumnKind:
    """What a dataset makes of one column.

    ``kind``: "encoded" (bytes, decodable as images when named in
    ``decode``), "tensor" (numbers of one dtype and per-row shape) or
    "list" (a list of Python values). ``image``: decoded by ``decode="<spec>"``
    (a column known to hold encoded images). ``nullable``: a tensor column
    that may hold nulls (``fill_null`` applies). ``type_name``: the column's
    type as messages name it.
    """

    kind: str
    type_name: str
    image: bool = False
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] = ()
    nullable: bool = False


class Block(ABC):
    """One block's rows of the columns asked for."""

    rows: int
    nbytes: int  # what holding it costs (the cache's bound counts it)

    @abstractmethod
    def encoded(self, column: str) -> Encoded:
        """An encoded column as the engine takes it (see `Encoded`)."""

    @abstractmethod
    def tensor(self, column: str, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows `positions` of a tensor column: values ``[n, *shape]``
        and, when some may be null, a bool array (True where present)."""

    @abstractmethod
    def check(self) -> None:
        """Raises when what the block's values were read from changed under
        them since (a mapped file cut: its lost pages read as zeros); called
        after every batch that read from it."""

    @abstractmethod
    def values(self, column: str, positions: np.ndarray) -> list[Any]:
        """The rows `positions` of a list column, or of an encoded one not
        decoded, as Python values."""


class BlockDataset(DecodeEpochs):
    """Base of map-style datasets over blocks of rows (see the module doc).

    A subclass builds its blocks' description and calls `_init_blocks`;
    it implements `read_block(block)` (a `Block`, which may check itself
    after each batch that read it: `Block.check`), `state_identity()` and
    may override `reads_remote()`.
    """

    #: The class's name in messages ("ArrowDataset").
    dataset_name = "BlockDataset"
    #: What makes a column an image column, in messages (" (struct<...>)").
    image_columns_are = ""
    #: The fewest engine threads: a holder whose failed reads the engine's
    #: threads wait for needs one, or the consumer's wait has no timeout.
    min_engine_threads = 0

    def _init_blocks(
        self,
        *,
        columns: list[str],
        kinds: dict[str, ColumnKind],
        block_rows: Sequence[int],
        block_names: list[str],
        block_urls: list[str],
        where: str,
        decode: DecodeSpec,
        fill_null: Mapping[str, FillValue] | None,
        handler: Handler,
        cache_bytes: int,
        readahead: int,
        num_threads: int | None,
        seed: int,
        decode_options: dict[str, Any],
    ) -> None:
        """`where` names the data in messages about columns ("'train.arrow'")."""
        self._set_columns(columns)
        self._kinds = kinds
        self._where = where
        self._decoded = self._decoded_columns(decode)
        self._fills = self._fill_values(fill_null or {})
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
        self._block_starts = np.concatenate(
            [[0], np.cumsum(np.asarray(block_rows, dtype=np.int64))]
        ).astype(np.int64)
        self._block_names = list(block_names)
        self._block_urls = list(block_urls)
        self._init_indexed(num_threads)

    def _set_columns(self, columns: list[str]) -> None:
        if not columns:
            raise ValueError(f"{self.dataset_name}: no columns given")
        twice = [c for c in dict.fromkeys(columns) if columns.count(c) > 1]
        if twice:
            raise ValueError(f"columns names {twice[0]!r} twice: {columns}")
        self.columns = list(columns)

    # -- subclass hooks -----------------------------------------------------------------

    def read_block(self, block: int) -> Block:
        """Block `block` of the columns asked for (raises EngineDataError or
        EngineReadError naming it)."""
        raise NotImplementedError

    def _hold_blocks(self, source: Any) -> Any:
        """The holder of this process's blocks, feeding `source`."""
        return HeldBlocks(self, source)

    def _block_engine(self, engine: Any, held: Any) -> Any:
        """The engine of one iteration over native `engine` and holder `held`:
        its ``next`` gives (native batch, `Skipped` or None, the gathered
        columns of the rows kept)."""
        return BlockEngine(engine, held, self)

    # -- columns ------------------------------------------------------------------------

    def _decoded_columns(self, decode: DecodeSpec) -> dict[str, str]:
        """The columns the engine decodes, each with its image spec."""
        if decode is None:
            return {}
        if isinstance(decode, str):
            images = [c for c in self.columns if self._kinds[c].image]
            if not images:
                raise ValueError(
                    f"decode={decode!r} decodes the image columns{self.image_columns_are}, "
                    f"and none of "
                    f"{self.columns} is one: name binary columns to decode with "
                    f"decode={{column: {decode!r}}}"
                )
            wanted = dict.fromkeys(images, decode)
        else:
            wanted = {str(k): str(v) for k, v in decode.items()}
        for name, spec in wanted.items():
            if name not in self.columns:
                raise ValueError(f"decode names column {name!r}, which is not among {self.columns}")
            kind = self._kinds[name]
            if kind.kind != "encoded":
                raise ValueError(
                    f"column {name!r} of {self._where} is {kind.type_name}, not binary: it "
                    "cannot be decoded as an image"
                )
            if spec not in IMAGE_SPECS:
                raise ValueError(f"unknown image spec {spec!r} for column {name!r}")
            atype, _, mode = IMAGE_SPECS[spec]
            if atype == "pil" or mode == "rgba":
                raise ValueError(
                    f"image spec {spec!r} decodes in Python; {self.dataset_name} decodes "
                    "natively (rgb8, l8, torchrgb8, torchl8, torch, ...)"
                )
        return wanted

    def _fill_values(self, fill_null: Mapping[str, FillValue]) -> dict[str, Any]:
        """`fill_null` as values of each column's dtype (which must hold them exactly)."""
        fills: dict[str, Any] = {}
        for name, value in fill_null.items():
            if name not in self.columns:
                raise ValueError(
                    f"fill_null names column {name!r}, which is not among {self.columns}"
                )
            kind = self._kinds[name]
            if kind.kind != "tensor" or kind.dtype is None:
                raise ValueError(
                    f"fill_null: column {name!r} is {kind.type_name}, not numeric (its nulls "
                    "come back as None)"
                )
            fills[name] = _fill_value(name, kind, value)
        return fills

    # -- map-style protocol -------------------------------------------------------------

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
        check_foreign_read(self, "__getitems__")
        batch = self.read_batch(self._as_indices(indices))
        n = _batch_rows(batch)
        return [{name: value[i] for name, value in batch.items()} for i in range(n)]

    def field_names(self) -> list[str]:
        return list(self.columns)

    def enter_worker_epoch(self, state: Any) -> None:
        super().enter_worker_epoch(state)
        # A worker is dealt a few index batches at a time and waits for the
        # next while the loader waits for its results: it must not pull ahead.
        self._worker_process = True

    # -- the engine ---------------------------------------------------------------------

    def _native_field_names(self) -> list[str]:
        return list(self._decoded)

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        decoded = list(self._decoded)
        source = _core.BlockSampleSource(
            [f"c{k}" for k in range(len(decoded))],
            decoded,
            self._block_starts.tolist(),
            self._block_names,
            self._block_urls,
        )
        return [source], {"blocks": self._hold_blocks(source)}

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
        plan.num_threads = max(self.min_engine_threads, threads)
        plan.max_in_flight = in_flight
        if hooks is not None:
            plan.set_pin_hooks(*hooks)
        return self._block_engine(_core.IndexedEngine(plan), state.extra["blocks"])

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
        """The batch of `idx`; ``{}`` when the handler skipped every row."""
        native, skipped, columns = result  # columns of the rows kept only
        self._check_rows(idx)
        if skipped is not None:
            self._skipped += len(skipped.errors)
            if self._handlers.report(skipped.errors):
                self._stopping = True
            if native.size == 0:
                return {}
        images = dict(
            zip(
                self._decoded,
                [native.column(k) for k in range(len(self._decoded))] if native is not None else [],
                strict=True,
            )
        )
        out: dict[str, Any] = {}
        for name in self.columns:
            if name in images:
                out[name] = _image_tensor(images[name], self._decode_opts[self._decoded[name]])
            else:
                out[name] = columns[name]
        return out

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        blocks: HeldBlocks = state.extra["blocks"]
        return {
            "blocks_read": blocks.reads,
            "block_bytes_held": blocks.held_bytes,
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
        """For each index batch, ``{column: value}``; the blocks of the
        batches ahead are read while earlier ones decode. A batch whose every
        row the handler skipped is left out."""
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
            index_batches = self._state().extra["blocks"].read_ahead(index_batches)
        self._stopping = False
        threads = max(self.min_engine_threads, int(num_threads))
        batches = super().iter_batches(index_batches, threads, prefetch, timeout, pin_memory)
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
        """The block of each row of `idx` (int64, in range)."""
        n = len(self)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise IndexError(
                f"index {int(idx[bad][0])} is out of range for a dataset of length {n}"
            )
        return np.searchsorted(self._block_starts, idx, side="right") - 1

    def gather(
        self, blocks: dict[int, Block], idx: np.ndarray, block_of: np.ndarray
    ) -> dict[str, Any]:
        """The columns the engine does not decode, for rows `idx` (in blocks
        `block_of`): tensors ``[n, ...]`` and lists, in the order of `idx`."""
        plain = [c for c in self.columns if c not in self._decoded]
        if not plain:
            return {}
        positions = idx - self._block_starts[block_of]
        groups = [(int(b), np.flatnonzero(block_of == b)) for b in np.unique(block_of)]
        out: dict[str, Any] = {}
        for name in plain:
            kind = self._kinds[name]
            if kind.kind == "tensor":
                assert kind.dtype is not None
                values = np.empty((idx.size, *kind.shape), dtype=kind.dtype)
                for b, where in groups:
                    part, present = blocks[b].tensor(name, positions[where])
                    if present is not None and not present.all():
                        part = self._filled(name, part, present, b, positions[where])
                    values[where] = part
                out[name] = torch.from_numpy(values)
            else:
                items: list[Any] = [None] * idx.size
                for b, where in groups:
                    got = blocks[b].values(name, positions[where])
                    for k, v in zip(where.tolist(), got, strict=True):
                        items[k] = v
                out[name] = items
        return out

    def _filled(
        self, name: str, part: np.ndarray, present: np.ndarray, block: int, positions: np.ndarray
    ) -> np.ndarray:
        """`part` with its nulls filled by the column's ``fill_null`` value,
        or the error naming the first null's block, row and column."""
        if name not in self._fills:
            first = int(np.flatnonzero(~present)[0])
            row = int(positions[first])
            raise EngineDataError(
                f"{self._block_names[block]}, row {row} (sample "
                f"{int(self._block_starts[block]) + row}), column {name!r}: null, which a "
                f"tensor cannot hold; {self.dataset_name}(fill_null={{{name!r}: value}}) fills it"
            )
        part = part.copy()
        part[~present] = self._fills[name]
        return part

    def check_block_rows(self, block: int, rows: int) -> None:
        """Raises when block `block` read with another number of rows than
        its description (made at open) says."""
        expected = int(self._block_starts[block + 1] - self._block_starts[block])
        if rows != expected:
            raise EngineDataError(
                f"{self._block_names[block]}: {rows} rows where the dataset opened it with "
                f"{expected}; it changed after the dataset was opened: open the dataset again"
            )


def _batch_rows(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def encoded_values(column: Encoded, positions: np.ndarray) -> list[bytes | None]:
    """Rows `positions` of an encoded column as bytes (None where null)."""
    data, offsets, present = column
    view = memoryview(data).cast("B")
    out: list[bytes | None] = []
    for p in positions.tolist():
        if present is not None and not present[p]:
            out.append(None)
        else:
            out.append(bytes(view[int(offsets[p]) : int(offsets[p + 1])]))
    return out


def _fill_value(name: str, kind: ColumnKind, value: FillValue) -> Any:
    """`value` as a scalar of the column's dtype, which must hold it exactly
    (a bool for a bool column, an integer in range for an integer column, a
    number for a float column)."""
    assert kind.dtype is not None
    dtype = np.dtype(kind.dtype)
    flag = isinstance(value, bool | np.bool_)
    fits = False
    if dtype.kind == "b":
        fits = flag
    elif dtype.kind in "iu":
        if isinstance(value, int | np.integer) and not flag:
            info = np.iinfo(dtype)
            fits = info.min <= int(value) <= info.max
    elif dtype.kind == "f":
        fits = isinstance(value, int | float | np.integer | np.floating) and not flag
    if not fits:
        raise ValueError(
            f"fill_null: {value!r} is not a value of column {name!r} ({kind.type_name})"
        )
    return dtype.type(value)


def _image_tensor(column: Any, opts: dict[str, Any]) -> Any:
    def one(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.view(torch.bfloat16) if opts.get("dtype") == "bfloat16" else t

    if isinstance(column, np.ndarray):
        return one(column)
    return [one(a) for a in column]
