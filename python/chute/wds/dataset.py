"""``WebDataset``: webdataset's pipeline over tar shards, run on the native
engine.

The fluent chain (``.shuffle().decode().rename().to_tuple().batched()``) is
recorded, not executed. When iterated, the longest prefix of the chain that
the engine understands is compiled into a plan; the engine reads, groups,
shuffles, decodes and collates on native threads, and Python only receives
finished batches. Stages after that prefix (``map``, ``select``, a custom
collation, ...) run in Python per sample or per batch: the documented slow
path, counted in ``stats()["python_items"]``.

Each ``iter()`` is an iteration of its own (its own engine, position and
figures), so a dataset can be iterated by two loops, threads or loaders at
once; ``state_dict()`` and ``stats()`` describe the oldest one still running.
"""

from __future__ import annotations

import copy
import os
import random
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, ClassVar

import torch
from torch.utils.data import IterableDataset, default_convert
from typing_extensions import Self

from chute import _core
from chute.engine import default_threads
from chute.errors import engine_errors
from chute.extensions import INT_EXTENSIONS, KEY_FIELD, NATIVE_IMAGE_EXTENSIONS, NPY_EXTENSION
from chute.handlers import Handler, SkippedSampleWarning, reraise_exception, warn_and_continue
from chute.loading import EngineDataset, LoaderSettings
from chute.shards import (
    Splitter,
    apply_splitter,
    expand_urls,
    local_path,
    rank_and_world_size,
    single_node_only,
    split_by_worker,
    worker_and_num_workers,
)
from chute.wds.compiler import (
    CompiledPipeline,
    compile_stages,
    error_handlers,
    native_torch_batch,
)
from chute.wds.convert import DROPPED as _DROPPED
from chute.wds.convert import BatchConverter, pin_copy
from chute.wds.even import EVEN_BATCH_MODES, even_batch_count, indexed_length
from chute.wds.fluent import Fluent
from chute.wds.native import (
    EngineSettings,
    ErrorHandlers,
    apply_pin_hooks,
    field_plan,
    report_skips,
)
from chute.wds.pystages import apply_python_stage, python_batched
from chute.wds.resume import StreamPosition, fingerprint, position_from_state
from chute.wds.stages import STATEFUL_PYTHON_STAGES, Stage

# torch ships default_convert without annotations.
_default_convert: Callable[[Any], Any] = default_convert

# Members a dict sample may have that the engine decodes, whether or not the
# first sample has them (pipe: and remote shards are not opened to look).
NATIVE_MEMBER_EXTENSIONS = [
    *sorted(NATIVE_IMAGE_EXTENSIONS),
    NPY_EXTENSION,
    *sorted(INT_EXTENSIONS),
]

# Engine figures that add up over the passes of an epoch; the "peak" ones
# are maxima, the others describe the running pass.
_ADDITIVE_STATS = frozenset(
    {
        "shards_opened",
        "samples_read",
        "samples_skipped",
        "samples_batched",
        "batches",
        "samples_yielded",
        "encoded_bytes",
        "read_seconds",
        "decode_seconds",
        "arenas_created",
    }
)
# What stats() reports before any iteration (and in a process that never
# iterated, such as a DataLoader's parent when the workers do).
STREAM_STATS_KEYS = (
    "shards_opened",
    "samples_read",
    "samples_skipped",
    "samples_batched",
    "batches",
    "samples_yielded",
    "encoded_bytes",
    "read_seconds",
    "decode_seconds",
    "shuffle_bytes",
    "shuffle_peak_bytes",
    "shuffle_peak_samples",
    "queued_batches",
    "arenas_created",
    "batch_bytes_reserved",
    "batch_bytes_in_use",
    "batch_peak_bytes_reserved",
    "batch_peak_bytes_in_use",
    "batch_bytes_pinned",
    "python_items",
    "wait_seconds",
)

EMPTY_MESSAGE = (
    "No samples found in dataset; perhaps you have fewer shards than workers.\n"
    "Turn off using empty_check=False in the WebDataset constructor."
)


def engine_seed(base_seed: int, rank: int, worker: int, pass_index: int = 0) -> int:
    """The engine's seed for a rank's torch worker in one pass of an epoch:
    ranks and workers read different shards, and the passes of an epoch are
    shuffled anew, so their shuffles and per-image draws (crops, flips)
    differ too."""
    return (base_seed * 1_000_003 + rank * 1009 + worker + pass_index * 7_919_009) & ((1 << 63) - 1)


