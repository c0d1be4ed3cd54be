"""One epoch of a ``WebDataset`` being iterated: its passes over the shards
(one engine each), the Python stages after the native prefix, the figures
of the passes, and torch's batching when a DataLoader asked for it."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import torch
from torch.utils.data import default_convert

from chute import _core
from chute.common.autotune import tuner_for
from chute.common.errors import engine_errors
from chute.common.handlers import (
    Handler,
    reraise_exception,
    warn_and_continue,
)
from chute.common.intraop import one_intraop_thread
from chute.common.stage_clock import StageClock, TimedCall
from chute.common.stats import add_figures, empty_stats, with_running
from chute.common.warning_types import SkippedSampleWarning
from chute.loader.protocol import LoaderSettings
from chute.sources.sample_counts import sample_counter
from chute.sources.shards import rank_and_world_size
from chute.stream.compiler import (
    CompiledPipeline,
    error_handlers,
    native_torch_batch,
)
from chute.stream.convert import DROPPED, BatchConverter, pin_copy
from chute.stream.native import EngineSettings, apply_pin_hooks, report_skips
from chute.stream.stages import PythonRun
from chute.stream.stages.batching import python_batched
from chute.wds.elastic_stream import ElasticRun
from chute.wds.resume import StreamPosition, check_pass_reached, check_resume_reached
from chute.wds.runnable import RunnableDataset

# torch ships default_convert without annotations.
_default_convert: Callable[[Any], Any] = default_convert

EMPTY_MESSAGE = (
    "No samples found in dataset; perhaps you have fewer shards than workers.\n"
    "Turn off using empty_check=False in the WebDataset constructor."
)


@dataclass
class Figures:
    """The consumer's side of an iteration's figures."""

    python_items: int = 0
    python_skipped: int = 0  # samples dropped for members Python could not decode
    wait_seconds: float = 0.0
    python_seconds: float = 0.0  # in the Python stages (those of workers included)
    worker_busy_seconds: float = 0.0  # worker processes' Python threads at work
    worker_active_seconds: float = 0.0  # their time since their tasks started
    finished: dict[str, Any] = field(default_factory=dict)  # engines of earlier passes


class EpochIteration(Iterator[Any]):
    """One epoch of a WebDataset, as its user holds it. The work is done by a
    `EpochRun` that this iterator owns and that holds no reference back to it, so
    dropping the iterator ends the run at once: its engine and threads stop."""

    def __init__(self, run: EpochRun) -> None:
        self.run = run
        self.running = True

    def __next__(self) -> Any:
        if not self.running:
            raise StopIteration
        try:
            if self.run.python_work:
                with one_intraop_thread():
                    return next(self.run.items)
            return next(self.run.items)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Ends this iteration now, from any thread: its engine and threads
        stop, and a next() waiting in another thread (on a stalled server,
        say) returns within the engine's poll interval and raises
        StopIteration."""
        if not self.running:
            return
        self.running = False
        run = self.run
        run.closed = True
        engine = run.engine
        if engine is not None:
            engine.close()  # wakes a next() that waits on it, in any thread
        # Closing the innermost generator ends its engine (the stages wrapping
        # it are dropped with it). A ValueError: it runs in another thread's
        # next(), which the closed engine ends there. No contextlib here:
        # __del__ may run this at exit, after the module's globals are gone.
        try:  # noqa: SIM105
            run.source.close()
        except ValueError:
            pass
        run.dataset.finished_stats = run.stats()

    def __del__(self) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        return self.run.stats()

    def state(self) -> dict[str, Any]:
        return self.run.state()


