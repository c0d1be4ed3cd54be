"""How a `BlockDataset`'s blocks are read and held: `HeldBlocks` (the
blocks one process holds, read on reader threads ahead of the batches,
within a byte bound) and `BlockEngine` (the native engine of one
iteration, pinning each batch's blocks while it is in flight).
`BlockReaders` (the reader threads, and how they end) and `read_ahead`
(how far ahead of the batches they read) serve ``ParquetDataset``'s
row-group holder too."""

from __future__ import annotations

import concurrent.futures
import functools
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from chute.common.errors import SkippedSamples
from chute.common.interpreter_exit import park_if_exiting
from chute.sources import reader_threads

# Threads reading blocks.
READERS = 4


class ReadBlock(Protocol):
    """What the holder asks of a block read (``chute.datasets.blocks.Block``)."""

    rows: int
    nbytes: int

    def encoded(self, column: str) -> Any: ...

    def check(self) -> None: ...


class BlockOwner(Protocol):
    """What the holder and the engine ask of their dataset (a ``BlockDataset``)."""

    _decoded: dict[str, str]
    _cache_bytes: int
    _readahead: int

    def _as_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def blocks_of(self, idx: np.ndarray) -> np.ndarray: ...

    def read_block(self, block: int) -> Any: ...

    def check_block_rows(self, block: int, rows: int) -> None: ...

    def gather(
        self, blocks: dict[int, Any], idx: np.ndarray, block_of: np.ndarray
    ) -> dict[str, Any]: ...


class BlockHolder(Protocol):
    """What `BlockReaders` asks of the holder they read for."""

    def serve(self, request: Any) -> bool:
        """Reads what `request` asks for; False ends the reader."""


class BlockReaders:
    """The reader threads of one holder of blocks (``chute.sources.reader_threads``:
    daemon threads, ended at exit): started as requests are queued, at most
    `READERS`, each serving the holder's requests in order until told to
    stop, the process exits or the holder is gone. They end with the
    dataset: blocks read ahead for a dataset gone are of no use. Neither
    they nor the finalizer hold the holder: a failed read's traceback holds
    the dataset, which a reference from a live thread (or from the
    finalizer) would keep forever."""

    def __init__(self, holder: BlockHolder, dataset: object, thread_name: str) -> None:
        self._holder = weakref.ref(holder)
        self._thread_name = thread_name
        self._requests: _Requests = queue.SimpleQueue()
        self._readers: list[threading.Thread] = []
        weakref.finalize(dataset, _stop_readers, self._requests, self._readers)

    def submit(self, requests: list[Any]) -> None:
        """Queues `requests` (in order) and starts readers for them, with the
        holder's lock held."""
        for request in requests:
            self._requests.put(request)
        for _ in range(min(len(requests), READERS - len(self._readers))):
            self._readers.append(
                reader_threads.start_reader(
                    _serve,
                    (self._requests, self._holder),
                    self._thread_name,
                    functools.partial(self._requests.put, None),
                )
            )


class ReadAheadDataset(Protocol):
    """What `read_ahead` asks of a dataset."""

    def _as_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def blocks_of(self, idx: np.ndarray) -> np.ndarray: ...


def read_ahead(
    index_batches: Iterable[Sequence[int]],
    dataset: ReadAheadDataset,
    prefetch: Callable[[list[int]], int],
    readahead: int,
) -> Iterator[Sequence[int]]:
    """`index_batches`, with the blocks of the next ones read ahead
    (`prefetch` starts the reads of those not held nor being read and says
    how many it started): as many batches as their new blocks stay within
    `readahead`."""
    window: list[tuple[Sequence[int], int]] = []  # batch, blocks it starts reading
    reading = 0
    for indices in index_batches:
        idx = dataset._as_indices(indices)
        try:
            blocks = np.unique(dataset.blocks_of(idx)).tolist()
        except IndexError:
            blocks = []  # submitting the batch raises, naming the bad index
        started = prefetch(blocks)
        window.append((indices, started))
        reading += started
        while window and (reading > readahead or len(window) > 64):
            batch, begun = window.pop(0)
            reading -= begun
            yield batch
    for batch, _ in window:
        yield batch


@dataclass
class Skipped:
    """The rows of a batch the handler skipped: which were kept, and the
    errors of the others."""

    kept: np.ndarray  # bool, one per row asked for
    errors: list[Exception]


def kept_rows(columns: dict[str, Any], kept: np.ndarray) -> dict[str, Any]:
    """`columns` (tensors and lists, one value per row) of the rows `kept`."""
    keep = torch.from_numpy(kept)
    return {
        name: value[keep]
        if isinstance(value, torch.Tensor)
        else [v for v, k in zip(value, kept.tolist(), strict=True) if k]
        for name, value in columns.items()
    }


