"""webdataset's decoding in Python (``webdataset.autodecode``'s names): the
handler chain a ``.decode(...)`` stage runs on the slow path.

A ``Decoder`` tries, for each member of a sample, its pre handlers (by
default ``gzfilter``: a ``.gz`` member is inflated and decoding continues
under the name without ``.gz``), then the handlers it was given (an image
spec string becomes an ``ImageHandler``), then its post handlers (by default
``basichandlers``: text, integers, json, pickle, npy, npz, tenbin, msgpack,
cbor, torch); the first that returns something other than None decides. A
failure is raised as ``DecodingError`` naming the sample and member, with the
original exception as its cause.

Natively run decode stages (an image spec or none, default pre/post) never
get here; their members decode to the same values in C++.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chute.common.errors import DecodingError
from chute.decoding.decoders import IMAGE_SPECS, basic_decoder, decode_image_python, gunzip_name
from chute.decoding.extensions import IMAGE_EXTENSIONS, last_extension

DecodeHandler = Callable[[str, bytes], Any]

# webdataset's name for the image specs.
imagespecs = IMAGE_SPECS


def unknown_imagespec(spec: str) -> ValueError:
    """The error for an image spec that is not one of IMAGE_SPECS (its first
    words are webdataset's)."""
    return ValueError(
        f"Unknown imagespec: {spec} (valid specs: {', '.join(IMAGE_SPECS)}; "
        "or a handler callable f(key, data))"
    )


class Continue:
    """Returned by a handler that transformed a member but leaves the
    decoding to the handlers after it: decode `data` under the name `key`."""

    def __init__(self, key: str, data: bytes) -> None:
        self.key, self.data = key, data


def gzfilter(key: str, data: bytes) -> Continue | None:
    """Inflates ``.gz`` members; decoding continues without the ``.gz``."""
    if not key.endswith(".gz"):
        return None
    name, inflated = gunzip_name(key, data)
    return Continue(name, inflated)


def basichandlers(key: str, data: bytes) -> Any:
    """webdataset's decoders of non-image members, by the last extension."""
    fn = basic_decoder(key)
    return None if fn is None else fn(data)


class ImageHandler:
    """Decodes members whose last extension is an image type, to `imagespec`
    (see ``imagespecs``)."""

    def __init__(self, imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        if imagespec.lower() not in IMAGE_SPECS:
            raise unknown_imagespec(imagespec)
        self.imagespec = imagespec.lower()
        self.extensions = set(extensions)

    def __call__(self, key: str, data: bytes) -> Any:
        if last_extension(key).lower() not in self.extensions:
            return None
        return decode_image_python(data, self.imagespec)


def imagehandler(imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    return ImageHandler(imagespec, extensions)


def _call_for_extensions(
    key: str, data: bytes, f: Callable[[bytes], Any], extensions: list[list[str]]
) -> Any:
    parts = key.lower().split(".")
    for target in extensions:
        if len(target) <= len(parts) and parts[-len(target) :] == target:
            return f(data)
    return None


def handle_extension(extensions: str, f: Callable[[bytes], Any]) -> DecodeHandler:
    """A handler calling `f(data)` for members whose name ends in one of the
    space-separated `extensions` (each may have dots: ``"seg.jpg"``)."""
    targets = [e.split(".") for e in extensions.lower().split()]
    return functools.partial(_call_for_extensions, f=f, extensions=targets)


class Decoder:
    """Decodes whole samples with a chain of handlers (see the module docstring).

    `only`: decode only these members (names or a space-separated string);
    `partial`: leave values that are not bytes as they are (otherwise they
    are an error)."""

    def __init__(
        self,
        handlers: Sequence[DecodeHandler],
        pre: Sequence[DecodeHandler] | None = None,
        post: Sequence[DecodeHandler] | None = None,
        only: str | Iterable[str] | None = None,
        partial: bool = False,
    ) -> None:
        if isinstance(only, str):
            only = only.split()
        self.only = None if only is None else set(only)
        chain = [
            *(pre if pre is not None else [gzfilter]),
            *handlers,
            *(post if post is not None else [basichandlers]),
        ]
        for handler in chain:
            if not callable(handler):
                raise TypeError(f"decode handler {handler!r} is not callable")
        self.handlers = chain
        self.partial = partial

    def decode1(self, key: str, data: bytes) -> Any:
        """One member, named by its key in the sample."""
        name = "." + key
        for handler in self.handlers:
            result = handler(name, data)
            if isinstance(result, Continue):
                name, data = result.key, result.data
                continue
            if result is not None:
                return result
        return data

    def decode(self, sample: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(sample, dict):
            raise TypeError(f"decode expects dict samples, got {type(sample).__name__}")
        result: dict[str, Any] = {}
        for k, v in sample.items():
            try:
                if k.startswith("__"):
                    if isinstance(v, bytes):
                        v = v.decode("utf-8", errors="surrogateescape")
                    result[k] = v
                elif self.only is not None and k not in self.only:
                    result[k] = v
                elif isinstance(v, bytes):
                    result[k] = self.decode1(k, v)
                elif self.partial:
                    result[k] = v
                else:
                    raise TypeError(f"member {k!r} is {type(v).__name__}, not bytes")
            except Exception as exn:
                raise DecodingError(
                    url=sample.get("__url__"),
                    key=sample.get("__key__"),
                    k=k,
                    sample=sample,
                    message=f"cannot decode member {k!r} of sample {sample.get('__key__')!r} "
                    f"in {sample.get('__url__')!r}: {type(exn).__name__}: {exn}",
                ) from exn
        return result

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return self.decode(sample)


def decoder_of(
    specs: Sequence[str | DecodeHandler],
    pre: Sequence[DecodeHandler] | None = None,
    post: Sequence[DecodeHandler] | None = None,
    only: str | Iterable[str] | None = None,
    partial: bool = False,
) -> Decoder:
    """The Decoder of a ``.decode(*specs, ...)`` stage."""
    handlers = [ImageHandler(s) if isinstance(s, str) else s for s in specs]
    return Decoder(handlers, pre=pre, post=post, only=only, partial=partial)


__all__ = [
    "Continue",
    "Decoder",
    "DecodingError",
    "ImageHandler",
    "basichandlers",
    "decoder_of",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
]