class WebDataset(Fluent, IterableDataset[Any], EngineDataset):
    """Drop-in for ``webdataset.WebDataset`` that runs on native threads.

    chute-specific keyword arguments:

    - ``threads``: decode threads (default: ``chute.engine.default_threads()``,
      the CPUs this process may run on; one inside a torch DataLoader worker).
    - ``streams``: logical streams (default 1, which keeps webdataset's exact
      single-process order). Shards are dealt round-robin to streams and
      batches are taken from streams in turn; the order depends on the number
      of streams, never on the number of threads.
    - ``prefetch``: batches in flight.
    - ``pipe_timeout``: seconds a ``pipe:`` command may stay silent.
    - ``shuffle_max_bytes``: byte budget of each shuffle buffer (encoded bytes).
    - ``timeout``: seconds to wait for a batch before ``TimeoutError``.
    - ``even_batches``: under DDP (world size > 1) every rank must yield the
      same number of batches, or the collective ops of the short rank's
      peers hang. ``"cap"`` (default) stops every rank after the batch count
      of the rank with the fewest samples; ``"repeat"`` makes every rank yield
      the count of the rank with the most, the shorter ones reading their
      shards again; ``"off"`` leaves counts as they fall. Ranks count their
      samples once (a header scan, cached per shard) and agree through
      ``torch.distributed`` when it is initialised, else by splitting the
      shard list as ``split_by_node`` does.

    ``repeat=True`` (webdataset accepts and ignores it) makes the engine read
    the shard list again and again: one endless pass.

    ``handler`` handles failures to open or read a shard and malformed
    archives; a ``decode``, ``to_tuple`` or ``rename`` stage's own handler
    handles its members that do not decode or samples that lack a field,
    and where such a stage has none, the dataset's handler does.
    """

    index_driven: ClassVar[bool] = False

    def __init__(
        self,
        urls: str | Sequence[str],
        handler: Handler = reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: bool | int | None = None,
        cache_size: int = -1,
        cache_dir: str | os.PathLike[str] | None = None,
        url_to_name: Callable[[str], str] | None = None,
        detshuffle: bool = False,
        nodesplitter: Splitter | None = single_node_only,
        workersplitter: Splitter | None = split_by_worker,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str] | None = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: int | None = None,
        *,
        threads: int | None = None,
        streams: int = 1,
        prefetch: int | None = None,
        pipe_timeout: float = 0.0,
        shuffle_max_bytes: int = 1 << 30,
        timeout: float = 0.0,
        even_batches: str = "cap",
    ) -> None:
        super().__init__()
        if even_batches not in EVEN_BATCH_MODES:
            raise ValueError(f"even_batches must be 'cap', 'repeat' or 'off', not {even_batches!r}")
        self.even_batches = even_batches
        unsupported = {
            "url_to_name": url_to_name,
            "select_files": select_files,
            "rename_files": rename_files,
        }
        for name, value in unsupported.items():
            if value is not None:
                raise ValueError(f"chute.WebDataset does not support {name}= (use a .map stage)")
        if mode not in (None, "resampled"):
            raise ValueError(f"unknown mode {mode!r}")
        resampled = resampled or mode == "resampled"
        if resampled and shardshuffle not in (False, None):
            warnings.warn(
                "WebDataset(shardshuffle=...) is ignored for resampled datasets", stacklevel=2
            )
        elif shardshuffle is None and not resampled:
            warnings.warn(
                "WebDataset(shardshuffle=...) is None; set explicitly to False or a number",
                stacklevel=2,
            )
        if cache_dir is not None:
            cache_dir = os.path.expanduser(os.fspath(cache_dir))
            if not os.path.isdir(cache_dir):
                raise ValueError(f"cache directory {cache_dir} does not exist")
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("no shards given")
        self.handler = handler
        self.resampled = resampled
        self.repeat_shards = repeat
        self.shardshuffle = bool(shardshuffle) and not resampled
        self.cache_dir = cache_dir
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self.empty_check = empty_check
        env_seed = os.environ.get("WDS_SEED")
        if seed is not None:
            self.seed = int(seed)
        elif env_seed is not None:
            self.seed = int(env_seed)
        else:
            self.seed = random.randint(0, 1_000_000)
        self.threads = threads  # None: chosen per iteration, see default_threads
        self.streams = streams
        self.prefetch = prefetch
        self.pipe_timeout = pipe_timeout
        self.shuffle_max_bytes = shuffle_max_bytes
        self.timeout = timeout
        self.stages: list[Stage] = []
        self._epoch = 0
        self._epoch_set = False
        self._resume: StreamPosition | None = None
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        """Per-object runtime state, never shared with copies or pickled."""
        self._iterations: list[weakref.ref[_Iteration]] = []
        self._finished_stats: dict[str, Any] = {}

    def _copy(self) -> Self:
        result = copy.copy(self)
        result._reset_runtime()
        return result

    def with_length(self, n: int | None = None, silent: bool = False) -> Self:
        """``len()`` of the pipeline is `n` (webdataset's, which warns that it
        does not change the epoch unless `silent`); without `n`, the items
        its stages make of every sample, counted from the shards' sidecar
        indexes. Changes this pipeline and returns it, as webdataset does."""
        if n is None:
            self.nominal_length = indexed_length(self.urls, self.stages)
            return self
        return super().with_length(n, silent=silent)

    def __getstate__(self) -> dict[str, Any]:
        # A dataset pickles for spawn/forkserver worker processes even while
        # this process iterates it: engines and live iterations stay here.
        state = self.__dict__.copy()
        state["_iterations"] = []
        state["_finished_stats"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        if self.nominal_length is None:
            raise TypeError("this WebDataset has no length; use .with_length(n)")
        return self.nominal_length

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops every running iteration of this dataset (their engines and
        threads end; a later ``next()`` on them raises StopIteration)."""
        for it in self._live_iterations():
            it.close()

    def set_epoch(self, epoch: int) -> None:
        """Seeds of the shard shuffle and the shuffle buffers derive from the
        epoch. Without a call, each new iteration advances the epoch by one."""
        self._epoch = epoch
        self._epoch_set = True

    def _live_iterations(self) -> list[_Iteration]:
        live = [it for ref in self._iterations if (it := ref()) is not None and it.running]
        self._iterations = [weakref.ref(it) for it in live]
        return live

    def stats(self) -> dict[str, Any]:
        """Figures of the oldest running iteration (else the latest one):
        the engine's counters (samples read, skipped, yielded; busy seconds of
        the read and decode stages; bytes; shuffle-buffer and batch-memory
        bytes, current and peak; batches waiting), plus ``python_items``
        (items through Python stages, the slow path) and ``wait_seconds``
        (time the consumer spent waiting for the engine). Zeros before any
        iteration in this process: inside torch DataLoader worker processes
        each worker's copy of the dataset counts its own."""
        live = self._live_iterations()
        if live:
            return live[0].stats()
        if self._finished_stats:
            return dict(self._finished_stats)
        return dict.fromkeys(STREAM_STATS_KEYS, 0)

    def _fingerprint(self) -> dict[str, Any]:
        return fingerprint(self.urls, self.stages)

    def state_dict(self) -> dict[str, Any]:
        """Where the oldest running iteration stands; ``load_state_dict``
        makes the next iteration resume right after it, with the same order.
        With no iteration running it names the start of the next epoch."""
        live = self._live_iterations()
        if live:
            return live[0].state()
        return self._next_epoch_state()

    def _next_epoch_state(self) -> dict[str, Any]:
        return StreamPosition(epoch=self._epoch, shuffle_seed=None).as_state(self._fingerprint())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next iteration resume at `state` (from ``state_dict``);
        ValueError when it is malformed or comes from another dataset or
        pipeline (shard list, stages, batch size)."""
        self._resume = position_from_state(state, self._fingerprint())

    def loader_state(self, running: Iterator[Any] | None = None) -> dict[str, Any]:
        if isinstance(running, _Iteration) and running.running:
            return running.state()
        return self._next_epoch_state()

    def load_loader_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state)

    # ------------------------------------------------------------------ iteration

    def _first_sample_extensions(self, urls: list[str]) -> list[str]:
        """Member extensions dict samples get native fields for: those of the
        first sample of the first local shard that has one (a cheap look;
        any failure is left for the engine to report in its place), then the
        extensions the engine decodes. pipe: and remote shards are not opened
        twice."""
        found: list[str] = []
        for url in urls:
            if local_path(url) is None:
                continue
            try:
                with engine_errors():
                    members = _core.peek_tar_sample(url, self.cache_dir or "", self.pipe_timeout)
            except (_core.DataError, _core.ReadError):
                continue
            if members is not None:
                found = list(members)
                break
        return found + [e for e in NATIVE_MEMBER_EXTENSIONS if e not in found]

    def _shard_urls(self) -> tuple[list[str], int]:
        urls = apply_splitter(self.nodesplitter, list(self.urls))
        worker_urls = apply_splitter(self.workersplitter, urls)
        worker, _ = worker_and_num_workers()
        if self.resampled and not worker_urls:
            worker_urls = urls  # resampling draws from every shard the node has
        return worker_urls, worker

    def __iter__(self) -> Iterator[Any]:
        return self.iterate()

    def iterate(
        self,
        *,
        threads: int | None = None,
        prefetch: int | None = None,
        timeout: float | None = None,
        pin_memory: bool = False,
        loader: LoaderSettings | None = None,
    ) -> Iterator[Any]:
        """One epoch, with the engine settings overridden for this iteration
        (``chute.DataLoader`` passes its ``num_workers`` here as threads).

        `loader`: yield what torch's DataLoader with these settings would
        (``batch_size=None``: items through torch's ``default_convert``; a
        batch size with the default collate: batches collated by torch's
        rules, by the engine when the pipeline ends in native stages without
        a ``.batched``, else in Python; a ``collate_fn``: it is called on
        lists of items)."""
        resume, self._resume = self._resume, None
        if resume is not None:
            self._epoch = resume.epoch
            self._epoch_set = False
        epoch = self._epoch
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False
        settings = EngineSettings(
            threads=max(1, threads or self.threads or default_threads()),
            prefetch=prefetch if prefetch is not None else self.prefetch,
            timeout=timeout if timeout is not None else self.timeout,
            pin_memory=pin_memory,
        )
        it = _Iteration(_Run(self, epoch, settings, loader, resume))
        self._iterations.append(weakref.ref(it))
        return it

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        return self.iterate(
            threads=settings.threads,
            prefetch=settings.prefetch,
            timeout=settings.timeout,
            pin_memory=settings.pin_memory,
            loader=settings,
        )

    def _make_plan(
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
        plan = _core.StreamPlan()
        plan.urls = urls
        plan.cache_dir = self.cache_dir or ""
        plan.pipe_timeout = float(self.pipe_timeout)
        batched = compiled.batch_size is not None
        native_fields = [f for f in compiled.fields if f.extensions]
        # A field some samples may lack is never stacked: a list column says
        # which rows have it (dict samples are collated from rows anyway).
        plan.fields = [
            field_plan(
                f,
                stack=batched and f.required,
                optional=not f.required,
                decode_opts=compiled.decode_opts,
            )
            for f in native_fields
        ]
        plan.keep_other_members = compiled.keep_others
        plan.collect_keys = not compiled.tuple_output or any(
            f.name == KEY_FIELD for f in compiled.fields
        )
        plan.num_streams = self.streams
        plan.num_threads = settings.threads
        # Upcoming shards parsed at once: parsing is the bottleneck of tiny
        # samples, and one parser per decode thread keeps both fed.
        plan.parse_ahead = min(settings.threads, 4)
        plan.prefetch_batches = (
            settings.prefetch if settings.prefetch is not None else 2 * settings.threads
        )
        plan.resampled = self.resampled
        plan.shuffle_shards = self.shardshuffle
        plan.repeat = self.repeat_shards
        if compiled.shuffle is not None:
            capacity, initial, shuffle_seed = compiled.shuffle
            plan.shuffle_capacity = capacity
            plan.shuffle_initial = initial
            plan.shuffle_max_bytes = self.shuffle_max_bytes
            base_seed = shuffle_seed
        else:
            base_seed = self.seed
        plan.seed = engine_seed(base_seed, rank, worker, pass_index)
        plan.epoch = epoch
        plan.batch_size = compiled.batch_size or 64
        plan.partial = compiled.partial if batched else True
        plan.on_error = handlers.policy
        even = self._even_batch_count(compiled, urls)
        if even is not None:
            plan.max_batches = even
            plan.repeat = True  # a rank short of batches reads its shards again
        return plan

    def _even_batch_count(self, compiled: CompiledPipeline, urls: list[str]) -> int | None:
        """The batch count every rank yields this epoch, or None when ranks
        need not agree (see even_batch_count; a Python stage, several passes
        per epoch or resampling leave the count to the pipeline)."""
        if (
            compiled.batch_size is None
            or compiled.python_stages
            or self.repetitions != 1
            or self.resampled
        ):
            return None
        return even_batch_count(
            self.even_batches,
            compiled.batch_size,
            compiled.partial,
            urls,
            self.urls,
            self.nodesplitter,
            self.cache_dir or "",
            self.pipe_timeout,
        )


@dataclass
class _Figures:
    """The consumer's side of an iteration's figures."""

    python_items: int = 0
    python_skipped: int = 0  # samples dropped for members Python could not decode
    wait_seconds: float = 0.0
    finished: dict[str, Any] = field(default_factory=dict)  # engines of earlier passes


def _combine(finished: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Figures over the passes so far: counters added, peaks the largest,
    the rest as the running pass has them."""
    out = dict(current)
    for key, value in finished.items():
        if key in _ADDITIVE_STATS:
            out[key] = out.get(key, 0) + value
        elif "peak" in key:
            out[key] = max(out.get(key, 0), value)
        else:
            out.setdefault(key, value)
    return out


