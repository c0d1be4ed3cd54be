"""Stages that call the user's functions, always in Python: per item
(``map``, ``map_dict``, ``map_tuple``, ``select``, ``associate``: worker
processes may run them) or over the whole iterator (``compose``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chute.common.handlers import Handler, reraise_exception
from chute.stream.stages.base import Counter, PythonRun, Stage, own_handler


@dataclass(eq=False)
class Map(Stage):
    """``map(f)``: `f` of each item; a None result drops the item, and a
    dict result keeps the sample's key (webdataset's rules)."""

    kind: ClassVar[str] = "map"
    itemwise: ClassVar[bool] = True
    # Counted one item per item: items a None result drops are the
    # function's, which the shards' indexes cannot see.
    one_to_one: ClassVar[bool] = True

    f: Callable[[Any], Any]
    handler: Handler = reraise_exception

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return _mapped(items, self.f, own_handler(self.handler), run.count)


@dataclass(eq=False)
class MapDict(Stage):
    """``map_dict(**fns)``: each named member of a dict sample through its function."""

    kind: ClassVar[str] = "map_dict"
    itemwise: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    fns: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    handler: Handler = reraise_exception

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return run.guarded(items, _dict_mapper(self.fns), self.handler)


@dataclass(eq=False)
class MapTuple(Stage):
    """``map_tuple(*fns)``: each value of a tuple sample through the
    function at its position (None: unchanged)."""

    kind: ClassVar[str] = "map_tuple"
    itemwise: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    fns: tuple[Callable[[Any], Any] | None, ...] = ()
    handler: Handler = reraise_exception

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return run.guarded(items, _tuple_mapper(self.fns), self.handler)


@dataclass(eq=False)
class Select(Stage):
    """``select(predicate)``: the items `predicate` accepts."""

    kind: ClassVar[str] = "select"
    itemwise: ClassVar[bool] = True

    predicate: Callable[[Any], bool]

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        predicate = self.predicate
        return (item for item in items if predicate(item))


@dataclass(eq=False)
class Associate(Stage):
    """``associate(associator)``: each dict sample updated, in place, with
    the members `associator` gives its key (called with the key, or a
    mapping from keys; a key it lacks adds nothing)."""

    kind: ClassVar[str] = "associate"
    itemwise: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    associator: Callable[[str], dict[str, Any]] | Mapping[str, dict[str, Any]]

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        associator = self.associator
        for sample in items:
            run.count(1)
            key = sample["__key__"]
            sample.update(associator(key) if callable(associator) else associator.get(key, {}))
            yield sample


@dataclass(eq=False)
class Compose(Stage):
    """A function of the whole iterator (``compose(f)``, or a callable chute
    does not know in a DataPipeline)."""

    kind: ClassVar[str] = "compose"
    keeps_state: ClassVar[bool] = True

    function: Any  # f(iterator) -> iterator, or an object with run(iterator)

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        # webdataset's pipeline stages (PipelineStage) have a run method and
        # need not be callable.
        f = self.function
        method = getattr(f, "run", None)
        return (method if callable(method) else f)(items)  # type: ignore[no-any-return]


def _mapped(
    items: Iterator[Any], f: Callable[[Any], Any], handler: Handler, count: Counter
) -> Iterator[Any]:
    # webdataset's map drops None results and keeps a dict sample's key.
    for sample in items:
        count(1)
        try:
            result = f(sample)
        except Exception as exn:
            if handler(exn):
                continue
            return
        if result is None:
            continue
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        yield result


def _dict_mapper(fns: dict[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def apply(sample: dict[str, Any]) -> dict[str, Any]:
        sample = dict(sample)
        for key, fn in fns.items():
            sample[key] = fn(sample[key])
        return sample

    return apply


def _tuple_mapper(fns: Sequence[Callable[[Any], Any] | None]) -> Callable[[Any], Any]:
    def apply(sample: Sequence[Any]) -> tuple[Any, ...]:
        values = list(sample)
        for i in range(min(len(fns), len(values))):
            fn = fns[i]
            if fn is not None:
                values[i] = fn(values[i])
        return tuple(values)

    return apply
