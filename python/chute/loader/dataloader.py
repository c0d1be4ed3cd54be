"""``chute.DataLoader``: torch's DataLoader signature, run on the engine.

Datasets that implement ``chute.loader.protocol.EngineDataset`` run on the engine:

- index-driven ones (``H5Dataset``, ``ArrayDataset``): torch's own sampler
  machinery produces the index batches (so the order is torch's, including
  the base-seed draw from ``generator`` that every torch iterator makes
  first), and the engine reads each index batch on native threads.
- the others (``WebDataset``): iterated in this process.

``num_workers`` is the number of native decode threads, unless the dataset
runs Python per sample (``.map`` and other Python stages, members decoded
in Python, a ``collate_fn`` of a map-style dataset): then it is the number
of worker processes that run that Python, each with its own engine (see
``chute.workers`` and the README, "Python stages and worker processes").

Any other dataset is handed to ``torch.utils.data.DataLoader`` unchanged.

Argument checking and ``len()`` are torch's: a torch DataLoader is built with
the same arguments (that spawns nothing until iterated) and consulted.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar, cast

import torch
import torch.utils.data

from chute.common.autotune import AutoThreads, cores_available
from chute.common.interpreter_exit import park_if_exiting
from chute.common.intraop import single_threaded
from chute.common.stage_clock import TimedCall
from chute.common.warning_types import WorkerInitFnWarning
from chute.gpu import pinning
from chute.gpu.device import CudaCopies, DeviceBatches, TransferFigures, handoff_device
from chute.loader import frameworks
from chute.loader.diagnose import ConsumerClock, diagnose, loader_facts, loop_figures
from chute.loader.elastic_sampler import (
    ElasticSampler,
    GlobalOrderSampler,
    Segment,
    check_elastic_state,
    elastic_state,
    sampler_fingerprint,
    segment_after,
)
from chute.loader.epoch_samplers import (
    EpochRandomSampler,
    StreamEpochSampler,
    align_generator,
    resume_for_told_epoch,
)
from chute.loader.index_batches import array_index_batches
from chute.loader.loader_state import (
    STATE_VERSION,
    check_batches_within,
    check_indexed_state,
    check_loader_fingerprint,
    check_state_version,
    get_rng_state,
    set_rng_state,
    state_kind,
)
from chute.loader.loader_workers import LoaderWorkers, python_work
from chute.loader.progress import with_progress
from chute.loader.protocol import EngineDataset, LoaderSettings
from chute.sources.shards import rank_and_world_size
from chute.workers.pool import WorkerPool

logger = logging.getLogger("chute")
_told_fallback = False

_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """Same arguments as ``torch.utils.data.DataLoader`` (and a subclass of
    it: argument checks, attributes, ``len()`` and the ValueError on
    assigning ``batch_size``, ``sampler``... after construction are
    torch's), plus:

    - ``distributed``: partition a map-style dataset across ranks exactly as
      ``torch.utils.data.DistributedSampler(shuffle=shuffle, seed=seed,
      drop_last=drop_last)`` does (shuffling unless ``shuffle=False``, as
      DistributedSampler does); call ``set_epoch`` each epoch. The sampler
      is a ``chute.loader.elastic_sampler.ElasticSampler`` (a DistributedSampler), whose
      position survives a change of world size (see ``state_dict``).
    - ``seed``: the DistributedSampler seed.
    - ``progress``: show a progress bar with samples/s and the current
      bottleneck (tqdm when installed).
    - ``num_workers="auto"`` (chute's datasets): the native threads and
      batches in flight follow the consumer while the epoch runs, bounded by
      the cores this process may use; the batches are those of any fixed
      setting. ``diagnose()`` names what limits the loader (docs/stats.md).

    - ``worker_threads``: native threads of each worker process (default:
      the CPUs this process may use, divided among the workers).
    - ``device``: hand batches over on this CUDA device (``"cuda"``: the
      current one, as ``tensor.to("cuda")``; ``"cuda:N"``), the next batch
      copied on a side stream while the current step runs (``chute.gpu.device``);
      host batches are then page-locked as with ``pin_memory=True``.
      ``None`` or ``"cpu"``: batches stay in host memory. Refused with a
      ValueError where CUDA is not available. ``pin_memory_device`` is
      accepted and ignored, with torch's deprecation warning.

    For chute's datasets without Python work, ``num_workers`` is the number
    of native threads and no worker process is started, so
    ``worker_init_fn`` is not called: it is accepted with a
    ``WorkerInitFnWarning``, once per dataset type (calling it in this
    process would apply per-worker set-up, such as
    ``torch.set_num_threads(1)`` or ``get_worker_info()`` splitting, to the
    main process). With Python work
    (see the module docstring) ``num_workers`` processes run it:
    ``worker_init_fn(worker_id)`` is called in each, ``multiprocessing_context``
    (default: fork while no engine of chute runs in this process, else
    forkserver), ``persistent_workers``, ``prefetch_factor`` (results
    in flight per worker) and ``timeout`` apply as in torch, and the batches,
    their order and ``state_dict()`` are those of ``num_workers=0``. Other
    datasets go through torch's own iterator, worker processes and
    ``worker_init_fn`` included.

    ``state_dict()``/``load_state_dict()`` resume mid-epoch at the next unseen
    batch: the next iteration replays the same order and skips what was seen.
    A state from another dataset, batch size, loader kind or state version, or
    one past the end of its epoch, is refused with a ValueError naming the
    difference. With ``distributed=True`` (or a ``Curriculum`` or weighted
    ``chute.mix`` sampler) the state also holds the epoch's global position,
    the same on every rank, and loads on another world size: the ranks then
    share what is left of the epoch, each sample once, with equal batch
    counts (``chute.loader.elastic_sampler``).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: torch.utils.data.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: torch.utils.data.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        distributed: bool = False,
        seed: int = 0,
        progress: bool = False,
        worker_threads: int | None = None,
        device: str | int | torch.device | None = None,
    ) -> None:
        global _told_fallback
        handoff = handoff_device(device)
        native = dataset if isinstance(dataset, EngineDataset) else None
        auto_threads = auto_thread_count(num_workers, native is not None, type(dataset).__name__)
        # torch's own checks see the bound of "auto" (an int)
        workers = int(auto_threads) if auto_threads is not None else cast(int, num_workers)
        ordered = _own_order(dataset, sampler, batch_sampler, shuffle, distributed, drop_last)
        if ordered is not None:
            sampler, shuffle = ordered, None
        elif distributed and (native is None or native.index_driven):
            # The partition of torch's DistributedSampler, by construction: rank
            # and world size from torch.distributed, else RANK/WORLD_SIZE.
            if sampler is not None or batch_sampler is not None:
                raise ValueError(
                    "distributed=True builds its own DistributedSampler: pass either "
                    "distributed=True or your own sampler/batch_sampler, not both"
                )
            rank, world_size = rank_and_world_size()
            sampler = ElasticSampler(
                dataset,
                num_replicas=world_size,
                rank=rank,
                # DistributedSampler's own default: shuffle unless told not to.
                shuffle=True if shuffle is None else bool(shuffle),
                seed=seed,
                drop_last=drop_last,
            )
            shuffle = None
        elif (
            shuffle
            and sampler is None
            and batch_sampler is None
            and generator is not None
            and native is not None
            and native.index_driven
        ):
            # torch's RandomSampler with a set_epoch that frameworks reach.
            sampler, shuffle = EpochRandomSampler(dataset, generator), None
        with warnings.catch_warnings():
            if native is not None:
                # For chute's datasets num_workers counts native threads, not
                # processes: torch's "too many worker processes" advice is moot.
                warnings.filterwarnings("ignore", message="This DataLoader will create")
            super().__init__(
                dataset,
                batch_size=batch_size,
                shuffle=shuffle,
                sampler=sampler,
                batch_sampler=batch_sampler,
                num_workers=workers,
                collate_fn=collate_fn,
                pin_memory=pin_memory,
                drop_last=drop_last,
                timeout=timeout,
                worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context,
                generator=generator,
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
                pin_memory_device=pin_memory_device,
                in_order=in_order,
            )
        if native is not None and not native.index_driven:
            # torch's sampler of an IterableDataset, with a set_epoch that
            # frameworks (Lightning) reach and that reaches the dataset.
            epoch_sampler = StreamEpochSampler(dataset)
            object.__setattr__(self, "sampler", epoch_sampler)
            if self.batch_sampler is not None:
                self.batch_sampler.sampler = epoch_sampler  # type: ignore[attr-defined]
        if native is not None:
            frameworks.register_owner(dataset, self)
        self.distributed = distributed
        self.progress = progress
        self._accelerate_prepared: bool | None = None
        self._prefetch_view: frameworks.PrefetchView | None = None
        # torch replaces a missing collate_fn by its default; chute batches
        # natively exactly when none was given.
        self._user_collate_fn = collate_fn
        self._timed_collate = TimedCall(collate_fn) if collate_fn is not None else None
        self._auto_threads = auto_threads
        self._clock: ConsumerClock | None = None  # the latest iteration's
        self._transfer: TransferFigures | None = None  # the latest hand-off's
        self._native = native
        self._position: dict[str, Any] | None = None  # the running indexed iteration's
        self._segment: Segment | None = None  # the running iteration's share of the epoch
        self._running: Iterator[Any] | None = None  # the running stream iteration
        self._resume: dict[str, Any] | None = None
        self._told_at_load: int | None = None  # the sampler's epoch when _resume was loaded
        self.worker_threads = worker_threads
        self.device = device
        self._handoff_device = handoff
        self._handoff: DeviceBatches | None = None  # the running iteration's
        self._worker_processes = LoaderWorkers()
        if (
            native is not None
            and worker_init_fn is not None
            and workers > 0
            and not self._python_work(native)
        ):
            _warn_worker_init_fn(type(dataset).__name__)
        if native is None and not _told_fallback:
            _told_fallback = True
            logger.info(
                "chute.DataLoader: %s is not a chute dataset; using torch.utils.data.DataLoader",
                type(dataset).__name__,
            )

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read by ``accelerator.prepare``: True makes it use this loader as
        is (see chute.loader.frameworks.keeps_itself_under_accelerate)."""
        if self._accelerate_prepared is not None:
            return self._accelerate_prepared
        return frameworks.keeps_itself_under_accelerate(self)

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self._accelerate_prepared = bool(value)

    @property
    def threads(self) -> int:
        """Native threads: num_workers, and at least one."""
        return max(1, self.num_workers)

    def set_epoch(self, epoch: int) -> None:
        """Reaches the sampler and the dataset, whichever of them has ``set_epoch``."""
        _reach_set_epoch(self, epoch)

    def _settings(self) -> LoaderSettings:
        return LoaderSettings(
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            collate_fn=self._timed_collate,
            threads=self._auto_threads or self.threads,
            prefetch=self.threads * (self.prefetch_factor or 2),
            timeout=float(self.timeout),
            # The hand-off copies from page-locked memory while a step runs.
            pin_memory=self.pin_memory or self._handoff_device is not None,
            inline_reads=self.num_workers == 0,
        )

    def _python_work(self, native: EngineDataset) -> bool:
        return python_work(native, self._settings())

    @property
    def _pool(self) -> WorkerPool | None:
        return self._worker_processes.pool

    def _done_with(self, pool: WorkerPool | None) -> None:
        self._worker_processes.done_with(pool, self.persistent_workers)

    def close_workers(self) -> None:
        """Ends this loader's worker processes (``persistent_workers`` keeps
        them otherwise until the loader is collected)."""
        self._worker_processes.close()

    def __del__(self) -> None:
        workers = getattr(self, "_worker_processes", None)
        if workers is not None:
            workers.close()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        native = self._native
        if native is not None and self.pin_memory and self.pin_memory_device:
            warnings.warn(  # torch's words (its iterators say this; chute's run here)
                "pin_memory_device is deprecated, the current accelerator will be used as the "
                f"device,ignore pin_memory_device='{self.pin_memory_device}'.",
                stacklevel=2,
            )
        frameworks.warn_if_same_data_on_every_rank(self)
        if native is not None and not native.index_driven:
            items = self._iterate_self_driven(native)
        elif native is not None and self._auto_collation:
            items = self._iterate_indexed(native)
        else:
            if self._resume is not None:
                raise ValueError("load_state_dict() resumes chute datasets only")
            items = super().__iter__()
        if self._handoff_device is not None:
            items = self._handed_off(items, self._handoff_device)
        fetch = frameworks.lightning_fetch() if native is not None else None
        if fetch is not None:
            items = frameworks.behind_prefetch(self, items, fetch)
        self._clock = ConsumerClock()
        items = self._clock.timed(items)
        if not self.progress:
            return items
        status = self.bottleneck_now if native is not None else None
        return with_progress(items, len(self) if self._has_len() else None, status)

    def _handed_off(self, items: Iterator[Any], device: torch.device) -> Iterator[Any]:
        state = self._source_state if self._native is not None else None
        batches = DeviceBatches(items, CudaCopies(device), state)
        self._handoff = batches
        self._transfer = batches.figures
        try:
            yield from batches
        finally:
            if self._handoff is batches:
                self._handoff = None
            batches.close()

    def _has_len(self) -> bool:
        try:
            len(self)
        except TypeError:
            return False
        return True

    def _iterate_self_driven(self, native: EngineDataset) -> Iterator[Any]:
        park_if_exiting()
        resume, self._resume = self._resumed_state(), None
        if resume is not None:
            native.load_loader_state(resume["dataset"])
        pool = self._worker_processes.start(self, native)
        batches = (
            native.loader_batches(self._settings(), None)
            if pool is None
            else native.worker_batches(self._settings(), None, pool)
        )
        self._running = batches
        delivered: Iterator[Any] = batches
        if pool is not None and self.pin_memory and torch.cuda.is_available():
            # What this process makes of the workers' items (the collated
            # labels) is not in their arenas.
            delivered = (pinning.pin_rest(batch) for batch in batches)
        try:
            yield from delivered
        finally:
            if self._running is batches:
                self._running = None
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            self._done_with(pool)

    def _resumed_state(self) -> dict[str, Any] | None:
        """The loaded state this iteration resumes, given the epoch told since."""
        if self._resume is None:
            return None
        told = getattr(self.sampler, "epoch", None)
        return resume_for_told_epoch(self._resume, told, self._told_at_load, self._epoch_batches)

    def _iterate_indexed(self, native: EngineDataset) -> Iterator[Any]:
        park_if_exiting()
        resume, self._resume = self._resumed_state(), None
        generator = self.generator
        if resume is not None:
            set_rng_state(generator, resume["rng_state"])
            if resume.get("sampler_epoch") is not None:
                self.sampler.set_epoch(resume["sampler_epoch"])  # type: ignore[attr-defined]
        align_generator(
            self.sampler,
            self._replay_epoch,
            None if resume is None else resume.get("sampler_epoch"),
        )
        position: dict[str, Any] = {
            "kind": "indexed",
            "version": STATE_VERSION,
            "rng_state": get_rng_state(generator),
            "sampler_epoch": getattr(self.sampler, "epoch", None),
            "batches": resume["batches"] if resume is not None else 0,
            "loader": self._fingerprint(),
        }
        # torch's iterator creates the sampler iterator, then draws its base
        # seed from `generator`, and only then runs the sampler: same here.
        index_batches: Iterator[Any] = array_index_batches(self._index_sampler) or iter(
            self._index_sampler
        )
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
        segment = None
        sampler = self._elastic_sampler()
        if sampler is not None:
            order = sampler.global_order()
            recorded = resume.get("elastic") if resume is not None else None
            segment, position["batches"] = segment_after(
                recorded,
                order.size,
                sampler.num_replicas,
                int(self.batch_size or 1),
                self.drop_last,
            )
            if recorded is None and resume is not None:
                position["batches"] = resume["batches"]  # a state from before elastic positions
            if not segment.fresh:
                index_batches = segment.rank_batches(order, sampler.rank)
        if position["batches"]:
            index_batches = islice(index_batches, position["batches"], None)
        self._position = position
        self._segment = segment
        settings = self._settings()
        if self.num_workers > 0 and self._python_work(native):
            # Idle engines of this process would make the workers start
            # without fork (see chute.workers.pool.resolve_context), and a
            # worker not forked does not see what this process changed since
            # its modules were imported: a collate_fn fixed after it raised
            # would raise again in the next epoch's workers.
            release = getattr(native, "release_idle_engines", None)
            if callable(release):
                release()
        pool = self._worker_processes.start(self, native, base_seed)
        if pool is not None:
            inner = native.worker_batches(settings, index_batches, pool)
            self._running = batches = inner
        else:
            inner = native.loader_batches(settings, index_batches)
            batches = single_threaded(inner) if self._python_work(native) else inner
        try:
            for batch in batches:
                position["batches"] += 1
                yield batch
        finally:
            self._position = None
            self._segment = None
            if self._running is inner:
                self._running = None
            for it in (batches, inner):
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            self._done_with(pool)

    def _replay_epoch(self) -> None:
        """Draws from the generator what one epoch of `_iterate_indexed` draws."""
        index_batches = array_index_batches(self._index_sampler) or iter(self._index_sampler)
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        for _ in index_batches:
            pass

    def _elastic_sampler(self) -> GlobalOrderSampler | None:
        """The sampler when it deals one global order to the ranks and this
        loader batches it as DistributedSampler's batches are cut."""
        sampler = self.sampler
        if (
            self.batch_size is None
            or not isinstance(sampler, GlobalOrderSampler)
            or bool(sampler.drop_last) != self.drop_last
            or getattr(self.batch_sampler, "sampler", None) is not sampler
        ):
            return None
        return cast(GlobalOrderSampler, sampler)

    def _elastic_part(self, batches: int) -> dict[str, Any]:
        """The state's global position: the running segment's, else the
        start of the epoch."""
        sampler = self._elastic_sampler()
        assert sampler is not None
        segment = self._segment
        if segment is None:
            n = int(sampler.global_order().size)
            segment = Segment(n, 0, sampler.num_replicas, int(self.batch_size or 1), self.drop_last)
        return elastic_state(segment, batches, sampler_fingerprint(sampler))

    def _fingerprint(self, sampler_epoch: int | None = None) -> dict[str, Any]:
        """What a state of this loader must match when loaded (a state of
        epoch `sampler_epoch`; default: the sampler's current one)."""
        out: dict[str, Any] = {"batch_size": self.batch_size, "drop_last": self.drop_last}
        native = self._native
        if native is not None and native.index_driven:
            out["rows"] = len(self.dataset)  # type: ignore[arg-type]
            names = getattr(native, "field_names", None)
            if callable(names):
                out["fields"] = list(names())
        identity = getattr(native, "state_identity", None)
        if callable(identity):
            out["dataset"] = identity()
        # What else decides the epoch's order (a weighted mix's sources, in
        # order, and how many samples each gives that epoch; a curriculum's
        # groups and weights that epoch).
        epoch_identity = getattr(self.sampler, "epoch_identity", None)
        if callable(epoch_identity):
            out["epoch"] = epoch_identity(sampler_epoch)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The running iteration's position (or the start of the next epoch):
        with ``device``, after the batches handed over, not those copied ahead;
        under Lightning's prefetching fetcher, after the batches it handed
        to the training step, not the one it holds ahead."""
        view = self._prefetch_view
        state = view.state() if view is not None else None
        return state if state is not None else self._current_state()

    def _next_state(self) -> dict[str, Any]:
        """The state of the iteration about to start: a loaded one, else the current."""
        return dict(self._resume) if self._resume is not None else self._current_state()

    def _current_state(self) -> dict[str, Any]:
        handoff = self._handoff
        if handoff is not None and self._native is not None:
            state: dict[str, Any] = handoff.state()
            return state
        return self._source_state()

    def _source_state(self) -> dict[str, Any]:
        native = self._native
        if native is None:
            raise ValueError("state_dict() covers chute datasets only")
        if not native.index_driven:
            return {
                "kind": "stream",
                "version": STATE_VERSION,
                "dataset": native.loader_state(self._running),
                "loader": self._fingerprint(),
            }
        if self._position is not None:
            state = dict(self._position)
        else:
            state = {
                "kind": "indexed",
                "version": STATE_VERSION,
                "rng_state": get_rng_state(self.generator),
                "sampler_epoch": getattr(self.sampler, "epoch", None),
                "batches": 0,
                "loader": self._fingerprint(),
            }
        if self._elastic_sampler() is not None:
            state["elastic"] = self._elastic_part(state["batches"])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration resumes where `state` was taken. ValueError when
        `state` is malformed, of another version, past the end of its epoch,
        or was taken from another kind of dataset, another dataset (its rows,
        files or shards) or another batch size."""
        if not isinstance(state, dict):
            raise ValueError(f"a loader state must be a dict, not {type(state).__name__}")
        expected = state_kind(self._native)
        if state.get("kind") != expected:
            raise ValueError(
                f"state of a {state.get('kind')!r} loader given to a {expected!r} loader"
            )
        check_state_version(state)
        recorded = state.get("loader")
        epoch = state.get("sampler_epoch")
        expected_fingerprint = self._fingerprint(
            epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
        )
        if recorded is not None or "dataset" in expected_fingerprint:
            check_loader_fingerprint(recorded, expected_fingerprint)
        native = self._native
        assert native is not None
        if native.index_driven:
            check_indexed_state(state, self.generator)
            if "elastic" in state:
                sampler = self._elastic_sampler()
                if sampler is None:
                    raise ValueError(
                        "loader state holds a global position (a distributed loader's), but "
                        "this loader's sampler deals no global order: use distributed=True"
                    )
                check_elastic_state(
                    state["elastic"],
                    int(sampler.global_order(state.get("sampler_epoch")).size),
                    sampler_fingerprint(sampler),
                    batch_size=int(self.batch_size or 1),
                    drop_last=self.drop_last,
                )
            else:
                check_batches_within(state["batches"], self._epoch_batches(state["sampler_epoch"]))
        else:
            if not isinstance(state.get("dataset"), dict):
                raise ValueError("loader state: 'dataset' must be the dataset's state dict")
            # The dataset checks its part now, not at the next iteration.
            native.load_loader_state(state["dataset"])
        self._resume = dict(state)
        self._told_at_load = getattr(self.sampler, "epoch", None)

    def _epoch_batches(self, sampler_epoch: int | None) -> int | None:
        """Batches of the epoch `sampler_epoch` (None: the sampler's current
        one) as this loader cuts it; None when the sampler has no length."""
        sampler = self.sampler
        previous = getattr(sampler, "epoch", None)
        switch = sampler_epoch is not None and previous is not None and sampler_epoch != previous
        set_epoch = getattr(sampler, "set_epoch", None)
        if switch and callable(set_epoch):
            set_epoch(sampler_epoch)  # a sampler's length may depend on its epoch
        try:
            return len(self)
        except TypeError:
            return None
        finally:
            if switch and callable(set_epoch):
                set_epoch(previous)

    def stats(self) -> dict[str, Any]:
        """The engine figures of this loader's running iteration, else the
        dataset's, with the loop's side of the latest iteration (see
        docs/stats.md)."""
        running = self._running
        fn = getattr(running, "stats", None) if running is not None else None
        if not callable(fn):
            fn = getattr(self.dataset, "stats", None)
        figures = fn() if callable(fn) else {}
        return loop_figures(figures, self._clock, self._timed_collate, self._transfer)

    def diagnose(self) -> dict[str, Any]:
        """Which stage limits this loader's throughput, during or after an
        epoch: ``report["bottleneck"]`` (``storage``, ``decode``,
        ``transform``, ``python``, ``collate``, ``transfer`` or
        ``consumer``), ``report["prescription"]`` (what to change),
        ``report["summary"]`` and the measured ``report["evidence"]``
        (see docs/stats.md, "Diagnosis")."""
        return diagnose(self.stats(), loader_facts(self))

    def bottleneck_now(self) -> str:
        """The bottleneck so far, in a word (the progress bar's)."""
        return str(self.diagnose()["bottleneck"] or "")


