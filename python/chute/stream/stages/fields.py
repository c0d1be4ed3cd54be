"""Stages that name a sample's fields: ``rename`` and ``to_tuple``. The
engine forms the fields they name (from the members' extensions, with
alternatives ``"jpg;png"``) until the samples are tupled or batched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chute.common.handlers import Handler, reraise_exception
from chute.stream.native import ErrorHandlers
from chute.stream.prefix import NativePrefix
from chute.stream.stages.base import PythonRun, Stage


class FieldStage(Stage):
    """A stage whose own handler takes the samples that lack a field; where
    it has none, a missing field raises, as in webdataset."""

    itemwise: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    handler: Handler

    def take_failures(self, handlers: ErrorHandlers, default: Handler) -> ErrorHandlers:
        if self.handler is reraise_exception or handlers.field is not reraise_exception:
            return handlers
        return dataclasses.replace(handlers, field=self.handler)


@dataclass(eq=False)
class Rename(FieldStage):
    """``rename(keep, **names)``: each new name takes the first of its
    alternatives the sample has; `keep` keeps the members not renamed."""

    kind: ClassVar[str] = "rename"

    names: dict[str, str] = field(default_factory=dict)
    keep: bool = True
    handler: Handler = reraise_exception

    def compile(self, prefix: NativePrefix) -> bool:
        # rename(keep=False) drops members the engine would otherwise carry.
        if prefix.samples_shaped or not self.keep:
            return False
        prefix.rename(self.names)
        return True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return run.guarded(items, _renamer(self.names, self.keep), self.handler)


@dataclass(eq=False)
class ToTuple(FieldStage):
    """``to_tuple(*specs)``: dict samples to tuples of the named fields."""

    kind: ClassVar[str] = "to_tuple"

    specs: tuple[str, ...] = ()
    handler: Handler = reraise_exception
    missing_is_error: bool = True
    none_is_error: bool | None = None

    def compile(self, prefix: NativePrefix) -> bool:
        # The engine raises (or skips, by the handler) for a missing field.
        if (
            prefix.samples_shaped
            or not self.missing_is_error
            or self.none_is_error not in (None, True)
        ):
            return False
        prefix.fields = [prefix.resolve_field(spec) for spec in self.specs]
        prefix.tuple_output = True
        return True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        tupler = _tupler(self.specs, self.missing_is_error, self.none_is_error)
        return run.guarded(items, tupler, self.handler)


def split_alternatives(spec: str | Sequence[str]) -> list[str]:
    """The alternatives of a field spec: a list, or names separated by ";"."""
    return spec.split(";") if isinstance(spec, str) else list(spec)


def getfirst(
    sample: dict[str, Any],
    keys: str | Sequence[str],
    default: Any = None,
    missing_is_error: bool = True,
) -> Any:
    """The value of the first of `keys` (a list, or names separated by ";")
    that `sample` has; else ValueError, or `default` when not `missing_is_error`."""
    names = split_alternatives(keys)
    for name in names:
        if name in sample:
            return sample[name]
    if missing_is_error:
        raise ValueError(f"didn't find {names} in {list(sample.keys())}{_which(sample)}")
    return default


def _which(sample: dict[str, Any]) -> str:
    """Names `sample` by its key and shard, for error messages."""
    key = sample.get("__key__")
    if key is None:
        return ""
    url = sample.get("__url__")
    return f" (sample {key!r}" + (f" of {url!r})" if url is not None else ")")


def _renamer(names: dict[str, str], keep: bool) -> Callable[[Any], Any]:
    def rename(sample: dict[str, Any]) -> dict[str, Any]:
        if keep:
            replaced = {alt for spec in names.values() for alt in split_alternatives(spec)}
            out = {k: v for k, v in sample.items() if k not in replaced}
        else:
            out = {}
        for new, spec in names.items():
            out[new] = getfirst(sample, spec)
        return out

    return rename


def _tupler(
    specs: Sequence[str], missing_is_error: bool, none_is_error: bool | None
) -> Callable[[Any], Any]:
    none_error = missing_is_error if none_is_error is None else none_is_error

    def to_tuple(sample: dict[str, Any]) -> tuple[Any, ...]:
        result = tuple(getfirst(sample, s, missing_is_error=missing_is_error) for s in specs)
        if none_error and any(v is None for v in result):
            raise ValueError(f"to_tuple {tuple(specs)} got {sample.keys()}{_which(sample)}")
        return result

    return to_tuple
