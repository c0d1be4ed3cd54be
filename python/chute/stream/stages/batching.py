"""Stages that group items or take groups apart: ``batched`` (the engine
forms the batches when they are collated by the default collation),
``unbatched`` and ``unlisted`` (in Python)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from chute.common.collate import default_collate
from chute.stream.prefix import NativePrefix
from chute.stream.stages.base import PythonRun, Stage

Collate = Callable[[list[Any]], Any]


@dataclass(eq=False)
class Batched(Stage):
    """Batches of `size` items, collated by `collation_fn` (None: lists);
    `partial` keeps a last, smaller batch."""

    kind: ClassVar[str] = "batched"
    keeps_state: ClassVar[bool] = True

    size: int
    collation_fn: Collate | None = default_collate
    partial: bool = True

    def compile(self, prefix: NativePrefix) -> bool:
        if prefix.batch_size is not None or self.collation_fn is not default_collate:
            return False
        prefix.batch_size = int(self.size)
        prefix.partial = bool(self.partial)
        return True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return python_batched(items, int(self.size), self.collation_fn, self.partial)

    def describe(self) -> str:
        # A state resumes after a number of batches: their size is part of it.
        partial = "" if self.partial else ", partial=False"
        return f"batched({self.size}{partial})"

    def items_after(self, items: int) -> int:
        size = int(self.size)
        return -(-items // size) if self.partial else items // size


@dataclass(eq=False)
class Unbatched(Stage):
    """The rows of each batch."""

    kind: ClassVar[str] = "unbatched"
    keeps_state: ClassVar[bool] = True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return python_unbatched(items)


@dataclass(eq=False)
class Unlisted(Stage):
    """The items of each list."""

    kind: ClassVar[str] = "unlisted"
    keeps_state: ClassVar[bool] = True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return _unlisted(items)


def python_batched(
    items: Iterator[Any], size: int, collation_fn: Collate | None, partial: bool
) -> Iterator[Any]:
    """Lists of `size` items, collated by `collation_fn` when given."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
    if batch and partial:
        yield collation_fn(batch) if collation_fn is not None else batch


def python_unbatched(items: Iterable[Any]) -> Iterator[Any]:
    """The rows of each batch: a tuple or list batch holds columns, a dict
    batch one column per key."""
    for batch in items:
        if isinstance(batch, (list, tuple)):
            for i in range(len(batch[0])):
                yield tuple(column[i] for column in batch)
        elif isinstance(batch, dict):
            lengths = {len(v) for v in batch.values()}
            if len(lengths) != 1:
                raise ValueError(f"unbatched: columns of different lengths {sorted(lengths)}")
            for i in range(lengths.pop()):
                yield {k: v[i] for k, v in batch.items()}
        else:
            raise ValueError(f"unknown sample type: {type(batch)}")


def _unlisted(items: Iterable[Any]) -> Iterator[Any]:
    for batch in items:
        if not isinstance(batch, list):
            raise TypeError(f"unlisted expects lists, got {type(batch).__name__}")
        yield from batch
