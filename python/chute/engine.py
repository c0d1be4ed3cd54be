"""What the Python side of both engines shares: the default thread count and
the waits for a finished batch."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch.utils.data

from chute.errors import engine_errors

# How long one native wait of the indexed engine lasts before Python regains
# control, so that Ctrl-C and timeouts are noticed while the engine works.
WAIT_SLICE_S = 0.1


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
    """The indexed engine's next batch: engine.next() in short native waits,
    so signals get handled between them; TimeoutError after `timeout` > 0."""
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while True:
        slice_s = WAIT_SLICE_S
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no batch within {timeout} s")
            slice_s = min(slice_s, remaining)
        with engine_errors():
            arrays = engine.next(slice_s)
        if arrays is not None:
            return list(arrays)


def next_stream_batch(engine: Any, timeout: float) -> Any:
    """The stream engine's next batch (None at the end). The native wait runs
    in short slices that let Python handle Ctrl-C; False means `timeout` passed."""
    with engine_errors():
        batch = engine.next(timeout)
    if batch is False:
        raise TimeoutError(f"no batch within {timeout:g} seconds")
    return batch
