"""Stages that pick a sample's members by file-name patterns, in Python:
``rename_keys``, ``extract_keys`` and ``xdecode`` (webdataset's)."""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any, ClassVar

from chute.stream.stages.base import Counter, PythonRun, Stage
from chute.stream.stages.fields import split_alternatives

StreamDecoder = Callable[[Any], Any]


@dataclass(eq=False)
class RenameKeys(Stage):
    """``rename_keys(*pairs, **names)``: members renamed by the patterns
    their file names match (later patterns win)."""

    kind: ClassVar[str] = "rename_keys"
    itemwise: ClassVar[bool] = True

    pairs: tuple[tuple[str, str], ...] = ()
    names: dict[str, str] = field(default_factory=dict)
    keep_unselected: bool = False
    must_match: bool = True
    duplicate_is_error: bool = True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        renamings = [(pattern, output) for output, pattern in self.pairs]
        renamings += [(pattern, output) for output, pattern in self.names.items()]
        return _rename_keys(
            items,
            run.count,
            renamings,
            self.keep_unselected,
            self.must_match,
            self.duplicate_is_error,
        )


@dataclass(eq=False)
class ExtractKeys(Stage):
    """``extract_keys(*patterns)``: tuples of the members matching each
    pattern (``"*.jpg;*.png"``: alternatives)."""

    kind: ClassVar[str] = "extract_keys"
    itemwise: ClassVar[bool] = True

    patterns: tuple[str | Sequence[str], ...] = ()
    duplicate_is_error: bool = True
    ignore_missing: bool = False

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        return _extract_keys(
            items, run.count, self.patterns, self.duplicate_is_error, self.ignore_missing
        )


@dataclass(eq=False)
class XDecode(Stage):
    """``xdecode(*pairs, **decoders)``: members decoded by the stream
    decoder of the pattern their file name matches (later wins)."""

    kind: ClassVar[str] = "xdecode"
    itemwise: ClassVar[bool] = True

    pairs: tuple[tuple[str, StreamDecoder], ...] = ()
    decoders: dict[str, StreamDecoder] = field(default_factory=dict)
    must_decode: bool = True
    defaults: Sequence[tuple[str, StreamDecoder]] = ()

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        decoders: list[tuple[str, Any]] = [*self.defaults, *self.pairs]
        decoders += [("*." + k, v) for k, v in self.decoders.items()]
        return _xdecode(items, run.count, decoders, self.must_decode)


def _rename_keys(
    items: Iterator[Any],
    count: Counter,
    renamings: list[tuple[str, str]],
    keep_unselected: bool,
    must_match: bool,
    duplicate_is_error: bool,
) -> Iterator[Any]:
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
    count: Counter,
    patterns: Sequence[str | Sequence[str]],
    duplicate_is_error: bool,
    ignore_missing: bool,
) -> Iterator[Any]:
    for sample in items:
        count(1)
        result = []
        for pattern in patterns:
            alternatives = split_alternatives(pattern)
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
    return pickle.load(stream)


# xdecode's defaults, as webdataset's: patterns over file names, later wins.
XDECODE_DEFAULTS: list[tuple[str, StreamDecoder]] = [
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
    count: Counter,
    decoders: list[tuple[str, Any]],
    must_decode: bool,
) -> Iterator[Any]:
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