class _Iteration(Iterator[Any]):
    """One epoch of a WebDataset, as its user holds it. The work is done by a
    `_Run` that this iterator owns and that holds no reference back to it, so
    dropping the iterator ends the run at once: its engine and threads stop."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.running = True

    def __next__(self) -> Any:
        if not self.running:
            raise StopIteration
        try:
            return next(self.run.items)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Ends this iteration now: its engine and threads stop."""
        if not self.running:
            return
        self.running = False
        # Closing the innermost generator ends its engine (the stages
        # wrapping it are dropped with it).
        self.run.source.close()
        self.run.dataset._finished_stats = self.run.stats()

    def __del__(self) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        return self.run.stats()

    def state(self) -> dict[str, Any]:
        return self.run.state()


class _Run:
    """The passes of one epoch over the shards (one engine each), the Python
    stages, the epoch's item cap, and torch's batching when a DataLoader
    asked for it. Holds no batch while it waits for the next one."""

    def __init__(
        self,
        dataset: WebDataset,
        epoch: int,
        settings: EngineSettings,
        loader: LoaderSettings | None,
        resume: StreamPosition | None,
    ) -> None:
        self.dataset = dataset
        self.settings = settings
        self.figures = _Figures()
        self.engine: Any = None
        self.urls, self.worker = dataset._shard_urls()
        self.rank, _ = rank_and_world_size()
        start = resume if resume is not None else StreamPosition(epoch=epoch, shuffle_seed=None)
        torch_batch = (
            (loader.batch_size, loader.drop_last)
            if loader is not None and loader.batch_size is not None and loader.collate_fn is None
            else None
        )
        self.compiled = compile_stages(
            dataset.stages,
            lambda: dataset._first_sample_extensions(self.urls),
            seed=dataset.seed,
            shuffle_seed=start.shuffle_seed,
        )
        native_batch = (
            native_torch_batch(self.compiled, *torch_batch, single_pass=dataset.repetitions == 1)
            if torch_batch is not None
            else None
        )
        if native_batch is not None:
            self.compiled = native_batch
        self.handlers = error_handlers(self.compiled.native_stages, dataset.handler)
        self.position = StreamPosition(
            epoch=epoch,
            shuffle_seed=self.compiled.shuffle[2] if self.compiled.shuffle else None,
            pass_index=start.pass_index,
            batches=start.batches,
            rows=start.rows,
            items=start.items,
        )
        self.fingerprint = dataset._fingerprint()
        self.pass_samples: int | None = None  # samples the engine read in the last pass
        self.source: Generator[Any, None, None] = self._passes(start)
        items: Iterator[Any] = self.source
        if dataset.repetitions != 1 and dataset.epoch_items > 0:
            items = islice(items, max(0, dataset.epoch_items - start.items))
        if loader is not None:
            items = _as_torch_loader(items, loader, native_batch is not None)
        self.items = items

    def stats(self) -> dict[str, Any]:
        engine = self.engine
        current = engine.stats() if engine is not None else {}
        out: dict[str, Any] = dict.fromkeys(STREAM_STATS_KEYS, 0)
        out.update(_combine(self.figures.finished, current))
        out["samples_skipped"] += self.figures.python_skipped
        out["python_items"] = self.figures.python_items
        out["wait_seconds"] = self.figures.wait_seconds
        return out

    def state(self) -> dict[str, Any]:
        stateful = [s.kind for s in self.compiled.python_stages if s.kind in STATEFUL_PYTHON_STAGES]
        if stateful:
            raise ValueError(
                f"cannot checkpoint mid-epoch: stages {stateful} run in Python and keep state; "
                "put .batched()/.shuffle() where the engine runs them (before any .map)"
            )
        return self.position.as_state(self.fingerprint)

    def _count(self, n: int) -> None:
        self.figures.python_items += n

    def _member_failure(self, error: BaseException) -> bool:
        """A member that failed to decode in Python, for the decode stage's
        handler: True skips its sample, False stops; reraise raises it."""
        self.figures.python_skipped += 1
        handler = self.handlers.member
        if handler is reraise_exception:
            raise error
        if handler is warn_and_continue:
            warnings.warn(str(error), SkippedSampleWarning, stacklevel=2)
            return True
        return bool(handler(error))

    def _passes(self, start: StreamPosition) -> Generator[Any, None, None]:
        """The epoch's passes over the shards, each through the Python stages
        on its own (webdataset restarts its pipeline for every pass)."""
        dataset = self.dataset
        if not self.urls:
            if dataset.empty_check:
                raise ValueError(EMPTY_MESSAGE)
            return
        for pass_index in range(start.pass_index, dataset.repetitions):
            resumed = pass_index == start.pass_index
            items: Iterator[Any] = self._native_items(
                pass_index, start.batches if resumed else 0, start.rows if resumed else 0
            )
            for stage in self.compiled.python_stages:
                items = apply_python_stage(stage, items, self._count, dataset.handler)
            self.pass_samples = None
            count = 0
            for item in items:
                count += 1
                self.position.items += 1
                yield item
                # Hold no batch while the next one is awaited.
                del item
            if self.pass_samples == 0 and dataset.empty_check:
                raise ValueError(EMPTY_MESSAGE)
            if count == 0:
                return  # a pass that yields nothing would repeat forever
            self.position.next_pass()

    def _native_items(self, pass_index: int, skip_batches: int, skip_rows: int) -> Iterator[Any]:
        dataset = self.dataset
        compiled = self.compiled
        settings = self.settings
        with engine_errors():
            plan = dataset._make_plan(
                compiled,
                self.urls,
                self.worker,
                self.rank,
                self.position.epoch,
                pass_index,
                settings,
                self.handlers,
            )
            plan.skip_batches = skip_batches
            copy_to_pinned = settings.pin_memory and not apply_pin_hooks(plan)
            engine = _core.StreamEngine(plan)
        self.engine = engine
        converter = BatchConverter(compiled, self.urls, self._member_failure)
        position = self.position
        try:
            while True:
                started = time.perf_counter()
                with engine_errors():
                    batch = engine.next(settings.timeout)
                self.figures.wait_seconds += time.perf_counter() - started
                stop = report_skips(engine, self.handlers)
                if batch is None:
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
                        if row is not _DROPPED:
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
            self.figures.finished = _combine(self.figures.finished, final)
            self.engine = None


def _as_torch_loader(items: Iterator[Any], loader: LoaderSettings, native: bool) -> Iterator[Any]:
    """`items` as torch's DataLoader with `loader`'s settings yields them;
    `native`: the engine already made torch's batches."""
    if loader.batch_size is None:
        return converted_items(items)
    if native:
        return items
    collate = loader.collate_fn or torch.utils.data.default_collate
    return python_batched(items, loader.batch_size, collate, not loader.drop_last)


def converted_items(items: Iterator[Any]) -> Iterator[Any]:
    """Each item through torch's ``default_convert``, holding none while the
    next is awaited."""
    for item in items:
        converted = _default_convert(item)
        del item
        yield converted
        del converted
