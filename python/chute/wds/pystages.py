"""The Python slow path: recorded stages applied item by item in Python, for
what follows the native prefix of a WebDataset and for everything a
WebLoader records."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from chute.decoders import python_decode
from chute.handlers import Handler, reraise_exception
from chute.image_options import has_transforms
from chute.wds.stages import Stage


def apply_python_stage(
    stage: Stage, items: Iterator[Any], count: Callable[[int], None]
) -> Iterator[Any]:
    """`items` through `stage`; `count(n)` is told of each item a per-item
    function sees (the slow-path counter of ``stats()``)."""
    kind = stage.kind
    handler: Handler = stage.kwargs.get("handler", reraise_exception)

    def guarded(fn: Callable[[Any], Any]) -> Iterator[Any]:
        for item in items:
            count(1)
            try:
                yield fn(item)
            except Exception as exn:
                if handler(exn):
                    continue
                return

    if kind == "map":
        return guarded(stage.args[0])
    if kind == "map_dict":
        fns: dict[str, Callable[[Any], Any]] = stage.kwargs["fns"]

        def apply_dict(sample: dict[str, Any]) -> dict[str, Any]:
            sample = dict(sample)
            for key, fn in fns.items():
                sample[key] = fn(sample[key])
            return sample

        return guarded(apply_dict)
    if kind == "map_tuple":
        tuple_fns = stage.args

        def apply_tuple(sample: Sequence[Any]) -> tuple[Any, ...]:
            values = list(sample)
            for i, fn in enumerate(tuple_fns):
                if fn is not None:
                    values[i] = fn(values[i])
            return tuple(values)

        return guarded(apply_tuple)
    if kind == "select":
        predicate = stage.args[0]
        return (item for item in items if predicate(item))
    if kind == "batched":
        return python_batched(
            items, int(stage.args[0]), stage.kwargs["collation_fn"], stage.kwargs["partial"]
        )
    if kind == "unbatched":
        return python_unbatched(items)
    if kind == "compose":
        return stage.args[0](items)  # type: ignore[no-any-return]
    if kind == "shuffle":
        return python_shuffle(items, int(stage.args[0]), stage.kwargs)
    if kind == "decode":
        return guarded(python_decoder(stage))
    if kind == "rename":
        names: dict[str, str] = stage.kwargs["names"]
        keep = stage.kwargs["keep"]

        def rename(sample: dict[str, Any]) -> dict[str, Any]:
            out = dict(sample) if keep else {}
            if keep:
                for spec in names.values():
                    for alt in spec.split(";"):
                        out.pop(alt, None)
            for new, spec in names.items():
                out[new] = getfirst(sample, spec)
            return out

        return guarded(rename)
    if kind == "to_tuple":
        specs = stage.args
        return guarded(lambda sample: tuple(getfirst(sample, s) for s in specs))
    raise AssertionError(f"unknown stage {kind}")


def getfirst(sample: dict[str, Any], spec: str) -> Any:
    """The value of the first of `spec`'s ";"-separated names that `sample` has."""
    for alt in spec.split(";"):
        if alt in sample:
            return sample[alt]
    raise ValueError(f"didn't find {spec.split(';')} in {list(sample.keys())}")


def python_decoder(stage: Stage) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A decode stage as a function of one sample: handler callables first,
    then webdataset's default decoders under the stage's image spec."""
    if has_transforms(stage.kwargs):
        raise ValueError(
            "decode's image options (size, crop, flip, normalize, dtype, layout) run in the "
            "engine only, and this decode runs in Python: it follows a Python stage (map, "
            "select, ...), has handler callables, or belongs to a WebLoader; decode with one "
            "image spec before any Python stage of a WebDataset"
        )
    specs = stage.args
    image_spec = next((s.lower() for s in specs if isinstance(s, str)), None)
    callables = [s for s in specs if not isinstance(s, str)]

    def decode(sample: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in sample.items():
            if key.startswith("__") or not isinstance(value, bytes):
                out[key] = value
                continue
            result = None
            for fn in callables:
                result = fn("." + key, value)
                if result is not None:
                    break
            out[key] = result if result is not None else python_decode(key, value, image_spec)
        return out

    return decode


def python_batched(
    items: Iterator[Any], size: int, collation_fn: Callable[[list[Any]], Any] | None, partial: bool
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
    """The rows of each batch (a tuple batch is transposed)."""
    for batch in items:
        if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (str, bytes)):
            yield from zip(*batch, strict=True)
        else:
            yield from batch


def python_shuffle(items: Iterator[Any], size: int, kwargs: dict[str, Any]) -> Iterator[Any]:
    """webdataset's shuffle buffer of `size` items, started at ``initial``."""
    rng = kwargs.get("rng") or random.Random(kwargs.get("seed"))
    initial = min(int(kwargs.get("initial", 100)), size)
    buf: list[Any] = []
    for item in items:
        buf.append(item)
        if len(buf) >= initial:
            j = rng.randrange(len(buf))
            buf[j], buf[-1] = buf[-1], buf[j]
            if len(buf) >= size:
                yield buf.pop()
    rng.shuffle(buf)
    yield from buf