class BlockEngine:
    """The native engine of one iteration, with the blocks each batch in
    flight holds and the columns gathered for it in Python.

    A batch submitted pins its blocks (their reads start on the reader
    threads) and waits for nothing: the consumer's wait for a block is in
    `next`, bounded by its timeout. Batches reach the native engine in
    submission order, each once its blocks are read."""

    def __init__(self, engine: Any, held: HeldBlocks, dataset: BlockOwner) -> None:
        self._engine = engine
        self._held = held
        # The dataset holds its engines: they hold it weakly, so that a
        # dataset dropped ends its threads at once, not at a later collection.
        self._dataset = weakref.proxy(dataset)
        self._pending: list[_Batch] = []
        self._native = bool(dataset._decoded)
        self._skipped = SkippedSamples()
        # Without a decoded column the engine never sees a batch: counted here.
        self._python_batches = 0
        self._python_samples = 0

    def submit(self, idx: np.ndarray, epoch: int) -> None:
        block_of = self._dataset.blocks_of(idx)
        unique = np.unique(block_of).tolist()
        self._pending.append(_Batch(idx, block_of, epoch, self._held.pin(unique)))
        self._settle_ready()

    def _settle_ready(self) -> None:
        """Settles, in order, the batches whose blocks are all read."""
        for batch in self._pending:
            if batch.settled:
                continue
            if not all(read.done() for read in batch.reads.values()):
                return
            self._settle(batch)

    def _settle(self, batch: _Batch) -> None:
        """Takes the blocks of `batch` (all read) and gathers its columns,
        handing it to the engine; a block that failed to read fails the
        batch when it is next (the batches before it come first)."""
        batch.settled = True
        try:
            batch.blocks = self._held.take(batch.reads)
        except Exception as error:
            batch.error = error
            batch.reads = {}  # released by `take`
            return
        try:
            batch.columns = self._dataset.gather(batch.blocks, batch.idx, batch.block_of)
            if self._native:
                self._engine.submit(batch.idx, batch.epoch)
        except BaseException as error:
            self._held.release(list(batch.reads))
            batch.reads = {}
            if not isinstance(error, Exception):
                raise
            batch.error = error

    def next(self, timeout: float) -> tuple[Any, Skipped | None, dict[str, Any]]:
        """The oldest batch: the engine's, the rows the handler skipped in it
        (None if none) and the columns gathered in Python."""
        deadline = time.monotonic() + timeout if timeout > 0 else None
        oldest = self._pending[0]
        if not oldest.settled:
            for read in oldest.reads.values():
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    read.exception(timeout=left)
                except concurrent.futures.TimeoutError:
                    # Still in flight: its blocks stay pinned and read on.
                    raise TimeoutError(
                        f"no batch within the timeout of {timeout:g} s: a block it "
                        "needs is still being read"
                    ) from None
            # A wait that exit ended (it cancels the reads) stops here, as
            # the engines' native waits do (chute.common.interpreter_exit).
            park_if_exiting()
            self._settle_ready()
        if oldest.error is not None:
            self._finish_oldest()  # it was never submitted to the engine
            raise oldest.error
        try:
            if self._native:
                # What the wait for its blocks left of the timeout (0: none).
                left = 0.0 if deadline is None else max(1e-3, deadline - time.monotonic())
                native = self._engine.next(left)
            else:
                native = None
        except TimeoutError:
            raise  # still in flight: its blocks stay held
        except BaseException:
            self._finish_oldest()  # a file cut is the better explanation
            raise
        idx, columns = self._finish_oldest()
        if not self._native:
            self._python_batches += 1
            self._python_samples += len(idx)
        if native is None or native.size == len(idx):
            return native, None, columns
        kept = np.isin(idx, np.asarray(native.keys(), dtype=np.int64))
        dropped = idx[~kept].tolist()
        errors = self._skipped.of_batch(self._engine.take_skipped(), dropped, len(dropped))
        return native, Skipped(kept, errors), kept_rows(columns, kept)

    def _finish_oldest(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The oldest batch left the engine: its blocks are released, once
        checked (`Block.check`); returns its rows and gathered columns."""
        batch = self._pending.pop(0)
        self._held.release(list(batch.reads))
        for block in batch.blocks.values():
            block.check()
        return batch.idx, batch.columns

    def outstanding(self) -> int:
        return len(self._pending)

    def set_active_threads(self, threads: int, in_flight: int) -> None:
        self._engine.set_active_threads(threads, in_flight)

    def stats(self) -> Any:
        figures = self._engine.stats()
        if not self._native:
            figures["batches"] += self._python_batches
            figures["samples_yielded"] += self._python_samples
        return figures

    def close(self) -> None:
        self._engine.close()
        for batch in self._pending:
            self._held.release(list(batch.reads))
        self._pending.clear()


@dataclass(eq=False)
class _Batch:
    """A batch in flight: its rows, the reads of the blocks it pins, and
    once settled (its blocks read) the blocks and gathered columns, or the
    error its blocks' read raised."""

    idx: np.ndarray
    block_of: np.ndarray
    epoch: int
    reads: dict[int, Future[ReadBlock]]  # pinned until released
    settled: bool = False
    blocks: dict[int, ReadBlock] = field(default_factory=dict)
    columns: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None


class HeldBlocks:
    """The blocks one process holds: read on a few reader threads ahead of
    the batches (``chute.sources.reader_threads``: daemon threads, ended at
    exit), handed to the native source, kept while a batch in flight needs
    them, and the least recently used beyond the byte bound dropped."""

    def __init__(self, dataset: BlockOwner, source: Any) -> None:
        self._dataset = weakref.proxy(dataset)  # as `BlockEngine`'s
        self._source = source
        self._native = bool(dataset._decoded)
        self._readers = BlockReaders(self, dataset, "chute-blocks")
        self._lock = threading.Lock()
        self._loading: dict[int, Future[ReadBlock]] = {}
        self._blocks: OrderedDict[int, ReadBlock] = OrderedDict()
        self._pins: dict[int, int] = {}
        self.held_bytes = 0
        self.reads = 0

    def _load(self, block: int) -> ReadBlock:
        dataset = self._dataset
        read: ReadBlock = dataset.read_block(block)
        dataset.check_block_rows(block, read.rows)
        if self._native:
            self._source.put(block, [read.encoded(name) for name in dataset._decoded])
        return read

    def prefetch(self, blocks: Iterable[int]) -> int:
        """Starts reading those of `blocks` neither held nor being read;
        returns how many."""
        with self._lock:
            return self._start_reads(blocks)

    def _start_reads(self, blocks: Iterable[int]) -> int:
        """Queues the reads of those of `blocks` neither held nor being
        read (with the lock held); returns how many."""
        requests: list[tuple[int, Future[ReadBlock]]] = []
        for b in blocks:
            if b not in self._blocks and b not in self._loading:
                read: Future[ReadBlock] = Future()
                self._loading[b] = read
                requests.append((b, read))
        self.reads += len(requests)
        self._readers.submit(requests)
        return len(requests)

    def serve(self, request: tuple[int, Future[ReadBlock]]) -> bool:
        """A reader's read of one block, into its future."""
        block, read = request
        if read.set_running_or_notify_cancel():
            try:
                read.set_result(self._load(block))
            except Exception as error:
                read.set_exception(error)
        return True

    def pin(self, blocks: list[int]) -> dict[int, Future[ReadBlock]]:
        """Holds `blocks` (reading those neither held nor being read) until
        `release`; returns the read of each (done for those held)."""
        reads: dict[int, Future[ReadBlock]] = {}
        with self._lock:
            self._start_reads(blocks)
            for b in blocks:
                self._pins[b] = self._pins.get(b, 0) + 1
                held = self._blocks.get(b)
                if held is None:
                    reads[b] = self._loading[b]
                else:
                    reads[b] = Future()
                    reads[b].set_result(held)
                    self._blocks.move_to_end(b)
        return reads

    def take(self, reads: dict[int, Future[ReadBlock]]) -> dict[int, ReadBlock]:
        """The blocks of `reads` (all done, pinned), now held; if one failed
        to read, releases them all and raises its error (a later batch
        needing it reads it again)."""
        out: dict[int, ReadBlock] = {}
        for b, read in reads.items():
            error = read.exception()
            with self._lock:
                if self._loading.get(b) is read:
                    del self._loading[b]
                    if error is None:
                        self._blocks[b] = read.result()
                        self.held_bytes += self._blocks[b].nbytes
                if error is None and b in self._blocks:
                    self._blocks.move_to_end(b)
            if error is not None:
                self.release(list(reads))
                raise error
            out[b] = read.result()
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
            for b in list(self._blocks):
                if self.held_bytes <= self._dataset._cache_bytes:
                    break
                if b in self._pins:
                    continue
                self.held_bytes -= self._blocks.pop(b).nbytes
                dropped.append(b)
        if self._native:
            for b in dropped:
                self._source.drop(b)

    def read_ahead(self, index_batches: Iterable[Sequence[int]]) -> Iterator[Sequence[int]]:
        """`index_batches`, their blocks read ahead (see `read_ahead`)."""
        return read_ahead(index_batches, self._dataset, self.prefetch, self._dataset._readahead)


_Requests = queue.SimpleQueue[Any]  # a holder's requests; None stops a reader


def _stop_readers(requests: _Requests, readers: list[threading.Thread]) -> None:
    """Ends the readers once their reads in progress are done."""
    for _ in readers:
        requests.put(None)


def _serve(requests: _Requests, holder_ref: weakref.ref[BlockHolder]) -> None:
    """A reader: serves the requests until told to stop, the process exits,
    the holder is gone or says to end."""
    while not reader_threads.stopping():
        request = requests.get()
        holder = holder_ref()
        if request is None or holder is None:
            return
        going = holder.serve(request)
        del holder, request  # held only while reading
        if not going:
            return
