"""``shuffle``: webdataset's shuffle buffer. The engine runs it on encoded
samples when it comes before any decode or field; in Python it keeps
webdataset's order for the same seed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from chute.stream.prefix import NativePrefix
from chute.stream.stages.base import PythonRun, Stage


@dataclass(eq=False)
class Shuffle(Stage):
    """A shuffle buffer of `size` items that starts yielding at `initial`,
    seeded by `seed`, drawing from `rng`, or seeded by the dataset."""

    kind: ClassVar[str] = "shuffle"
    keeps_state: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    size: int
    initial: int = 100
    rng: random.Random | None = None
    seed: int | None = None

    def compile(self, prefix: NativePrefix) -> bool:
        # The engine shuffles encoded samples, once.
        if prefix.decoded or prefix.fields is not None or prefix.shuffle is not None:
            return False
        size = int(self.size)
        initial = min(int(self.initial), size)
        if prefix.shuffle_seed is not None:
            chosen = prefix.shuffle_seed
        elif self.rng is not None:
            chosen = self.rng.getrandbits(63)
        elif self.seed is not None:
            chosen = int(self.seed)
        else:
            chosen = prefix.seed
        prefix.shuffle = (size, initial, chosen)
        return True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        rng = self.rng if self.rng is not None else random.Random(self.seed)
        return python_shuffle(items, int(self.size), self.initial, rng)

    def describe(self) -> str:
        return f"shuffle({self.size}, initial={self.initial})"


def python_shuffle(
    items: Iterator[Any], size: int, initial: int, rng: random.Random
) -> Iterator[Any]:
    """webdataset's shuffle buffer: up to `size` items, yielding from
    `initial` on, two items taken in per item given out while filling. With
    the same seed the order is webdataset's."""
    initial = min(int(initial), size)
    buf: list[Any] = []

    def pick() -> Any:
        k = rng.randint(0, len(buf) - 1)
        item = buf[k]
        buf[k] = buf[-1]
        buf.pop()
        return item

    for item in items:
        buf.append(item)
        if len(buf) < size:
            extra = next(items, _END)
            if extra is not _END:
                buf.append(extra)
        if len(buf) >= initial:
            yield pick()
    while buf:
        yield pick()


_END = object()
