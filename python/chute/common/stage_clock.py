"""The busy time of Python work on the thread that runs it, for
``stats()["python_seconds"]`` and ``stats()["collate_seconds"]``: a chain
of Python stages is timed as a whole, less the time spent in the source
under it (the engine's wait and the conversion of its batches), and a
collate function by its calls. Two clock reads per item or per call."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")


class StageClock:
    """Seconds spent in the stages between `source` and `stages`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def source(self, items: Iterable[_T]) -> Iterator[_T]:
        """`items`, whose own time is taken off the stages' time."""
        it = iter(items)
        clock = time.perf_counter
        while True:
            started = clock()
            try:
                item = next(it)
            except StopIteration:
                self.seconds -= clock() - started
                return
            self.seconds -= clock() - started
            yield item
            del item

    def stages(self, items: Iterable[_T]) -> Iterator[_T]:
        """`items` (the last stage's output), timed with everything under them."""
        it = iter(items)
        clock = time.perf_counter
        while True:
            started = clock()
            try:
                item = next(it)
            except StopIteration:
                self.seconds += clock() - started
                return
            self.seconds += clock() - started
            yield item
            del item

    def take(self) -> float:
        """The seconds counted since the last take (a worker's report)."""
        seconds, self.seconds = self.seconds, 0.0
        return max(0.0, seconds)


class TimedCall(Generic[_T]):
    """`fn`, counting the seconds its calls take (picklable when `fn` is)."""

    def __init__(self, fn: Callable[..., _T]) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> _T:
        started = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started

    def __repr__(self) -> str:
        return repr(self.fn)
