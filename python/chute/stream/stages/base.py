"""What every recorded stage knows about itself: how it compiles (into the
engine's part of the pipeline, or to a Python stage that worker processes
may run), how it resumes (its part of a state's fingerprint, and whether a
mid-epoch state can replay it) and how it counts (the items it makes of a
number of samples). Each stage kind is one subclass; nothing outside its
class asks which kind a stage is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from chute.common.handlers import Handler, reraise_exception
from chute.stream.native import ErrorHandlers
from chute.stream.prefix import NativePrefix

# Told of each item a Python stage's per-item function sees (the slow-path
# counter of ``stats()``).
Counter = Callable[[int], None]


def no_count(n: int) -> None:
    pass


@dataclass(frozen=True)
class PythonRun:
    """What Python stages run with where they run: `count` is told of each
    item a per-item function sees; `default_handler` stands in for the
    default handler of a stage that can also run natively."""

    count: Counter = no_count
    default_handler: Handler = reraise_exception

    def guarded(
        self, items: Iterator[Any], fn: Callable[[Any], Any], handler: Handler | None
    ) -> Iterator[Any]:
        """`fn` of each item; a failure goes to `handler` (None: raise), which
        skips the item (True) or ends the iteration (False), or raises."""
        handler = own_handler(handler)
        for item in items:
            self.count(1)
            try:
                result = fn(item)
            except Exception as exn:
                if handler(exn):
                    continue
                return
            yield result


def own_handler(handler: Handler | None) -> Handler:
    """A stage's handler as Python runs it (None stands for the default)."""
    return handler or reraise_exception


# Every stage class by kind: a kind names one class, so that the stages of
# a state's fingerprint name one pipeline.
STAGE_CLASSES: dict[str, type[Stage]] = {}


class Stage(ABC):
    """One recorded stage: what webdataset's fluent method or filter
    function of the same name was asked to do. A stage is data (the compiler
    reads it to build the native part of a pipeline) and a filter (called on
    an iterator, it runs in Python, as webdataset's filter does).

    A subclass that sets `kind` is registered as that kind's class."""

    kind: ClassVar[str]  # webdataset's name of the stage
    # Takes one item and gives at most one, keeping nothing across items
    # and drawing no shared random numbers: worker processes may run it on
    # their share of the items (chute.wds.parallel).
    itemwise: ClassVar[bool] = False
    # Holds items or counts across calls: a mid-epoch state cannot replay
    # it when it runs in Python.
    keeps_state: ClassVar[bool] = False
    # Makes one item of each (from the index's point of view: with_length).
    one_to_one: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind is None:
            return
        taken = STAGE_CLASSES.get(kind)
        # The same class defined again (a module reloaded, a notebook cell
        # run twice) takes its kind over.
        if taken is not None and (taken.__module__, taken.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise TypeError(
                f"stage kind {kind!r} is taken by {taken.__qualname__}; "
                f"{cls.__qualname__} needs another"
            )
        STAGE_CLASSES[kind] = cls

    # -- compiling --------------------------------------------------------------

    def compile(self, prefix: NativePrefix) -> bool:
        """Adds this stage to the engine's part of the pipeline and returns
        True, or returns False (leaving `prefix` as it was) when the engine
        cannot run it there: it and what follows run in Python."""
        return False

    def take_failures(self, handlers: ErrorHandlers, default: Handler) -> ErrorHandlers:
        """The handlers of the native part once this stage runs there
        (`default`: the dataset's handler)."""
        return handlers

    # -- running in Python --------------------------------------------------------

    @abstractmethod
    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        """`items` through this stage in Python, with webdataset's semantics."""

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        """The stage run in Python over `data`."""
        return self.apply(iter(data), PythonRun())

    # -- resuming and counting ----------------------------------------------------

    def describe(self) -> str:
        """This stage in a state's fingerprint: its kind and whatever a
        resumed position depends on."""
        return self.kind

    def items_after(self, items: int) -> int | None:
        """The items this stage makes of `items` items, or None when that is
        not known without running it."""
        return items if self.one_to_one else None
