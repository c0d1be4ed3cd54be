"""The Python slow path: recorded stages applied item by item in Python, with
the semantics of webdataset's filters of the same names, for what follows
the native prefix of a WebDataset, for everything a WebLoader records, and
for a stage called on an iterator."""

from __future__ import annotations

import fcntl
import io
import itertools
import random
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

from chute.handlers import Handler, reraise_exception
from chute.image_options import has_transforms
from chute.wds.autodecode import decoder_of

if TYPE_CHECKING:
    from chute.wds.stages import Stage

# Stages whose failures the dataset's handler takes when their own handler
# is the default, wherever they run (see WebDataset's handler). A
# ``rename``/``to_tuple`` without a handler raises, as webdataset's does.
HANDLED_LIKE_NATIVE = frozenset({"decode"})


def _no_count(n: int) -> None:
    pass


def apply_python_stage(
    stage: Stage,
    items: Iterator[Any],
    count: Callable[[int], None] = _no_count,
    default_handler: Handler = reraise_exception,
) -> Iterator[Any]:
    """`items` through `stage`; `count(n)` is told of each item a per-item
    function sees (the slow-path counter of ``stats()``). `default_handler`
    stands in for the default handler of a stage that can also run natively."""
    kind = stage.kind
    handler: Handler = stage.kwargs.get("handler") or reraise_exception
    if kind in HANDLED_LIKE_NATIVE and handler is reraise_exception:
        handler = default_handler

    def guarded(fn: Callable[[Any], Any]) -> Iterator[Any]:
        for item in items:
            count(1)
            try:
                result = fn(item)
            except Exception as exn:
                if handler(exn):
                    continue
                return
            yield result

    if kind == "map":
        return _mapped(items, stage.args[0], handler, count)
    if kind == "map_dict":
        return guarded(_dict_mapper(stage.kwargs["fns"]))
    if kind == "map_tuple":
        return guarded(_tuple_mapper(stage.args))
    if kind == "select":
        predicate = stage.args[0]
        return (item for item in items if predicate(item))
    if kind == "batched":
        return python_batched(
            items, int(stage.args[0]), stage.kwargs["collation_fn"], stage.kwargs["partial"]
        )
    if kind == "unbatched":
        return python_unbatched(items)
    if kind == "unlisted":
        return _unlisted(items)
    if kind == "compose":
        # webdataset's pipeline stages (PipelineStage) have a run method
        # and need not be callable.
        f = stage.args[0]
        run = getattr(f, "run", None)
        return (run if callable(run) else f)(items)  # type: ignore[no-any-return]
    if kind == "shuffle":
        return python_shuffle(items, int(stage.args[0]), stage.kwargs)
    if kind == "decode":
        kw = stage.kwargs
        refuse_python_transforms(kw)
        return guarded(
            decoder_of(
                stage.args,
                pre=kw.get("pre"),
                post=kw.get("post"),
                only=kw.get("only"),
                partial=bool(kw.get("partial")),
            )
        )
    if kind == "rename":
        return guarded(_renamer(stage.kwargs["names"], stage.kwargs["keep"]))
    if kind == "to_tuple":
        return guarded(
            _tupler(stage.args, stage.kwargs["missing_is_error"], stage.kwargs["none_is_error"])
        )
    if kind == "slice":
        return itertools.islice(items, *stage.args)
    if kind == "rsample":
        p = float(stage.args[0])
        return (item for item in items if random.uniform(0.0, 1.0) < p)
    if kind == "log_keys":
        return _log_keys(items, stage.args[0])
    if kind == "rename_keys":
        return _rename_keys(items, count, *stage.args, **stage.kwargs)
    if kind == "extract_keys":
        return _extract_keys(items, count, *stage.args, **stage.kwargs)
    if kind == "xdecode":
        return _xdecode(items, count, *stage.args, **stage.kwargs)
    if kind == "info":
        return _info(items, **stage.kwargs)
    raise AssertionError(f"unknown stage {kind}")


def refuse_python_transforms(kwargs: dict[str, Any]) -> None:
    """Raises for a decode stage that runs in Python and asks for image
    options, which the engine alone applies."""
    if has_transforms(kwargs):
        raise ValueError(
            "decode's image options (size, crop, flip, normalize, dtype, layout) run in the "
            "engine only, and this decode runs in Python: it follows a Python stage (map, "
            "select, ...), has handler callables or pre/post handlers, belongs to a "
            "WebLoader or is called on an iterator; decode with one image spec before any "
            "Python stage of a WebDataset"
        )


