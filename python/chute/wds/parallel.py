"""A WebDataset epoch whose Python stages run on worker processes.

Every worker runs an engine over the same plan as the loader would (same
shards, seeds, shuffle, batch formation), so every worker forms every
engine batch, but it decodes and delivers only its own: batch ``b`` is
worker ``b % num_workers``'s (``StreamPlan.deliver_stride``). A worker turns
its batches into items as the loader would (`BatchConverter`), runs the
leading Python stages that keep no state across items (``map``,
``select``, a decode in Python, ...) on them, and sends them back through
shared memory. The loader takes the workers' results in batch order, so
its items, their order and its resumable position are those of the same
epoch without workers; the stages that keep state (``batched``,
``shuffle``, ``compose``, ...) and the loader's own collation run in the
loader's process, after them.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chute import _core
from chute.common.errors import engine_errors
from chute.common.handlers import Handler
from chute.common.stage_clock import StageClock
from chute.common.stats import add_figures
from chute.common.torch_collate import torch_collate
from chute.loader.protocol import LoaderSettings
from chute.stream.compiler import (
    CompiledPipeline,
    error_handlers,
    native_torch_batch,
)
from chute.stream.convert import DROPPED, BatchConverter
from chute.stream.native import EngineSettings, report_skips
from chute.stream.stages import PythonRun, Stage
from chute.wds.resume import StreamPosition, check_resume_reached
from chute.wds.run import EpochRun, decodes_in_python, member_failure
from chute.wds.runnable import RunnableDataset
from chute.workers.failures import Failure, caught_warnings
from chute.workers.main import Outgoing
from chute.workers.transport import pack

if TYPE_CHECKING:
    from chute.workers.main import WorkerContext
    from chute.workers.pool import WorkerPool

# What every worker's plan takes from the loader's rather than working out
# on its own: the DDP batch count the ranks agreed on, an elastic resume's
# share of the samples, and what that share changes.
PLAN_FIELDS = (
    "max_batches",
    "max_samples",
    "repeat_to_limit",
    "repeat",
    "sample_ranges",
    "shuffle_shards",
    "resampled",
    "num_streams",
    "seed",
)

# Figures that every worker's engine counts for the whole plan (each reads
# every shard): the loader reports one worker's. The others are the
# worker's own share, added up.
_EVERY_WORKER = frozenset(
    {
        "shards_opened",
        "samples_read",
        "encoded_bytes",
        "read_seconds",
        "shuffle_bytes",
        "shuffle_peak_bytes",
        "shuffle_peak_samples",
    }
)


def worker_stage_count(compiled: CompiledPipeline) -> int:
    """How many of the Python stages, from the first, workers run: those
    that take one item and give at most one, keeping nothing across items,
    are the same whether they see a whole epoch or batch by batch."""
    count = 0
    for stage in compiled.python_stages:
        if not stage.itemwise:
            break
        count += 1
    return count


def has_worker_work(compiled: CompiledPipeline) -> bool:
    """Whether workers would take Python work off the loader."""
    return worker_stage_count(compiled) > 0 or decodes_in_python(compiled)


@dataclass(frozen=True)
class StreamTask:
    """One pass over the shards, as a worker runs its part of it."""

    urls: list[str]
    worker: int  # the torch worker the loader runs in (for the engine's seed)
    rank: int
    epoch: int
    pass_index: int
    skip_batches: int
    skip_rows: int
    shuffle_seed: int | None
    extensions: list[str] | None  # the first sample's, when the loader looked
    torch_batch: tuple[int, bool] | None  # the engine makes torch's batches (size, drop_last)
    plan: dict[str, Any]  # the loader's plan's values of PLAN_FIELDS
    stages: int  # Python stages the worker runs
    threads: int
    timeout: float


class WorkerEpochRun(EpochRun):
    """`EpochRun` with the engine and the item-wise Python stages on the
    workers of `pool`."""

    default_collate: Callable[[list[Any]], Any] = staticmethod(torch_collate)

    def __init__(
        self,
        dataset: RunnableDataset,
        epoch: int,
        settings: EngineSettings,
        loader: LoaderSettings | None,
        resume: StreamPosition | None,
        pool: WorkerPool,
    ) -> None:
        self.pool = pool
        self.worker_figures: dict[int, dict[str, Any]] = {}
        super().__init__(dataset, epoch, settings, loader, resume)
        self.worker_stages = worker_stage_count(self.compiled)
        self.local_stages = self.compiled.python_stages[self.worker_stages :]
        self.python_work = bool(self.local_stages) or self.python_batching

    def current_figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for figures in self.worker_figures.values():
            shared = {k: v for k, v in figures.items() if k in _EVERY_WORKER}
            for key, value in shared.items():
                out[key] = max(out.get(key, 0), value)
            out = add_figures(out, {k: v for k, v in figures.items() if k not in shared})
        return out

    def _native_items(self, pass_index: int, skip_batches: int, skip_rows: int) -> Iterator[Any]:
        compiled = self.compiled
        with engine_errors():
            # The loader's plan, for what the workers must not work out on
            # their own (PLAN_FIELDS).
            plan = self.dataset.make_plan(
                compiled,
                self.urls,
                self.worker,
                self.rank,
                self.position.epoch,
                pass_index,
                self.settings,
                self.handlers,
            )
            if self.elastic is not None:
                self.elastic.configure(plan)
        task = StreamTask(
            urls=self.urls,
            worker=self.worker,
            rank=self.rank,
            epoch=self.position.epoch,
            pass_index=pass_index,
            skip_batches=skip_batches,
            skip_rows=skip_rows,
            shuffle_seed=compiled.shuffle[2] if compiled.shuffle else None,
            extensions=self.sample_extensions,
            torch_batch=(compiled.batch_size or 0, not compiled.partial)
            if compiled.torch_collate
            else None,
            plan={name: getattr(plan, name) for name in PLAN_FIELDS},
            stages=self.worker_stages,
            threads=self.pool.threads,
            timeout=self.settings.timeout,
        )
        pool = self.pool
        tag = pool.new_task("stream", task, pool.prefetch)
        # The workers' engines do not pin: the loader pins their arenas.
        pin = self.settings.pin_memory
        position = self.position
        batched = compiled.batch_size is not None
        absolute = skip_batches
        try:
            while True:
                worker = absolute % pool.num_workers
                started = time.perf_counter()
                message = pool.receive(worker, tag, self.settings.timeout)
                self.figures.wait_seconds += time.perf_counter() - started
                if message[0] == "error":
                    failure: Failure = message[2]
                    failure.reraise()
                body = message[2]
                for caught in body["warnings"]:
                    caught.reissue()
                self.worker_figures[worker] = body["stats"]
                self.figures.python_items += body["python_items"]
                self.figures.python_skipped += body["python_skipped"]
                self.figures.python_seconds += body["python_seconds"]
                self.figures.worker_busy_seconds += body["busy_seconds"]
                self.figures.worker_active_seconds += body["active_seconds"]
                if message[0] == "end":
                    self.pass_samples = int(body["stats"]["samples_read"])
                    if body["error"] is not None:
                        body["error"].reraise()
                    check_resume_reached(skip_batches, int(body["formed"]))
                    return
                pool.send(worker, ("credit", tag, 1))
                items = pool.unpack(worker, body["items"], pin)
                rows: list[int | None] = body["rows"]
                if batched:
                    position.batches += 1
                for i in range(len(items)):
                    row = rows[i]
                    if row is not None:
                        position.rows = row + 1
                    item, items[i] = items[i], None
                    yield item
                    # Hold no batch while the next one is awaited.
                    del item
                del items
                if not batched:
                    position.batches += 1
                    position.rows = 0
                if body["error"] is not None:
                    body["error"].reraise()
                if body["stop"]:
                    return
                absolute += 1
        finally:
            if pool.alive:
                pool.stop_task(tag)
            self.figures.finished = add_figures(
                self.figures.finished, self.current_figures(), gauges="replace"
            )
            self.worker_figures = {}


def stream_task(
    dataset: RunnableDataset, task: StreamTask, context: WorkerContext
) -> Iterator[Outgoing]:
    """A worker's part of one pass: for each of its engine batches, the
    items the loader would make of it after the worker's Python stages."""
    compiled = dataset.compile_pipeline(
        lambda: task.extensions or [], seed=dataset.seed, shuffle_seed=task.shuffle_seed
    )
    if task.torch_batch is not None:
        batching = native_torch_batch(compiled, *task.torch_batch, single_pass=True)
        assert batching is not None
        compiled = batching
    handlers = error_handlers(compiled.native_stages, dataset.handler)
    settings = EngineSettings(threads=task.threads, prefetch=None, timeout=task.timeout)
    # The loader agreed on the DDP batch count (task.max_batches): this
    # copy of the dataset must not try to on its own.
    dataset.even_batches = "off"
    with engine_errors():
        plan = dataset.make_plan(
            compiled,
            task.urls,
            task.worker,
            task.rank,
            task.epoch,
            task.pass_index,
            settings,
            handlers,
        )
        for name, value in task.plan.items():
            setattr(plan, name, value)
        # Every row's key, for the error that names the sample a Python
        # stage failed on (or whose result could not be sent).
        plan.collect_keys = True
        plan.skip_batches = task.skip_batches
        plan.deliver_stride = context.num_workers
        plan.deliver_offset = context.index
        engine = _core.StreamEngine(plan)
    counts = {"python_items": 0, "python_skipped": 0}
    clock = StageClock()

    def on_failure(error: BaseException) -> bool:
        counts["python_skipped"] += 1
        return member_failure(handlers.member, error)

    def count(n: int) -> None:
        counts["python_items"] += n

    converter = BatchConverter(compiled, task.urls, on_failure)
    stages = compiled.python_stages[: task.stages]
    # The first batch of the pass that is this worker's.
    absolute = task.skip_batches + (context.index - task.skip_batches) % context.num_workers
    # This worker's Python thread at work: from each resume to the next
    # yield, less the waits for its engine (the waits to send are outside).
    # Its active time runs from the task's start (not the pool's: a
    # worker's start-up is no part of its stages' share).
    resumed = reported = time.perf_counter()
    try:
        while True:
            engine_wait = 0.0
            rows: list[int | None] = []
            items: list[Any] = []
            at: list[int | None] = [None]  # the row the stages work on
            origin: Callable[[int | None], str] = _no_origin
            error = None
            stop = end = False
            with warnings.catch_warnings(record=True) as records:
                warnings.simplefilter("always")
                try:
                    asked = time.perf_counter()
                    with engine_errors():
                        batch = engine.next(task.timeout)
                    engine_wait = time.perf_counter() - asked
                    stop = report_skips(engine, handlers)
                    if batch is None:
                        end = True
                    else:
                        origin = _origins(batch, task.urls)
                        skip = task.skip_rows if absolute == task.skip_batches else 0
                        inputs = _inputs(converter, batch, compiled.batch_size is not None, skip)
                        del batch
                        stop = _run_stages(
                            inputs, stages, count, dataset.handler, rows, items, at, clock
                        ) or (stop or converter.stopped)
                except Exception as exc:  # noqa: BLE001 - raised by the loader in its place
                    error = Failure.capture(exc, f"{context.where} at {origin(at[0])}")
            body: dict[str, Any] = {
                "error": error,
                "warnings": caught_warnings(records),
                "stats": engine.stats(),
                "formed": engine.batches_formed(),
                **counts,
                "python_seconds": clock.take(),
            }
            counts = dict.fromkeys(counts, 0)
            if end:
                now = time.perf_counter()
                body["busy_seconds"] = now - resumed - engine_wait
                body["active_seconds"] = now - reported
                yield Outgoing(("end", context.tag, body))
                return
            packed, fd = pack(items, context.arenas)
            del items
            body.update(items=packed, rows=rows, stop=stop)
            now = time.perf_counter()
            body["busy_seconds"] = now - resumed - engine_wait
            body["active_seconds"] = now - reported
            reported = now
            yield Outgoing(
                ("chunk", context.tag, body), fd, functools.partial(_item_origin, origin, rows)
            )
            resumed = time.perf_counter()
            if error is not None or stop:
                return
            absolute += context.num_workers
    finally:
        engine.close()


