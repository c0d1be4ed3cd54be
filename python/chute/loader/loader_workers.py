"""A DataLoader's worker processes: when an iteration starts them, with
what, how long they live (see chute.DataLoader, ``num_workers``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from chute.common.warning_types import WorkerFallbackWarning
from chute.loader.engine import default_threads
from chute.loader.protocol import EngineDataset, LoaderSettings
from chute.workers.pool import NotSendable, WorkerPool

_NOT_SENDABLE = "chute.DataLoader: {} cannot be sent to worker processes ({}); its Python " + (
    "stages run in this process. Define its functions at module level, or pass "
    "multiprocessing_context='fork'"
)


def python_work(native: EngineDataset, settings: LoaderSettings) -> bool:
    """Whether iterating `native` with `settings` runs Python that worker
    processes take over."""
    try:
        return native.python_work(settings)
    except Exception:  # noqa: BLE001 - the iteration raises it in its place
        return False


class LoaderWorkers:
    """The worker processes of one DataLoader (at most one pool at a time)."""

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.told_not_sendable = False

    def start(
        self, loader: Any, native: EngineDataset, base_seed: int | None = None
    ) -> WorkerPool | None:
        """The pool an iteration of `loader` over `native` runs on, started
        when needed (kept across epochs with ``persistent_workers``); None
        when the dataset runs on native threads only, or cannot be sent."""
        if loader.num_workers <= 0 or not python_work(native, loader._settings()):
            return None
        target = native.worker_dataset()
        pool = self.pool
        if pool is not None and pool.alive and pool.dataset is target:
            return pool
        self.close()
        if base_seed is None:
            # As torch's iterators do, a base seed for the workers' generators.
            generator = loader.generator
            base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
        workers = loader.num_workers
        threads = loader.worker_threads or max(1, default_threads() // workers)
        try:
            pool = WorkerPool(
                target,
                workers,
                threads=threads,
                prefetch=loader.prefetch_factor or 2,
                context=loader.multiprocessing_context,
                worker_init_fn=loader.worker_init_fn,
                collate_fn=loader._user_collate_fn,
                base_seed=base_seed,
            )
        except NotSendable as exc:
            if not self.told_not_sendable:
                self.told_not_sendable = True
                warnings.warn(
                    _NOT_SENDABLE.format(type(target).__name__, exc),
                    WorkerFallbackWarning,
                    stacklevel=5,
                )
            return None
        self.pool = pool
        return pool

    def done_with(self, pool: WorkerPool | None, persistent: bool) -> None:
        """An iteration on `pool` ended: the pool ends unless it persists."""
        if pool is not None and not (persistent and pool.alive):
            self.close()

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
