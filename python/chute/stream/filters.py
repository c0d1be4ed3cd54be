"""webdataset's pipeline filters (``webdataset.filters``' names), as recorded
stages.

``wds.shuffle(100)``, ``wds.decode("rgb8")``, ``wds.to_tuple("jpg", "cls")``,
``wds.batched(32)``... return the same `Stage` the fluent method of that
name records. In a ``DataPipeline`` (or ``.compose``) after
``tarfile_to_samples()``, the stages chute understands run on the native
engine exactly as the fluent chain does; called on an iterator, a stage runs
in Python as webdataset's filter does.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from chute.common.collate import default_collate
from chute.common.handlers import Handler, reraise_exception
from chute.decoding.decoders import IMAGE_SPECS
from chute.decoding.image_options import image_options
from chute.stream.autodecode import unknown_imagespec
from chute.stream.stages import (
    Associate,
    Batched,
    Decode,
    ExtractKeys,
    Info,
    LogKeys,
    Map,
    MapDict,
    MapTuple,
    Rename,
    RenameKeys,
    RSample,
    Select,
    Shuffle,
    Slice,
    Stage,
    ToTuple,
    Unbatched,
    Unlisted,
    XDecode,
)
from chute.stream.stages.fields import getfirst
from chute.stream.stages.patterns import XDECODE_DEFAULTS
from chute.stream.stages.shuffle import python_shuffle

default_collation_fn = default_collate


def shuffle(
    bufsize: int = 1000,
    initial: int = 100,
    rng: random.Random | None = None,
    seed: int | None = None,
    handler: Handler | None = None,
) -> Stage:
    """A shuffle buffer of `bufsize` items that starts yielding at `initial`."""
    if seed is not None and rng is not None:
        raise ValueError("shuffle: give seed= or rng=, not both")
    return Shuffle(bufsize, initial=initial, rng=rng, seed=seed)


def decode(
    *args: str | Callable[[str, bytes], Any],
    handler: Handler = reraise_exception,
    pre: Sequence[Callable[[str, bytes], Any]] | None = None,
    post: Sequence[Callable[[str, bytes], Any]] | None = None,
    only: str | Iterable[str] | None = None,
    partial: bool = False,
    size: int | tuple[int, int] | None = None,
    crop: str = "center",
    flip: bool = False,
    resize: int | None = None,
    scale: tuple[float, float] | None = None,
    ratio: tuple[float, float] | None = None,
    normalize: tuple[Any, Any] | None = None,
    dtype: torch.dtype | str | None = None,
    layout: str | None = None,
) -> Stage:
    """Decode each member: `args` are image specs (``"torchrgb8"``) and
    handler callables ``f(key, data)``, webdataset's `pre`/`post` handler
    lists, `only` (members to decode) and `partial`. chute's image options,
    run in C++ by the decoding thread (see the README): ``size=(h, w)`` with
    ``crop`` ``"center"`` (shorter side to the output, or to ``resize``
    first: torchvision's Resize(resize) + CenterCrop(size)), ``"random"``,
    ``"none"`` (plain resize) or ``"random_resized"`` (torchvision's
    RandomResizedCrop(size, scale, ratio)); ``flip`` mirrors half of the
    images at random; ``normalize=(mean, std)`` as torchvision's Normalize
    after ToTensor; ``dtype`` (uint8, float32, float16, bfloat16) and
    ``layout`` ("CHW", "HWC") override the image spec's."""
    for spec in args:
        if isinstance(spec, str) and spec.lower() not in IMAGE_SPECS:
            raise unknown_imagespec(spec)
    image_spec = next((s.lower() for s in args if isinstance(s, str)), None)
    opts = image_options(
        image_spec,
        size=size,
        crop=crop,
        flip=flip,
        resize=resize,
        scale=scale,
        ratio=ratio,
        normalize=normalize,
        dtype=dtype,
        layout=layout,
    )
    if isinstance(only, str):
        only = only.split()
    return Decode(
        args,
        handler=handler,
        image_options=opts,
        pre=list(pre) if pre is not None else None,
        post=list(post) if post is not None else None,
        only=set(only) if only is not None else None,
        partial=partial,
    )


def rename(keep: bool = True, handler: Handler = reraise_exception, **kw: str) -> Stage:
    """Rename members: ``rename(image="jpg;png")``; `keep` keeps the others."""
    return Rename(kw, keep=keep, handler=handler)


def to_tuple(
    *args: str,
    handler: Handler = reraise_exception,
    missing_is_error: bool = True,
    none_is_error: bool | None = None,
) -> Stage:
    """Dict samples to tuples of the named fields (``"jpg;png"``: the first
    present); one string with spaces names several."""
    if len(args) == 1 and isinstance(args[0], str) and " " in args[0]:
        args = tuple(args[0].split())
    return ToTuple(
        args, handler=handler, missing_is_error=missing_is_error, none_is_error=none_is_error
    )


def map(f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Stage:  # noqa: A001
    return Map(f, handler=handler)


def map_dict(handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> Stage:
    if not kw:
        raise ValueError("map_dict needs at least one field=function")
    for key, f in kw.items():
        if not callable(f):
            raise TypeError(f"map_dict: {key}= is not callable")
    return MapDict(kw, handler=handler)


def map_tuple(*args: Callable[[Any], Any] | None, handler: Handler = reraise_exception) -> Stage:
    return MapTuple(args, handler=handler)


def associate(
    associator: Callable[[str], dict[str, Any]] | Mapping[str, dict[str, Any]], **kw: Any
) -> Stage:
    """Adds to each dict sample the members `associator` gives its key:
    ``associator(key)``, or ``associator.get(key, {})`` for a mapping.
    Keywords are accepted and unused, as in webdataset."""
    return Associate(associator)


def select(predicate: Callable[[Any], bool]) -> Stage:
    return Select(predicate)


def batched(
    batchsize: int = 20,
    collation_fn: Callable[[list[Any]], Any] | None = default_collate,
    partial: bool = True,
) -> Stage:
    """Batches of `batchsize` items, collated by `collation_fn` (None: lists)."""
    if batchsize < 1:
        raise ValueError(f"batchsize must be >= 1, got {batchsize}")
    return Batched(batchsize, collation_fn=collation_fn, partial=partial)


def unbatched() -> Stage:
    return Unbatched()


def unlisted() -> Stage:
    return Unlisted()


def slice(*args: int | None) -> Stage:  # noqa: A001
    """``itertools.islice`` over the items: ``slice(10)``, ``slice(2, 20, 2)``."""
    return Slice(args)


def rsample(p: float = 0.5) -> Stage:
    """Keep each item with probability `p`."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"rsample: p must be in [0, 1], got {p}")
    return RSample(p)


def log_keys(logfile: str | None = None) -> Stage:
    """Append each sample's index, worker, rank and key to `logfile`."""
    return LogKeys(logfile)


def rename_keys(
    *args: tuple[str, str],
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **kw: str,
) -> Stage:
    """Rename members by file-name patterns: ``rename_keys(image="*.jpg")``."""
    return RenameKeys(
        args,
        kw,
        keep_unselected=keep_unselected,
        must_match=must_match,
        duplicate_is_error=duplicate_is_error,
    )


def extract_keys(
    *patterns: str | Sequence[str], duplicate_is_error: bool = True, ignore_missing: bool = False
) -> Stage:
    """Tuples of the members matching each pattern (``"*.jpg;*.png"``)."""
    return ExtractKeys(
        patterns, duplicate_is_error=duplicate_is_error, ignore_missing=ignore_missing
    )


def xdecode(
    *args: tuple[str, Callable[[Any], Any]],
    must_decode: bool = True,
    defaults: Sequence[tuple[str, Callable[[Any], Any]]] = XDECODE_DEFAULTS,
    **kw: Callable[[Any], Any],
) -> Stage:
    """Decode members by file-name pattern with stream decoders:
    ``xdecode(png=imread, cls=lambda s: int(s.read()))``."""
    return XDecode(args, kw, must_decode=must_decode, defaults=defaults)


def info(
    fmt: str | None = None,
    n: int = 3,
    every: int = -1,
    width: int = 50,
    stream: Any = None,
    name: str = "",
) -> Stage:
    """Print the first `n` samples (and every `every`-th) to `stream`."""
    return Info(fmt, n=n, every=every, width=width, stream=stream, name=name)


class _Curried:
    """``pipelinefilter(f)(*args, **kw)``: `f(data, *args, **kw)` as a stage
    function of the data alone (picklable when `f` is)."""

    def __init__(self, f: Callable[..., Iterator[Any]], *args: Any, **kw: Any) -> None:
        self.f, self.args, self.kw = f, args, kw

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        return self.f(data, *self.args, **self.kw)

    def __repr__(self) -> str:
        return f"<{getattr(self.f, '__name__', self.f)} {self.args} {self.kw}>"


def pipelinefilter(f: Callable[..., Iterator[Any]]) -> Callable[..., _Curried]:
    """Turns ``f(data, *args, **kw)`` into a stage factory, as webdataset's
    decorator does; its stages run in Python."""

    @functools.wraps(f)
    def factory(*args: Any, **kw: Any) -> _Curried:
        return _Curried(f, *args, **kw)

    return factory


class detshuffle:  # noqa: N801 (webdataset's name)
    """A shuffle whose seed is ``seed + epoch``, the epoch counting the
    iterations of this stage (or set with ``set_epoch``); in Python."""

    def __init__(
        self, bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1
    ) -> None:
        self.bufsize, self.initial, self.seed, self.epoch = bufsize, initial, seed, epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch - 1

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        self.epoch += 1
        rng = random.Random(self.seed + self.epoch)
        return python_shuffle(iter(src), self.bufsize, self.initial, rng)

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.run(src)


class Cached:
    """Keeps the items of the first complete pass in memory and yields them
    from there on later passes (in Python; the source still starts, but is
    not read)."""

    def __init__(self) -> None:
        self.cached: list[Any] | None = None

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        if self.cached is not None:
            yield from self.cached
            return
        items: list[Any] = []
        for item in source:
            items.append(item)
            yield item
        self.cached = items

    def __call__(self, source: Iterable[Any]) -> Iterator[Any]:
        return self.run(source)


class LMDBCached:
    """webdataset's ``LMDBCached`` (samples cached in an LMDB file) is not
    implemented: constructing one raises, saying what to use instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "chute.wds.LMDBCached is not implemented: cache samples in memory with "
            "wds.Cached(), or put webdataset.LMDBCached(fname) in a wds.DataPipeline "
            "(chute runs a stage it does not know in Python)"
        )


def transform_with(sample: Sequence[Any], transformers: Sequence[Any] | None) -> list[Any]:
    """`sample` with each value passed through the function at its position
    (None or a missing function: unchanged)."""
    if not transformers:
        return list(sample)
    if len(transformers) > len(sample):
        raise ValueError("transform_with: more transformers than values")
    result = list(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


__all__ = [
    "Cached",
    "LMDBCached",
    "associate",
    "batched",
    "decode",
    "default_collation_fn",
    "detshuffle",
    "extract_keys",
    "getfirst",
    "info",
    "log_keys",
    "map",
    "map_dict",
    "map_tuple",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "rsample",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "transform_with",
    "unbatched",
    "unlisted",
    "xdecode",
]
