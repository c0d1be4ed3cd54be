"""Stages that let items through unchanged, in Python: some of them
(``slice``, ``rsample``) or all of them, watched (``log_keys``, ``info``)."""

from __future__ import annotations

import fcntl
import itertools
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from chute.stream.stages.base import PythonRun, Stage


@dataclass(eq=False)
class Slice(Stage):
    """``slice(*args)``: ``itertools.islice`` over the items."""

    kind: ClassVar[str] = "slice"
    keeps_state: ClassVar[bool] = True

    args: tuple[int | None, ...] = ()

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return itertools.islice(items, *self.args)


@dataclass(eq=False)
class RSample(Stage):
    """``rsample(p)``: each item with probability `p` (drawn from the
    process's ``random``)."""

    kind: ClassVar[str] = "rsample"

    p: float = 0.5

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        p = float(self.p)
        return (item for item in items if random.uniform(0.0, 1.0) < p)


@dataclass(eq=False)
class LogKeys(Stage):
    """``log_keys(logfile)``: appends each sample's index, worker, rank and
    key to `logfile` (None or empty: logs nothing)."""

    kind: ClassVar[str] = "log_keys"

    logfile: str | None = None

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return _log_keys(items, self.logfile)


@dataclass(eq=False)
class Info(Stage):
    """``info(...)``: prints the first `n` samples (and every `every`-th)."""

    kind: ClassVar[str] = "info"
    keeps_state: ClassVar[bool] = True

    fmt: str | None = None
    n: int = 3
    every: int = -1
    width: int = 50
    stream: Any = None
    name: str = ""

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return _info(items, self.fmt, self.n, self.every, self.width, self.stream, self.name)


def _log_keys(items: Iterator[Any], logfile: str | None) -> Iterator[Any]:
    if not logfile:
        yield from items
        return
    with open(logfile, "a") as stream:
        for i, sample in enumerate(items):
            line = (
                f"{i}\t{sample.get('__worker__')}\t{sample.get('__rank__')}\t"
                f"{sample.get('__key__')}\n"
            )
            # Several workers may append to one log: one line at a time.
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
            try:
                stream.write(line)
                stream.flush()
            finally:
                fcntl.flock(stream.fileno(), fcntl.LOCK_UN)
            yield sample


def _info(
    items: Iterator[Any],
    fmt: str | None,
    n: int,
    every: int,
    width: int,
    stream: Any,
    name: str,
) -> Iterator[Any]:
    out = stream if stream is not None else sys.stderr
    for i, sample in enumerate(items):
        if i < n or (every > 0 and (i + 1) % every == 0):
            if fmt is None:
                print("---", name, file=out)
                for k, v in sample.items():
                    print(k, repr(v)[:width], file=out)
            else:
                print(fmt.format(**sample), file=out)
        yield sample
