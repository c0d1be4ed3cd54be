"""``num_workers="auto"``: the engine's decode threads and batches in
flight follow the consumer while an epoch runs.

The engine starts every thread the process may use (``AutoThreads``, the
bound) and a `ThreadTuner` lets some of them work (the engine's
``set_active_threads``). Every quarter of a second or so, from what the
consumer waited and what the active threads did in that window, it lets
more of them work when the consumer waited while they were busy, and fewer
when the work of the window would have fitted in fewer threads and the
consumer did not wait (the consumer is the bottleneck, or storage is).
Batches in flight follow the thread count as they do for a fixed setting
(``prefetch_factor`` per thread). Threads only do work: the batches and
their order are the plan's, the same as any fixed setting's.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

# A window is at least this long and this many batches, so that one slow
# batch or one scheduling hiccup does not move the count.
WINDOW_SECONDS = 0.25
WINDOW_BATCHES = 4
# The consumer "waited" when it spent more than this share of the window
# waiting for batches, and "did not" under the second one.
WAITED = 0.05
DID_NOT_WAIT = 0.02
# Threads count as "busy" above this share of their active time; a window's
# work "fits" in fewer threads when it would keep them busy at most this much.
BUSY = 0.7
FITS = 0.7
# Steps down that were undone at once wait longer each time (in windows).
MAX_HOLD = 32


def cores_available() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has
    one, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity mask on this OS
        return max(1, os.cpu_count() or 1)


class AutoThreads(int):
    """The thread count of ``num_workers="auto"``: an int (the bound, what
    the engine starts) that remembers the count its last epoch ended with,
    so the next epoch starts there."""

    last: int

    def __new__(cls, bound: int) -> AutoThreads:
        made = super().__new__(cls, max(1, int(bound)))
        made.last = int(made)
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (AutoThreads, (int(self),))


def tuner_for(threads: int, prefetch: int, engine: Any) -> ThreadTuner | None:
    """A tuner attached to `engine` when `threads` is ``AutoThreads``, else
    None. Every engine takes the active-thread limit, datasets' own
    wrappers of one included (they pass it on)."""
    if not isinstance(threads, AutoThreads):
        return None
    tuner = ThreadTuner(threads, prefetch)
    tuner.attach(engine)
    return tuner


class ThreadTuner:
    """Moves an engine's active thread count between 1 and `auto` (see the
    module docstring); `prefetch` is the batches in flight at the bound."""

    def __init__(
        self, auto: AutoThreads, prefetch: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.auto = auto
        self.clock = clock
        self.bound = int(auto)
        self.per_thread = max(1, math.ceil(max(1, prefetch) / self.bound))
        self.threads = min(self.bound, max(1, auto.last))
        self.engine: Any = None
        self.hold = 0  # windows to wait before the next step down
        self.next_hold = 1
        self.stepped_down = False  # in the window before this one
        self.changes = 0

    def attach(self, engine: Any) -> None:
        """Tunes `engine` from now on, starting at the count reached so far."""
        self.engine = engine
        self._apply(self.threads)
        self._start_window()

    def detach(self) -> None:
        """Gives the engine back all its threads (an engine kept for reuse by a
        later epoch, maybe one with a fixed setting) and remembers the count."""
        engine, self.engine = self.engine, None
        self.auto.last = self.threads
        if engine is not None:
            engine.set_active_threads(self.bound, self.bound * self.per_thread)

    def _apply(self, threads: int) -> None:
        if threads != self.threads:
            self.changes += 1
        self.threads = threads
        self.auto.last = threads
        self.engine.set_active_threads(threads, threads * self.per_thread)

    def _start_window(self) -> None:
        figures = self.engine.stats()
        self.started = self.clock()
        self.batches = 0
        self.waited = 0.0
        self.busy0 = float(figures["decode_seconds"])

    def observe(self, waited: float) -> None:
        """After each batch the consumer got: `waited` seconds for it."""
        if self.engine is None:
            return
        self.batches += 1
        self.waited += waited
        span = self.clock() - self.started
        if span < WINDOW_SECONDS or self.batches < WINDOW_BATCHES:
            return
        figures = self.engine.stats()
        busy = float(figures["decode_seconds"]) - self.busy0
        target = self.decide(self.threads, busy, self.waited / span, span)
        if target > self.threads and self.stepped_down:
            # The step down was too far: wait longer before the next one.
            self.next_hold = min(MAX_HOLD, 2 * self.next_hold)
            self.hold = self.next_hold
        self.stepped_down = target < self.threads
        if target != self.threads:
            self._apply(target)
        self._start_window()

    def decide(self, threads: int, busy: float, wait_share: float, span: float) -> int:
        """The thread count for the next window, after one of `span` seconds
        in which `threads` threads were busy `busy` seconds in all and the
        consumer waited `wait_share` of the time."""
        utilization = busy / (threads * span) if span > 0 else 0.0
        if wait_share > WAITED and utilization > BUSY and threads < self.bound:
            # Enough threads that the consumer would not have waited, if the
            # work scales with them (it does while cores are free).
            wanted = math.ceil(threads / max(0.1, 1.0 - wait_share))
            return min(self.bound, max(threads + 1, wanted))
        fits = max(1, math.ceil(busy / (FITS * span))) if span > 0 else threads
        if threads > 1 and fits < threads and (wait_share < DID_NOT_WAIT or utilization < 0.5):
            if self.hold > 0:
                self.hold -= 1
                return threads
            return max(1, min(threads - 1, fits))
        return threads
