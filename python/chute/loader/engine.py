"""What the Python side of both engines shares: the default thread count,
the indexed engine's construction and the waits for a finished batch."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch.utils.data

from chute import _core
from chute._core import DataError, ReadError
from chute.common.errors import engine_errors


def default_threads() -> int:
    """Engine threads when the user names none, for the stream and the indexed
    engine alike: the CPUs this process may run on (its affinity mask where
    the OS has one, else ``os.cpu_count()``), and 1 inside a torch DataLoader
    worker process, whose siblings already share those CPUs."""
    if torch.utils.data.get_worker_info() is not None:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity mask on this OS
        return max(1, os.cpu_count() or 1)


def wait_batch(engine: Any, timeout: float) -> list[np.ndarray]:
    """The indexed engine's next batch, as its columns. The native wait
    handles Ctrl-C between short slices and raises TimeoutError after
    `timeout` > 0 seconds; a failure as ``chute.common.errors`` maps it."""
    try:
        batch = engine.next(timeout)
    except (DataError, ReadError):
        # Translated here rather than by wrapping the call: this runs once
        # per batch, and a context manager costs more than the wait itself.
        with engine_errors():
            raise
    return [batch.column(i) for i in range(batch.num_columns)]


def gather_batch(engine: Any, idx: np.ndarray) -> list[np.ndarray]:
    """The columns of the batch of `idx`, made by the calling thread in
    an indexed engine without threads (``wait_batch``'s errors)."""
    try:
        return engine.gather(idx)  # type: ignore[no-any-return]
    except (DataError, ReadError):
        with engine_errors():
            raise


def make_indexed_engine(
    sources: list[Any],
    num_rows: int,
    threads: int,
    in_flight: int,
    hooks: tuple[int, int] | None = None,
) -> Any:
    """An indexed engine over `sources` (one row source per field, none
    when every field is read outside the engine) of a dataset of `num_rows`
    rows, with `in_flight` batches ahead of the consumer and optional
    page-lock hooks."""
    plan = _core.IndexedPlan()
    plan.sources = sources
    plan.num_rows = num_rows
    plan.num_threads = threads
    plan.max_in_flight = in_flight
    if hooks is not None:
        plan.set_pin_hooks(*hooks)
    return _core.IndexedEngine(plan)
