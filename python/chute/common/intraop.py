"""The one-thread rule for Python stages: user transforms never
oversubscribe the cores.

torch runs its ops on an intra-op thread pool as large as the CPUs. A
``.map(fn)`` whose ``fn`` uses torch ops would then start that many threads
on every call, and they would fight the engine's decode threads (and, on a
training node, the trainer) for the cores. torch's DataLoader workers call
``torch.set_num_threads(1)`` for this reason; chute does the same wherever
it runs Python stages: in its worker processes for their whole life, and in
the thread that iterates a pipeline for the duration of each ``next()``,
restoring the caller's own setting before control returns to its loop.
``torch.set_num_threads`` only records the count for the next parallel
region (the pool's threads are kept), so switching per ``next()`` is cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def one_intraop_thread() -> Iterator[None]:
    """Runs the block with one intra-op torch thread, then restores the
    caller's count (also when the block raises)."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def single_threaded(items: Iterator[Any]) -> Iterator[Any]:
    """`items`, each ``next()`` on them run under `one_intraop_thread`."""
    while True:
        with one_intraop_thread():
            try:
                item = next(items)
            except StopIteration:
                return
        yield item
        del item