def _own_order(
    dataset: Any,
    sampler: Any,
    batch_sampler: Any,
    shuffle: bool | None,
    distributed: bool,
    drop_last: bool,
) -> torch.utils.data.Sampler[Any] | None:
    """The sampler of a dataset that orders its samples itself (a weighted
    ``chute.mix``), dealt to this rank when `distributed`; None for others
    or when the caller brought a sampler."""
    own = getattr(dataset, "order_sampler", None)
    if not callable(own) or sampler is not None or batch_sampler is not None:
        return None
    rank, world_size = rank_and_world_size() if distributed else (0, 1)
    ordered: torch.utils.data.Sampler[Any] | None = own(
        num_replicas=world_size, rank=rank, drop_last=drop_last
    )
    if ordered is not None and shuffle is not None:
        raise ValueError(
            f"{type(dataset).__name__} orders its samples itself (shuffle is its own "
            "setting): leave the DataLoader's shuffle unset"
        )
    return ordered


def set_epoch(loader: Any, epoch: int) -> None:
    """Tells every part of `loader` that has a ``set_epoch`` (its sampler, its
    batch sampler's sampler, its dataset) the epoch; works on chute's and
    torch's loaders alike."""
    _reach_set_epoch(loader, epoch)


def _reach_set_epoch(loader: Any, epoch: int) -> None:
    reached: list[object] = []
    batch_sampler = getattr(loader, "batch_sampler", None)
    for target in (
        getattr(loader, "sampler", None),
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    ):
        fn = getattr(target, "set_epoch", None)
        if callable(fn) and not any(target is r for r in reached):
            reached.append(target)
            fn(epoch)


# The dataset types already warned about: once per type, so that a stream's
# warning does not silence a map-style dataset's.
_warned_worker_init_fn: set[str] = set()


def _warn_worker_init_fn(dataset: str) -> None:
    if dataset in _warned_worker_init_fn:
        return
    _warned_worker_init_fn.add(dataset)
    warnings.warn(
        f"chute.DataLoader runs {dataset} on native threads (num_workers counts threads) and "
        "starts no worker process, so worker_init_fn is not called; do per-process set-up "
        "before creating the loader",
        WorkerInitFnWarning,
        stacklevel=3,
    )


def auto_thread_count(num_workers: Any, runs_here: bool, dataset: str) -> AutoThreads | None:
    """``num_workers="auto"``: the thread count's bound (the cores this
    process may use) that the engine's tuner moves under; None for an int."""
    if num_workers != "auto":
        return None
    if not runs_here:
        raise ValueError(
            f"num_workers='auto' tunes chute's engine threads; {dataset} is not a chute dataset "
            "and runs on torch's DataLoader, which takes an int"
        )
    return AutoThreads(cores_available())