def _mapped(
    items: Iterator[Any], f: Callable[[Any], Any], handler: Handler, count: Callable[[int], None]
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


def _alternatives(spec: str | Sequence[str]) -> list[str]:
    return spec.split(";") if isinstance(spec, str) else list(spec)


def getfirst(
    sample: dict[str, Any],
    keys: str | Sequence[str],
    default: Any = None,
    missing_is_error: bool = True,
) -> Any:
    """The value of the first of `keys` (a list, or names separated by ";")
    that `sample` has; else ValueError, or `default` when not `missing_is_error`."""
    names = _alternatives(keys)
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
            replaced = {alt for spec in names.values() for alt in _alternatives(spec)}
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


def python_shuffle(items: Iterator[Any], size: int, kwargs: dict[str, Any]) -> Iterator[Any]:
    """webdataset's shuffle buffer: up to `size` items, yielding from
    ``initial`` on, two items taken in per item given out while filling. With
    the same seed the order is webdataset's."""
    rng = kwargs.get("rng")
    if rng is None:
        rng = random.Random(kwargs.get("seed"))
    initial = min(int(kwargs.get("initial", 100)), size)
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


def _rename_keys(
    items: Iterator[Any],
    count: Callable[[int], None],
    *args: tuple[str, str],
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **kw: str,
) -> Iterator[Any]:
    renamings = [(pattern, output) for output, pattern in args]
    renamings += [(pattern, output) for output, pattern in kw.items()]
    for sample in items:
        count(1)
        out: dict[str, Any] = {}
        matched = dict.fromkeys((p for p, _ in renamings), False)
        for path, value in sample.items():
            fname = re.sub(r".*/", "", path)
            new_name = None
            for pattern, name in reversed(renamings):
                if fnmatch(fname.lower(), pattern):
                    matched[pattern] = True
                    new_name = name
                    break
            if new_name is None:
                if keep_unselected:
                    out[path] = value
                continue
            if new_name in out:
                if duplicate_is_error:
                    raise ValueError(f"Duplicate value in sample {sample.keys()} after rename.")
                continue
            out[new_name] = value
        if must_match and not all(matched.values()):
            raise ValueError(f"Not all patterns ({matched}) matched sample keys ({sample.keys()}).")
        yield out


def _extract_keys(
    items: Iterator[Any],
    count: Callable[[int], None],
    *patterns: str | Sequence[str],
    duplicate_is_error: bool = True,
    ignore_missing: bool = False,
) -> Iterator[Any]:
    for sample in items:
        count(1)
        result = []
        for pattern in patterns:
            alternatives = _alternatives(pattern)
            matches = [
                k for k in sample if any(fnmatch("." + k, p) or fnmatch(k, p) for p in alternatives)
            ]
            if not matches:
                if ignore_missing:
                    continue
                raise ValueError(f"Cannot find {alternatives} in sample keys {sample.keys()}.")
            if len(matches) > 1 and duplicate_is_error:
                raise ValueError(f"Multiple sample keys {sample.keys()} match {alternatives}.")
            result.append(sample[matches[0]])
        yield tuple(result)


def _decode_bin(stream: io.BytesIO) -> bytes:
    return stream.read()


def _decode_text(stream: io.BytesIO) -> str:
    return stream.read().decode("utf-8")


def _decode_pickle(stream: io.BytesIO) -> Any:
    import pickle

    return pickle.load(stream)


# xdecode's defaults, as webdataset's: patterns over file names, later wins.
XDECODE_DEFAULTS: list[tuple[str, Callable[[Any], Any]]] = [
    ("*.bin", _decode_bin),
    ("*.txt", _decode_text),
    ("*.pyd", _decode_pickle),
]


def _find_xdecoder(decoders: Sequence[tuple[str, Any]], path: str) -> Any:
    fname = re.sub(r".*/", "", path)
    if fname.startswith("__"):
        return False
    for pattern, fn in reversed(decoders):
        if fnmatch(fname.lower(), pattern) or fnmatch("." + fname.lower(), pattern):
            return fn
    return None


def _xdecode(
    items: Iterator[Any],
    count: Callable[[int], None],
    *args: tuple[str, Callable[[Any], Any]],
    must_decode: bool = True,
    defaults: Sequence[tuple[str, Callable[[Any], Any]]] = XDECODE_DEFAULTS,
    **kw: Callable[[Any], Any],
) -> Iterator[Any]:
    decoders: list[tuple[str, Any]] = [*defaults, *args]
    decoders += [("*." + k, v) for k, v in kw.items()]
    for sample in items:
        count(1)
        out: dict[str, Any] = {}
        for path, data in sample.items():
            if path.startswith("__"):
                out[path] = data
                continue
            decoder = _find_xdecoder(decoders, path)
            if decoder is False:
                out[path] = data
            elif decoder is None:
                if must_decode:
                    raise ValueError(f"No decoder found for {path}.")
                out[path] = data
            else:
                assert callable(decoder)
                out[path] = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
        yield out


def _info(
    items: Iterator[Any],
    fmt: str | None = None,
    n: int = 3,
    every: int = -1,
    width: int = 50,
    stream: Any = None,
    name: str = "",
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