def _item_origin(origin: Callable[[int | None], str], rows: list[int | None], item: int) -> str:
    return origin(rows[item])


def _no_origin(row: int | None) -> str:
    return "the start of its pass"


def _origins(batch: Any, urls: list[str]) -> Callable[[int | None], str]:
    """Where a row of `batch` came from ("shard URL, sample key KEY"; for
    the whole batch, None: its shards)."""
    keys = _core._batch_keys(batch)
    sources = list(batch.source_indices())

    def origin(row: int | None) -> str:
        if row is None or row >= len(sources):
            shards = sorted({urls[i] for i in sources})
            return f"a batch of shard{'s' if len(shards) > 1 else ''} {', '.join(shards)}"
        key = f", sample key {keys[row]!r}" if row < len(keys) else ""
        return f"shard {urls[sources[row]]}{key}"

    return origin


def _inputs(
    converter: BatchConverter, batch: Any, batched: bool, skip_rows: int
) -> Iterator[tuple[int | None, Any]]:
    """What the loader's epoch makes of one engine batch before the Python
    stages, with each item's row (None for a whole batch)."""
    if batched:
        out = converter.batch(batch) if batch.size else None
        del batch
        if out is not None:
            yield None, out
        return
    for i, row in enumerate(converter.rows(batch)):
        if i >= skip_rows and row is not DROPPED:
            yield i, row


def _run_stages(
    inputs: Iterator[tuple[int | None, Any]],
    stages: list[Stage],
    count: Callable[[int], None],
    handler: Handler,
    rows: list[int | None],
    items: list[Any],
    current: list[int | None],
    clock: StageClock,
) -> bool:
    """Appends to `items` what `stages` make of `inputs`, and to `rows` the
    row each came from; True when a stage's handler ended the iteration.
    ``current[0]`` is the row of the item the stages work on."""
    exhausted = [False]

    def source() -> Iterator[Any]:
        for row, item in inputs:
            current[0] = row
            yield item
        exhausted[0] = True

    out: Iterator[Any] = clock.source(source())
    in_python = PythonRun(count, handler)
    for stage in stages:
        out = stage.apply(out, in_python)
    out = clock.stages(out)
    # Each stage takes one item and gives at most one: an item comes from
    # the row the source gave last.
    for item in out:
        rows.append(current[0])
        items.append(item)
    return not exhausted[0]