class EpochRun:
    """The passes of one epoch over the shards (one engine each), the Python
    stages, the epoch's item cap, and torch's batching when a DataLoader
    asked for it. Holds no batch while it waits for the next one."""

    # How the loader's batching collates items when no collate_fn was given.
    default_collate: Callable[[list[Any]], Any] = staticmethod(torch.utils.data.default_collate)

    def __init__(
        self,
        dataset: RunnableDataset,
        epoch: int,
        settings: EngineSettings,
        loader: LoaderSettings | None,
        resume: StreamPosition | None,
    ) -> None:
        self.dataset = dataset
        self.settings = settings
        self.figures = Figures()
        self.stage_clock = StageClock()  # the Python stages this process runs
        self.engine: Any = None
        self.closed = False  # by EpochIteration.close(), maybe from another thread
        self.urls, self.worker = dataset.shard_urls()
        self.rank, _ = rank_and_world_size()
        start = resume if resume is not None else StreamPosition(epoch=epoch, shuffle_seed=None)
        check_pass_reached(start, dataset.repetitions)
        torch_batch = (
            (loader.batch_size, loader.drop_last)
            if loader is not None and loader.batch_size is not None and loader.collate_fn is None
            else None
        )
        self.sample_extensions: list[str] | None = None  # when the compiler asked

        def sample_extensions() -> list[str]:
            self.sample_extensions = dataset.first_sample_extensions(self.urls)
            return self.sample_extensions

        self.compiled = dataset.compile_pipeline(
            sample_extensions, seed=dataset.seed, shuffle_seed=start.shuffle_seed
        )
        native_batch = (
            native_torch_batch(self.compiled, *torch_batch, single_pass=dataset.repetitions == 1)
            if torch_batch is not None
            else None
        )
        if native_batch is not None:
            self.compiled = native_batch
        # The Python stages this process runs (see chute.wds.parallel), and
        # whether Python runs per item here: then each next() follows the
        # one-thread rule (chute.common.intraop).
        self.local_stages = self.compiled.python_stages
        self.python_batching = (
            loader is not None and loader.batch_size is not None and native_batch is None
        )
        self.python_work = (
            bool(self.local_stages) or self.python_batching or decodes_in_python(self.compiled)
        )
        self.handlers = error_handlers(self.compiled.native_stages, dataset.handler)
        self.elastic: ElasticRun | None = None
        if dataset.elastic:
            self.elastic = ElasticRun(
                dataset, self.compiled, epoch, start.recorded_elastic, start.batches
            )
            self.urls = self.elastic.urls
            start = replace(start, batches=self.elastic.skip)
        self.position = StreamPosition(
            epoch=epoch,
            shuffle_seed=self.compiled.shuffle[2] if self.compiled.shuffle else None,
            pass_index=start.pass_index,
            batches=start.batches,
            rows=start.rows,
            items=start.items,
            seed=dataset.seed,
            elastic=self.elastic,
        )
        self.fingerprint = dataset.state_fingerprint()
        if self.elastic is None and start.batches:
            # Before reading, where the shards' indexes tell the pass's length.
            check_resume_reached(start.batches, self._indexed_batches())
        self.pass_samples: int | None = None  # samples the engine read in the last pass
        # Whether the ranks' agreed count held the last pass to nothing: its
        # engine may stop before reading a sample of shards that have some.
        self.pass_held_to_none = False
        self.source: Generator[Any, None, None] = self._passes(start)
        items: Iterator[Any] = self.source
        if dataset.repetitions != 1 and dataset.epoch_items > 0:
            items = islice(items, max(0, dataset.epoch_items - start.items))
        # The default collation, when it runs here, timed (a loader's own
        # collate_fn comes timed by the loader).
        self.collation = TimedCall(self.default_collate)
        if loader is not None:
            items = as_torch_loader(items, loader, native_batch is not None, self.collation)
        self.items = items

    def _indexed_batches(self) -> int | None:
        """The most batches the engine can form in a pass, from the sidecar
        indexes of this process's shards; None when a shard has no current
        index, the engine does not batch, or the shards may be read again
        within a pass (repeat, resampling, DDP's even batch counts)."""
        batch_size = self.compiled.batch_size
        if (
            batch_size is None
            or self.dataset.resampled
            or self.dataset.repeat_shards
            or rank_and_world_size()[1] > 1
        ):
            return None
        samples = 0
        for url in self.urls:
            count = sample_counter(url).indexed_count(url)
            if count is None:
                return None
            samples += count
        return -(-samples // batch_size) if self.compiled.partial else samples // batch_size

    def current_figures(self) -> dict[str, Any]:
        """The engine figures of the running pass."""
        engine = self.engine
        return engine.stats() if engine is not None else {}

    def stats(self) -> dict[str, Any]:
        current = self.current_figures()
        out: dict[str, Any] = empty_stats()
        out.update(with_running(self.figures.finished, [current] if current else []))
        out["samples_skipped"] += self.figures.python_skipped
        out["python_items"] = self.figures.python_items
        out["wait_seconds"] = self.figures.wait_seconds
        out["python_seconds"] = self.figures.python_seconds + max(0.0, self.stage_clock.seconds)
        out["collate_seconds"] = self.collation.seconds
        out["worker_busy_seconds"] = self.figures.worker_busy_seconds
        out["worker_active_seconds"] = self.figures.worker_active_seconds
        return out

    def state(self) -> dict[str, Any]:
        stateful = [s.kind for s in self.compiled.python_stages if s.keeps_state]
        if stateful:
            raise ValueError(
                f"cannot checkpoint mid-epoch: stages {stateful} run in Python and keep state; "
                "put .batched()/.shuffle() where the engine runs them (before any .map)"
            )
        return self.position.as_state(self.fingerprint)

    def _count(self, n: int) -> None:
        self.figures.python_items += n

    def _member_failure(self, error: BaseException) -> bool:
        self.figures.python_skipped += 1
        return member_failure(self.handlers.member, error)

    def _passes(self, start: StreamPosition) -> Generator[Any, None, None]:
        """The epoch's passes over the shards, each through the Python stages
        on its own (webdataset restarts its pipeline for every pass)."""
        dataset = self.dataset
        if self.elastic is not None and self.elastic.segment.num_batches == 0:
            return  # the epoch's samples were all delivered before this run
        if not self.urls:
            # The ranks that have shards agree on a count with this one (a
            # collective): it gives its count, none, before it stops, or
            # they wait for it until the process group's timeout.
            if not dataset.elastic:
                dataset.even_count(self.compiled, [])
            if dataset.empty_check:
                raise ValueError(EMPTY_MESSAGE)
            return
        in_python = PythonRun(self._count, dataset.handler)
        for pass_index in range(start.pass_index, dataset.repetitions):
            resumed = pass_index == start.pass_index
            items: Iterator[Any] = self._native_items(
                pass_index, start.batches if resumed else 0, start.rows if resumed else 0
            )
            if self.local_stages:
                items = self.stage_clock.source(items)
                for stage in self.local_stages:
                    items = stage.apply(items, in_python)
                items = self.stage_clock.stages(items)
            self.pass_samples = None
            count = 0
            for item in items:
                count += 1
                self.position.items += 1
                yield item
                # Hold no batch while the next one is awaited.
                del item
            if self.closed:
                return  # the pass ended because its engine was closed
            if self.pass_samples == 0 and dataset.empty_check and not self.pass_held_to_none:
                raise ValueError(EMPTY_MESSAGE)
            if count == 0:
                return  # a pass that yields nothing would repeat forever
            self.position.next_pass()

    def _native_items(self, pass_index: int, skip_batches: int, skip_rows: int) -> Iterator[Any]:
        dataset = self.dataset
        compiled = self.compiled
        settings = self.settings
        with engine_errors():
            plan = dataset.make_plan(
                compiled,
                self.urls,
                self.worker,
                self.rank,
                self.position.epoch,
                pass_index,
                settings,
                self.handlers,
            )
            if self.elastic is not None:
                self.elastic.configure(plan)
            self.pass_held_to_none = plan.max_batches == 0 or plan.max_samples == 0
            plan.skip_batches = skip_batches
            copy_to_pinned = settings.pin_memory and not apply_pin_hooks(plan)
            engine = _core.StreamEngine(plan)
        self.engine = engine
        if self.closed:
            engine.close()  # closed while this engine was being made
        tuner = tuner_for(settings.threads, int(plan.prefetch_batches), engine)
        converter = BatchConverter(compiled, self.urls, self._member_failure)
        position = self.position
        try:
            while True:
                started = time.perf_counter()
                with engine_errors():
                    batch = engine.next(settings.timeout)
                waited = time.perf_counter() - started
                self.figures.wait_seconds += waited
                if tuner is not None:
                    tuner.observe(waited)
                stop = report_skips(engine, self.handlers)
                if batch is None:
                    check_resume_reached(skip_batches, engine.batches_formed())
                    break
                if compiled.batch_size is not None:
                    position.batches += 1
                    # Rows the handler skipped (in the engine or here) leave
                    # a smaller batch, or none.
                    out = converter.batch(batch) if batch.size else None
                    # While the next batch is awaited only the caller keeps
                    # this one alive: once it lets go, its buffer is free for
                    # the batches being decoded.
                    del batch
                    if out is not None:
                        yield pin_copy(out) if copy_to_pinned else out
                    del out
                else:
                    # Rows are counted as the engine numbered them, so that a
                    # resumed run skips the same ones whatever Python dropped.
                    for i, row in enumerate(converter.rows(batch)):
                        if i < skip_rows:
                            continue
                        position.rows = i + 1
                        if row is not DROPPED:
                            yield row
                        del row
                    del batch
                    skip_rows = 0
                    position.batches += 1
                    position.rows = 0
                if stop or converter.stopped:
                    break
        finally:
            engine.close()
            final = engine.stats()
            self.pass_samples = int(final["samples_read"])
            self.figures.finished = add_figures(self.figures.finished, final, gauges="replace")
            self.engine = None


def member_failure(handler: Handler, error: BaseException) -> bool:
    """A member that failed to decode in Python, for the decode stage's
    `handler`: True skips its sample, False stops; reraise raises it."""
    if handler is reraise_exception:
        raise error
    if handler is warn_and_continue:
        warnings.warn(str(error), SkippedSampleWarning, stacklevel=3)
        return True
    return bool(handler(error))


def decodes_in_python(compiled: CompiledPipeline) -> bool:
    """Whether the engine hands over members that Python decodes."""
    return any(f.extensions and f.native is None and f.decode_name for f in compiled.fields)


def as_torch_loader(
    items: Iterator[Any],
    loader: LoaderSettings,
    native: bool,
    default_collate: Callable[[list[Any]], Any] = torch.utils.data.default_collate,
) -> Iterator[Any]:
    """`items` as torch's DataLoader with `loader`'s settings yields them;
    `native`: the engine already made torch's batches."""
    if loader.batch_size is None:
        return converted_items(items)
    if native:
        return items
    collate = loader.collate_fn or default_collate
    return python_batched(items, loader.batch_size, collate, not loader.drop_last)


def converted_items(items: Iterator[Any]) -> Iterator[Any]:
    """Each item through torch's ``default_convert``, holding none while the
    next is awaited."""
    for item in items:
        converted = _default_convert(item)
        del item
        yield converted
        del converted
