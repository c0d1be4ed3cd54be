"""Map-style datasets whose rows the native engine gathers by index.

`IndexedDataset` is the base of every map-style dataset chute reads (HDF5,
arrays, tar shards, Parquet, Arrow and MDS blocks, tokens, weighted mixes,
splits: each subclass sets its plan). It gives them
torch's map-style protocol (`__len__`, `__getitem__`, and `__getitems__` so
that torch's own DataLoader hands over whole index batches), and
`iter_batches`, the entry point `chute.DataLoader` uses (through
`loader_batches`, see `chute.loader.protocol`): index batches go down to native
threads, finished batches come back in submission order as
`{field: tensor[n, ...]}` whose memory the engine wrote once.

Processes: native state (engine threads, open files, caches) belongs to the
process that created it. A dataset copied into a forked or spawned worker
(torch DataLoader with num_workers > 0) rebuilds its own lazily, and never
touches — or destroys — the parent's.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset

from chute.common.autotune import tuner_for
from chute.common.stats import add_figures, empty_stats, figures_since, with_running
from chute.datasets.indexed_workers import WorkerBatches, indexed_task
from chute.gpu.pinning import pin_hooks
from chute.loader.engine import default_threads, gather_batch, make_indexed_engine, wait_batch
from chute.loader.frameworks import check_foreign_read
from chute.loader.protocol import EngineDataset, LoaderSettings

if TYPE_CHECKING:
    from chute.workers.main import Outgoing, WorkerContext
    from chute.workers.pool import WorkerPool

Batch = dict[str, torch.Tensor]

# The dataset's totals and the engine stats they add up.
# Native objects inherited through fork() from another process. Their threads
# do not exist here and their locks may be held forever, so they must never
# be used or destroyed (destroying an engine joins threads): they are parked
# here for the life of the process.
_ABANDONED: list[object] = []


class ProcessState:
    """Everything native a dataset holds in one process (subclasses keep
    their own native objects in `extra`)."""

    def __init__(self, sources: list[Any], extra: dict[str, Any]) -> None:
        self.pid = os.getpid()
        self.sources = sources
        self.extra = extra  # subclass-owned native/per-process objects
        self.engine: Any = None  # the shared engine behind __getitem(s)__
        self.lock = threading.Lock()
        # Engines of running iter_batches, with their counters at the start.
        self.live: dict[Any, dict[str, Any]] = {}
        # Engines of finished epochs, by (threads, prefetch, pin hooks).
        self.idle: dict[tuple[int, int, tuple[int, int] | None], Any] = {}


class IndexedDataset(Dataset[Batch], EngineDataset):
    """Base for map-style datasets read by the native engine.

    Subclasses provide `field_names()` (output order), `_open_native()`
    (the native sources for the engine-read fields, built in this process)
    and, for fields the engine cannot read, `_read_slow(name, indices)`.
    """

    index_driven: ClassVar[bool] = True
    # True: batches are made by the consumer's own next() (an engine without
    # threads) when the loader has num_workers=0 and in torch's worker
    # processes: worth it where a batch is little more than copies, which
    # hand-offs between threads would cost more than.
    reads_inline: ClassVar[bool] = False
    _proc: ProcessState | None
    _num_threads: int
    _totals: dict[str, Any]  # figures of the engines that finished (chute.common.stats)

    def _init_indexed(self, num_threads: int | None) -> None:
        self._proc = None
        self._num_threads = default_threads() if num_threads is None else max(1, int(num_threads))
        self._totals = empty_stats()

    # -- subclass hooks ------------------------------------------------------------

    def field_names(self) -> list[str]:
        """The fields of a batch, in order."""
        raise NotImplementedError

    def _native_field_names(self) -> list[str]:
        """Fields read by the engine, in the order of `_open_native()`'s sources."""
        raise NotImplementedError

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        raise NotImplementedError

    def _read_slow(self, name: str, indices: np.ndarray) -> np.ndarray:
        raise NotImplementedError(name)

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        return {}

    def _check_rows(self, idx: np.ndarray) -> None:
        """Raises when the rows `idx` the engine just read were not really
        there (a mapped file cut meanwhile reads as zeros)."""

    # -- process-local native state -------------------------------------------------

    def _state(self) -> ProcessState:
        state = self._proc
        if state is not None and state.pid == os.getpid():
            return state
        if state is not None:
            _ABANDONED.append(state)
        sources, extra = self._open_native()
        self._proc = ProcessState(sources, extra)
        return self._proc

    def release_idle_engines(self) -> None:
        """Ends this process's engines that nothing is reading through (the
        one behind ``__getitem__``, those kept from finished epochs); they
        are made again when next needed. Engines of running iterations stay."""
        state = self._proc
        if state is None or state.pid != os.getpid():
            return
        with state.lock:
            # Finished epochs' figures are in the totals already; the shared
            # engine's are counted as running until now.
            engines = list(state.idle.values())
            state.idle.clear()
            shared, state.engine = state.engine, None
        if shared is not None:
            self._add_totals(shared.stats())
            engines.append(shared)
        for engine in engines:
            engine.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_proc"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- map-style protocol ------------------------------------------------------------

    def __len__(self) -> int:
        raise NotImplementedError

    def _one_index(self, index: int) -> np.ndarray:
        """`index` (negative counts from the end) as a one-row index array."""
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for a dataset of length {n}")
        return np.array([i], dtype=np.int64)

    def __getitem__(self, index: int) -> Batch:
        batch = self.read_batch(self._one_index(index))
        return {name: t[0] for name, t in batch.items()}

    def __getitems__(self, indices: Sequence[int]) -> list[Batch]:
        """The whole index batch in one native call.

        Returns what torch's default collate expects, a list of per-row dicts;
        each row tensor is a view into the one batch the engine wrote, so the
        only copy left is collate's stack. chute's own loader never calls
        it: a foreign loader that reads a dataset a chute loader was built
        over, or that reads it under several ranks, is reported
        (chute.loader.frameworks.check_foreign_read).
        """
        check_foreign_read(self, "__getitems__")
        batch = self.read_batch(self._as_indices(indices))
        names = list(batch)
        columns = [batch[name].unbind(0) for name in names]
        return (
            [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
            if names
            else []
        )

    def _as_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0 or idx.min() >= 0:  # the usual case, without a copy
            return idx
        n = len(self)
        # Python's negative indices; anything still out of range keeps its
        # original value so the engine's error names what the caller passed.
        return np.where((idx < 0) & (idx >= -n), idx + n, idx)

    def read_batch(self, idx: np.ndarray) -> Batch:
        """The rows `idx` (int64, in range) as one batch, read by the shared engine."""
        return self._assemble(self._read_native(idx), idx)  # type: ignore[no-any-return]

    def _read_native(self, idx: np.ndarray) -> Any:
        """The engine's result for the rows `idx`, read by the shared engine."""
        state = self._state()
        with state.lock:
            if state.engine is None:
                in_worker = torch.utils.data.get_worker_info() is not None
                threads = self._num_threads if not in_worker else 0 if self.reads_inline else 1
                state.engine = self._make_engine(state, threads, 1, None)
            self._submit(state.engine, idx)
            return self._wait(state.engine, 0.0)

    # -- engine hooks (a dataset whose engine returns more than columns overrides them) --

    def _make_engine(
        self, state: ProcessState, threads: int, in_flight: int, hooks: tuple[int, int] | None
    ) -> Any:
        return make_indexed_engine(state.sources, len(self), threads, in_flight, hooks)

    def _submit(self, engine: Any, idx: np.ndarray) -> None:
        engine.submit(idx)

    def _read_inline(self, engine: Any, idx: np.ndarray) -> Any:
        """An engine without threads (`reads_inline`): `_submit` then
        `_wait`, in one call (a dataset overriding them overrides this)."""
        return gather_batch(engine, idx)

    def _wait(self, engine: Any, timeout: float) -> Any:
        """The engine's next result (for `_assemble`)."""
        return wait_batch(engine, timeout)

    def _pin(self, batch: Any) -> Any:
        """`batch` copied to page-locked memory."""
        return {k: v.pin_memory() for k, v in batch.items()}

    def _assemble(self, arrays: Any, idx: np.ndarray) -> Any:
        self._check_rows(idx)
        native = dict(zip(self._native_field_names(), arrays, strict=True))
        out: Batch = {}
        for name in self.field_names():
            if name in native:
                out[name] = torch.from_numpy(native[name])
            else:
                out[name] = torch.from_numpy(self._read_slow(name, idx))
                self._totals["python_items"] += int(idx.size)
        return out

    # -- streaming -------------------------------------------------------------------------

    def iter_batches(
        self,
        index_batches: Iterable[Sequence[int]],
        num_threads: int,
        prefetch: int,
        timeout: float = 0,
        pin_memory: bool = False,
    ) -> Iterator[Batch]:
        """Yields `{field: tensor[n, ...]}` for each index batch, in order.

        Keeps up to `prefetch` batches submitted ahead of the consumer,
        pulling index batches from `index_batches` lazily (`num_threads` 0:
        no engine threads, each batch is made when the consumer asks for
        it). `timeout` > 0 bounds the wait for one batch (TimeoutError). The engine is shut down
        (threads joined) when the generator finishes, is closed, or is
        collected — breaking out of a loop is enough.
        """
        prefetch = max(1, int(prefetch))
        state = self._state()
        hooks = pin_hooks() if pin_memory else None
        copy_to_pinned = pin_memory and hooks is None and torch.cuda.is_available()
        # An engine that finished an epoch cleanly is kept for the next one:
        # its batch buffers are then reused instead of faulted in afresh.
        key = (max(0, int(num_threads)), prefetch, hooks)
        engine = state.idle.pop(key, None)
        if engine is None:
            engine = self._make_engine(state, key[0], prefetch, hooks)
        stats_before = engine.stats()
        state.live[engine] = stats_before
        clean = False
        tuner = tuner_for(num_threads, prefetch, engine)  # num_workers="auto"

        def submit(indices: Sequence[int]) -> np.ndarray:
            idx = self._as_indices(indices)
            self._submit(engine, idx)
            return idx

        def collect(idx: np.ndarray) -> Any:
            started = time.perf_counter()
            result = self._wait(engine, float(timeout))
            waited = time.perf_counter() - started
            self._totals["wait_seconds"] += waited
            if tuner is not None:
                tuner.observe(waited)
            batch = self._assemble(result, idx)
            return self._pin(batch) if copy_to_pinned else batch

        try:
            if key[0] == 0:
                # No engine threads: each batch is made by one call on this
                # thread; the loop is kept to what each batch needs.
                for indices in index_batches:
                    idx = self._as_indices(indices)
                    started = time.perf_counter()
                    result = self._read_inline(engine, idx)
                    self._totals["wait_seconds"] += time.perf_counter() - started
                    batch = self._assemble(result, idx)
                    del result
                    if copy_to_pinned:
                        batch = self._pin(batch)
                    # Hold no batch while the next one is made.
                    yield batch
                    del batch
            else:
                yield from submitted_ahead(index_batches, prefetch, submit, collect)
            clean = engine.outstanding() == 0
        finally:
            del state.live[engine]
            # The figures before the tuner lets go: its last count is what it chose.
            self._add_totals(engine.stats(), stats_before)
            if tuner is not None:
                tuner.detach()
            if clean and key not in state.idle:
                state.idle[key] = engine
            else:
                engine.close()

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        assert index_batches is not None, "an index-driven dataset reads the sampler's batches"
        if settings.inline_reads and self.reads_inline and settings.collate_fn is None:
            # Each batch as iter_batches makes it, with nothing between.
            yield from self.iter_batches(
                index_batches, 0, 1, settings.timeout, pin_memory=settings.pin_memory
            )
            return
        outputs = self.loader_batch_outputs(settings, index_batches)
        try:
            for results, stop in outputs:
                # Hold no batch while the next one is read.
                while results:
                    out = results.pop(0)
                    yield out
                    del out
                if stop:
                    return
        finally:
            outputs.close()

    def loader_batch_outputs(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]]
    ) -> Generator[tuple[list[Any], bool], None, None]:
        """For each index batch, what the loader yields for it (one batch, or
        none when the handler skipped all its rows) and whether the handler
        asked to end the epoch there."""
        inline = settings.inline_reads and self.reads_inline
        batches = self.iter_batches(
            index_batches,
            num_threads=0 if inline else settings.threads,
            prefetch=1 if inline else settings.prefetch,
            timeout=settings.timeout,
            pin_memory=settings.pin_memory,
        )
        try:
            for batch in batches:
                if settings.collate_fn is None:
                    yield [batch], False
                else:
                    # A custom collate_fn: the documented slow path, rows one by one.
                    n = len(next(iter(batch.values()))) if batch else 0
                    rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
                    yield [settings.collate_fn(rows)], False
                del batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    # -- worker processes (see chute.datasets.indexed_workers) --------------------------------

    def python_work(self, settings: LoaderSettings) -> bool:
        return settings.collate_fn is not None

    def worker_batches(
        self,
        settings: LoaderSettings,
        index_batches: Iterator[Sequence[int]] | None,
        pool: WorkerPool,
    ) -> Iterator[Any]:
        assert index_batches is not None, "an index-driven dataset reads the sampler's batches"
        return WorkerBatches(pool, self, settings, index_batches)

    def worker_task(self, kind: str, spec: Any, context: WorkerContext) -> Iterator[Outgoing]:
        return indexed_task(self, spec, context)

    def worker_epoch(self) -> Any:
        """In the loader, at the start of an epoch on workers: what its
        workers' copies need to know of it (see `enter_worker_epoch`)."""
        return None

    def enter_worker_epoch(self, state: Any) -> None:
        """In a worker: the epoch `state` (from `worker_epoch`) begins."""

    def open_reader(self, num_threads: int, prefetch: int) -> BatchReader:
        """A new engine over this dataset's native sources, driven batch by
        batch (for datasets composed of others); close it when done."""
        return BatchReader(self, num_threads, prefetch)

    # -- stats -------------------------------------------------------------------------------

    def _add_totals(self, s: dict[str, Any], before: dict[str, Any] | None = None) -> None:
        self._totals = add_figures(self._totals, figures_since(s, before), gauges="replace")

    def stats(self) -> dict[str, Any]:
        """The figures of this process's engines over this dataset (README,
        "Stats"), plus the bytes taken from storage (``source_bytes_read``)
        and the source's own (chunk cache, files)."""
        out = dict(self._totals)
        state = self._proc
        if state is None or state.pid != os.getpid():
            return out
        running: list[tuple[Any, dict[str, Any] | None]] = list(state.live.items())
        if state.engine is not None:
            running.append((state.engine, None))
        out = with_running(out, [figures_since(e.stats(), before) for e, before in running])
        out["source_bytes_read"] = sum(int(s.bytes_read) for s in state.sources)
        out.update(self._native_stats(state))
        return out


