"""The row groups one process of a ``ParquetDataset`` holds (read ahead on a
few threads, kept within a byte bound while no batch needs them) and the
engine of one iteration, which pins them for each batch in flight."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from chute.common.errors import EngineDataError, EngineReadError, SkippedSamples
from chute.datasets.block_reading import BlockReaders, Skipped, read_ahead
from chute.sources.parquet_files import release_unused_memory


class RowGroupDataset(Protocol):
    """What the row groups and the engine ask of their dataset."""

    def _as_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def blocks_of(self, idx: np.ndarray) -> np.ndarray: ...

    def read_block(self, block: int) -> Any: ...

    def native_columns(self, table: Any, block: int) -> list[tuple[Any, np.ndarray, Any]]: ...

    def gather(
        self, tables: dict[int, Any], idx: np.ndarray, blocks: np.ndarray
    ) -> dict[str, Any]: ...


class RowGroupEngine:
    """The native engine of one iteration, with the row groups each batch in
    flight pins and the columns gathered for it in Python once the engine
    has it (its row groups are read by then, or it failed at their read)."""

    def __init__(self, engine: Any, groups: RowGroupCache, dataset: RowGroupDataset) -> None:
        self._engine = engine
        self._groups = groups
        # The dataset holds its engines: they hold it weakly, so that a
        # dataset dropped ends its threads at once, not at a later collection.
        self._dataset = weakref.proxy(dataset)
        self._pending: list[tuple[np.ndarray, np.ndarray, list[int]]] = []
        self._skipped = SkippedSamples()

    def submit(self, idx: np.ndarray, epoch: int) -> None:
        blocks = self._dataset.blocks_of(idx)
        unique = np.unique(blocks).tolist()
        # Their reads start now; the engine's threads wait for them.
        self._groups.pin(unique)
        try:
            self._engine.submit(idx, epoch)
        except BaseException:
            self._groups.release(unique)
            raise
        self._pending.append((idx, blocks, unique))

    def next(self, timeout: float) -> tuple[Any, Skipped | None, dict[str, Any]]:
        """The oldest batch: the engine's, the rows the handler skipped in it
        (None if none) and the columns gathered in Python."""
        try:
            native = self._engine.next(timeout)
        except BaseException:
            # A failed batch was taken; one timed out or interrupted was not.
            while len(self._pending) > self._engine.outstanding():
                self._groups.release(self._pending.pop(0)[2])
            raise
        idx, blocks, unique = self._pending.pop(0)
        try:
            rows, row_blocks, skipped = idx, blocks, None
            if native.size < len(idx):
                kept = np.isin(idx, np.asarray(native.keys(), dtype=np.int64))
                dropped = idx[~kept].tolist()
                errors = self._skipped.of_batch(self._engine.take_skipped(), dropped, len(dropped))
                rows, row_blocks, skipped = idx[kept], blocks[kept], Skipped(kept, errors)
            tables = {b: self._groups.table(b) for b in np.unique(row_blocks).tolist()}
            columns = self._dataset.gather(tables, rows, row_blocks)
        finally:
            self._groups.release(unique)
        return native, skipped, columns

    def outstanding(self) -> int:
        return len(self._pending)

    def set_active_threads(self, threads: int, in_flight: int) -> None:
        self._engine.set_active_threads(threads, in_flight)

    def stats(self) -> Any:
        return self._engine.stats()

    def close(self) -> None:
        self._engine.close()
        for _, _, unique in self._pending:
            self._groups.release(unique)
        self._pending.clear()


class RowGroupCache:
    """The row groups one process holds: read on a few reader threads ahead
    of the batches and handed to the native source (put, or failed with the
    reason), kept while a batch in flight needs them or until the batch they
    were read ahead for comes, and the least recently used beyond the byte
    bound dropped."""

    def __init__(
        self,
        dataset: RowGroupDataset,
        source: Any,
        block_names: Sequence[str],
        cache_bytes: int,
        readahead: int,
    ) -> None:
        self._dataset = weakref.proxy(dataset)  # as `RowGroupEngine`'s
        self._source = source
        self._block_names = block_names
        self._cache_bytes = cache_bytes
        self._readahead = readahead
        self._lock = threading.Lock()
        self._readers = BlockReaders(self, dataset, "chute-parquet")
        self._loading: set[int] = set()
        self._tables: OrderedDict[int, tuple[Any, int]] = OrderedDict()  # block -> (table, bytes)
        self._failed: set[int] = set()  # failed at their read (the source holds why)
        self._ahead: set[int] = set()  # read ahead: kept for the batch they were read for
        self._pins: dict[int, int] = {}
        self.held_bytes = 0
        self.reads = 0

    @property
    def reading(self) -> int:
        """Row groups being read now."""
        with self._lock:
            return len(self._loading)

    def _start_reads(self, blocks: Iterable[int]) -> list[int]:
        """Queues the reads of those of `blocks` neither held, failed nor
        being read (with the lock held); returns them."""
        started = []
        for b in blocks:
            if b in self._tables or b in self._loading or b in self._failed:
                continue
            self._loading.add(b)
            self._source.expect(b)
            self.reads += 1
            started.append(b)
        self._readers.submit(started)
        return started

    def prefetch(self, blocks: Iterable[int]) -> int:
        """Starts reading `blocks` ahead of the batches that will pin them;
        returns how many reads it started."""
        with self._lock:
            started = self._start_reads(blocks)
            self._ahead.update(started)
            return len(started)

    def pin(self, blocks: list[int]) -> None:
        """Holds `blocks` for a batch (reading those not held) until `release`."""
        with self._lock:
            for b in blocks:
                self._pins[b] = self._pins.get(b, 0) + 1
                self._ahead.discard(b)
            self._start_reads(blocks)
            for b in blocks:
                if b in self._tables:
                    self._tables.move_to_end(b)

    def table(self, block: int) -> Any:
        """The table of pinned row group `block`, which the engine read."""
        with self._lock:
            return self._tables[block][0]

    def release(self, blocks: list[int]) -> None:
        forget = []
        with self._lock:
            for b in blocks:
                left = self._pins.get(b, 0) - 1
                if left > 0:
                    self._pins[b] = left
                    continue
                self._pins.pop(b, None)
                if b in self._failed:
                    # Read again when next needed: a storage failure may pass.
                    self._failed.discard(b)
                    forget.append(b)
        for b in forget:
            self._source.drop(b)
        self._evict()

    def forget_ahead(self) -> None:
        """An iteration ended: row groups read ahead for its batches to come
        may go."""
        with self._lock:
            self._ahead.clear()
            failed = [b for b in self._failed if b not in self._pins]
            self._failed.difference_update(failed)
        for b in failed:
            self._source.drop(b)
        self._evict()

    def serve(self, request: int) -> bool:
        """A reader's read of row group `request`."""
        try:
            self._load(request)
        except ReferenceError:
            return False  # the dataset is gone
        # What the read allocated for a while (pages, a value buffer
        # while it grew) was freed on this thread.
        release_unused_memory()
        return True

    def _load(self, block: int) -> None:
        """Reads row group `block` and hands it to the source, or why not."""
        try:
            table = self._dataset.read_block(block)
            columns = self._dataset.native_columns(table, block)
        except EngineDataError as e:
            self._settle_failed(block, True, str(e))
            return
        except ReferenceError:
            raise
        except Exception as e:  # the storage failed, or anything else: the row group's read
            name = self._block_names[block]
            text = str(e) if isinstance(e, EngineReadError) else f"{name}: {type(e).__name__}: {e}"
            self._settle_failed(block, False, text)
            return
        with self._lock:
            self._loading.discard(block)
            self._tables[block] = (table, int(table.nbytes))
            self.held_bytes += int(table.nbytes)
        # After the table is recorded: the engine's batch, once it sees the
        # block, gathers the other columns from the table.
        self._source.put(block, columns)
        self._evict()

    def _settle_failed(self, block: int, data: bool, message: str) -> None:
        with self._lock:
            self._loading.discard(block)
            self._failed.add(block)
        self._source.fail(block, data, message)

    def _evict(self) -> None:
        dropped = []
        with self._lock:
            for b in list(self._tables):
                if self.held_bytes <= self._cache_bytes:
                    break
                if b in self._pins or b in self._ahead:
                    continue
                _, nbytes = self._tables.pop(b)
                self.held_bytes -= nbytes
                dropped.append(b)
        for b in dropped:
            self._source.drop(b)
        if dropped:
            release_unused_memory()

    def read_ahead(self, index_batches: Iterable[Sequence[int]]) -> Iterator[Sequence[int]]:
        """`index_batches`, with the row groups of the next ones read ahead:
        as many batches as their new row groups stay within the readahead."""
        try:
            yield from read_ahead(index_batches, self._dataset, self.prefetch, self._readahead)
        finally:
            self.forget_ahead()