class BatchReader:
    """One engine over a dataset's native sources: `submit` index batches,
    `collect` them back as batches in submission order."""

    def __init__(self, dataset: IndexedDataset, num_threads: int, prefetch: int) -> None:
        self._dataset = dataset
        self._engine = dataset._make_engine(
            dataset._state(), max(1, int(num_threads)), prefetch, None
        )

    def submit(self, idx: np.ndarray) -> None:
        self._dataset._submit(self._engine, idx)

    def collect(self, idx: np.ndarray, timeout: float) -> Batch:
        """The batch of the oldest submitted `idx`."""
        return self._dataset._assemble(self._dataset._wait(self._engine, timeout), idx)  # type: ignore[no-any-return]

    def bytes_delivered(self) -> int:
        return int(self._engine.stats()["bytes_yielded"])

    def close(self) -> None:
        self._engine.close()


_Submitted = TypeVar("_Submitted")


def submitted_ahead(
    index_batches: Iterable[Sequence[int]],
    prefetch: int,
    submit: Callable[[Sequence[int]], _Submitted],
    collect: Callable[[_Submitted], Batch],
) -> Iterator[Batch]:
    """Keeps up to `prefetch` index batches submitted (`submit`) ahead of the
    consumer, pulling them from `index_batches` lazily, and yields each one's
    result (`collect`) in submission order."""
    pending: deque[_Submitted] = deque()
    source = iter(index_batches)
    exhausted = False
    while True:
        while not exhausted and len(pending) < prefetch:
            try:
                indices = next(source)
            except StopIteration:
                exhausted = True
                break
            pending.append(submit(indices))
        if not pending:
            return
        yield collect(pending.popleft())
