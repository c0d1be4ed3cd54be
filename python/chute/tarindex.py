"""Sidecar indexes for tar shards (``chute index``, ``chute.TarDataset``).

A shard ``data/shard-000000.tar`` gets ``data/shard-000000.tar.idx.json``
(or ``DIR/shard-000000.tar.idx.json`` when the indexes live in a directory
of their own)::

    {
      "format": "chute-tar-index",
      "version": 1,
      "shard": "shard-000000.tar",       # basename, so shard and index move together
      "shard_size": 1290240,             # bytes; a shard of another size is stale
      "shard_mtime_ns": 1764108000000000000,
      "samples": [
        {"key": "img000000", "offset": 0,
         "members": [["cls", 512, 1], ["jpg", 1536, 20931]]},
        ...
      ]
    }

Per sample: its key, the byte offset of its first member's header, and per
member ``[extension, payload offset, payload size]``, in archive order. The
payload offset points at the first byte of the member's data (after any PAX
or GNU long-name headers), so one ``pread(size, offset)`` reads it. Samples are
grouped by the engine's own reader (``_core.scan_tar_index``, the key rule of
``csrc/tar/sample_reader.cc``): the key is the member path up to the first dot
of its basename, the extension the rest, lowercased; consecutive members with
the same key form one sample; metadata members (``__*__``) and names without
an extension are left out.

An index is used only when it still describes its shard: the shard's size and
modification time must equal the recorded ones, and the document must be
whole (every sample with members, offsets increasing, every payload inside
the shard). Anything else is stale or corrupt; ``load_indexes`` then rebuilds
it where it can write, and otherwise refuses it (`TarIndexError`), so wrong
offsets are never used to read.

JSON rather than a binary table: an index is read once per shard at open, its
size is about 60 bytes per member, and it stays readable with any tool.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chute import _core

INDEX_SUFFIX = ".idx.json"
FORMAT = "chute-tar-index"
VERSION = 1

# The key rule of webdataset's base_plus_ext, for tools that look at member
# names one by one (chute inspect); indexes group members with the engine's
# reader instead.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")


class TarIndexError(ValueError):
    """An index that does not describe its shard (stale or corrupt) and could
    not be rebuilt where it lives."""


class ChuteIndexWarning(UserWarning):
    """Indexes were built but could not be saved: the next open builds them again."""


def split_member_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, or None when the engine skips it."""
    if _META_RE.match(name):
        return None
    match = _KEY_RE.match(name)
    if match is None:
        return None
    return match.group(1), _lower_ascii(match.group(2))


def _lower_ascii(text: str) -> str:
    # The engine lowercases ASCII only; str.lower() would also fold other letters.
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def index_path(
    shard: str | os.PathLike[str], index_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Where the index of `shard` lives: beside it, or in `index_dir`."""
    if index_dir is None:
        return Path(os.fspath(shard) + INDEX_SUFFIX)
    return Path(index_dir) / (os.path.basename(os.fspath(shard)) + INDEX_SUFFIX)


def build_index(shard: str | os.PathLike[str]) -> dict[str, Any]:
    """Scans a shard once (headers only) and returns its index document.

    Raises ``chute.DataError`` for a corrupt or truncated shard or a sample
    that repeats an extension (the engine refuses such shards too), and
    ``ValueError`` for a gzip-compressed shard.
    """
    path = os.fspath(shard)
    st = os.stat(path)
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            # Offsets into the inflated stream say nothing about the file.
            raise ValueError(
                f"{path} is gzip-compressed: an index needs a plain tar for random access "
                "(gunzip it; streaming it as a WebDataset shard reads it as it is)"
            )
    keys, offsets, counts, extensions, member_offsets, member_sizes = _core.scan_tar_index(path)
    samples: list[dict[str, Any]] = []
    j = 0
    for key, offset, count in zip(keys, offsets.tolist(), counts.tolist(), strict=True):
        members = [
            [extensions[j + k], int(member_offsets[j + k]), int(member_sizes[j + k])]
            for k in range(count)
        ]
        j += count
        samples.append({"key": key, "offset": offset, "members": members})
    return {
        "format": FORMAT,
        "version": VERSION,
        "shard": os.path.basename(path),
        "shard_size": int(st.st_size),
        "shard_mtime_ns": int(st.st_mtime_ns),
        "samples": samples,
    }


def _write_document(document: dict[str, Any], target: Path) -> None:
    """Writes `document` to `target` atomically, so a reader never sees half
    an index; processes that write the same index at once each use their own
    temporary file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    # One sample per line: compact, yet diffable and greppable.
    lines = [json.dumps(s, separators=(",", ":")) for s in document["samples"]]
    head = {k: v for k, v in document.items() if k != "samples"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "samples": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_index(
    shard: str | os.PathLike[str], output: str | os.PathLike[str] | None = None
) -> Path:
    """Builds the index of `shard` and writes it next to it (or to `output`)."""
    target = Path(output) if output is not None else index_path(shard)
    _write_document(build_index(shard), target)
    return target


def read_index(
    shard: str | os.PathLike[str],
    check: bool = True,
    index_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Loads the index of `shard`; with `check`, refuses (`TarIndexError`) one
    that is stale (its shard has changed size or modification time since it
    was written) or corrupt."""
    path = index_path(shard, index_dir)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TarIndexError(f"{path}: corrupt index of {os.fspath(shard)}: {exc}") from None
    problem = _problem(document, shard, os.stat(shard) if check else None)
    if problem is not None:
        raise TarIndexError(f"{path}: {problem}")
    return document  # type: ignore[no-any-return]


def _problem(document: Any, shard: str | os.PathLike[str], st: os.stat_result | None) -> str | None:
    """Why `document` cannot be used as the index of `shard` (stat `st`;
    None: the shard is not checked), or None when it can."""
    name = os.fspath(shard)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return f"not a {FORMAT} file (index of {name})"
    if document.get("version") != VERSION:
        return f"{FORMAT} version {document.get('version')!r} is not {VERSION} (index of {name})"
    if document.get("shard") != os.path.basename(name):
        return f"is the index of {document.get('shard')!r}, not of {name}"
    size = document.get("shard_size")
    if st is not None and (size != st.st_size or document.get("shard_mtime_ns") != st.st_mtime_ns):
        return f"is stale: {name} changed after it was indexed (size or modification time)"
    samples = document.get("samples")
    if not isinstance(size, int) or not isinstance(samples, list):
        return f"corrupt index of {name}: no shard size or sample list"
    previous = -1
    for i, s in enumerate(samples):
        ok = (
            isinstance(s, dict)
            and isinstance(s.get("key"), str)
            and isinstance(s.get("offset"), int)
            and s["offset"] > previous
            and isinstance(s.get("members"), list)
            and len(s["members"]) > 0
        )
        if ok:
            for m in s["members"]:
                ok = ok and (
                    isinstance(m, list)
                    and len(m) == 3
                    and isinstance(m[0], str)
                    and isinstance(m[1], int)
                    and isinstance(m[2], int)
                    and s["offset"] < m[1]
                    and m[2] >= 0
                    and m[1] + m[2] <= size
                )
        if not ok:
            return f"corrupt index of {name}: sample #{i} is malformed or lies outside the shard"
        previous = s["offset"]
    return None


@dataclass
class ShardColumns:
    """One shard's index as columns (what the engine reads through)."""

    keys: list[str]
    offsets: np.ndarray  # int64, per sample: first header
    member_counts: np.ndarray  # int64, per sample
    extensions: list[str]  # per member
    member_offsets: np.ndarray  # int64, per member: payload
    member_sizes: np.ndarray  # int64, per member
    size: int  # the shard's, as indexed
    mtime_ns: int

    @property
    def num_samples(self) -> int:
        return len(self.keys)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> ShardColumns:
        samples = document["samples"]
        members = [m for s in samples for m in s["members"]]
        return cls(
            keys=[s["key"] for s in samples],
            offsets=np.array([s["offset"] for s in samples], dtype=np.int64),
            member_counts=np.array([len(s["members"]) for s in samples], dtype=np.int64),
            extensions=[m[0] for m in members],
            member_offsets=np.array([m[1] for m in members], dtype=np.int64),
            member_sizes=np.array([m[2] for m in members], dtype=np.int64),
            size=int(document["shard_size"]),
            mtime_ns=int(document["shard_mtime_ns"]),
        )


def load_indexes(
    shards: Sequence[str],
    index_dir: str | os.PathLike[str] | None = None,
    *,
    threads: int = 1,
    progress: bool | None = None,
) -> list[ShardColumns]:
    """The index of every shard (local paths), read where it is current and
    built where it is missing, stale or corrupt. Builds run on `threads`
    threads (the scan runs without the GIL) and show progress on a terminal
    when there are several (`progress` None: when stderr is a TTY).

    A rebuilt index is saved (beside the shard, or in `index_dir`) for the
    next open. A stale or corrupt one that cannot be replaced there raises
    `TarIndexError`; a missing one that cannot be saved is used from memory
    with a `ChuteIndexWarning`.
    """
    result: list[ShardColumns | None] = [None] * len(shards)
    todo: list[tuple[int, str | None]] = []  # (shard, why the index is unusable; None: missing)
    for i, shard in enumerate(shards):
        path = index_path(shard, index_dir)
        if not path.exists():
            todo.append((i, None))
            continue
        try:
            result[i] = ShardColumns.from_document(read_index(shard, index_dir=index_dir))
        except (TarIndexError, OSError) as exc:
            todo.append((i, str(exc)))
    if todo:
        unsaved = _build_missing(shards, index_dir, todo, result, threads, progress)
        if unsaved:
            warnings.warn(
                f"{len(unsaved)} tar index(es) could not be saved (first: {unsaved[0]}); "
                "they are rebuilt on every open: pass index=DIR to keep them in a writable "
                "directory",
                ChuteIndexWarning,
                stacklevel=3,
            )
    return [r for r in result if r is not None]


def _build_missing(
    shards: Sequence[str],
    index_dir: str | os.PathLike[str] | None,
    todo: list[tuple[int, str | None]],
    result: list[ShardColumns | None],
    threads: int,
    progress: bool | None,
) -> list[str]:
    """Builds the indexes of `todo` into `result`; returns the ones that
    could not be saved (missing before). Raises for an unusable index that
    cannot be replaced."""
    unsaved: list[str] = []
    show = (sys.stderr.isatty() if progress is None else progress) and len(todo) > 1
    bar = _Progress(len(todo)) if show else None

    def build(item: tuple[int, str | None]) -> None:
        i, reason = item
        document = build_index(shards[i])
        target = index_path(shards[i], index_dir)
        try:
            _write_document(document, target)
        except OSError as exc:
            if reason is not None:
                raise TarIndexError(
                    f"{reason}; it cannot be rebuilt there ({exc}): run `chute index` where "
                    "the shard is writable, or pass index=DIR to keep indexes elsewhere"
                ) from None
            unsaved.append(str(target))
        result[i] = ShardColumns.from_document(document)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(todo)))) as pool:
            for _ in pool.map(build, todo):
                if bar is not None:
                    bar.update()
    finally:
        if bar is not None:
            bar.close()
    return unsaved


class _Progress:
    """Shards indexed so far: tqdm when installed, else one stderr line."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self._last = 0.0
        self._bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc="chute: indexing shards", unit="shard", file=sys.stderr)

    def update(self) -> None:
        self.count += 1
        if self._bar is not None:
            self._bar.update(1)
            return
        now = time.perf_counter()
        if now - self._last >= 0.5 or self.count == self.total:
            self._last = now
            sys.stderr.write(f"\rchute: indexing shards: {self.count}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


_COUNTS: dict[tuple[str, int, int, int], int] = {}


def indexed_sample_count(shard: str) -> int | None:
    """Samples in a local shard according to its sidecar index, when the index
    is there and current (never built here); None otherwise. Cached per
    (shard, size, modification time, index modification time)."""
    path = index_path(shard)
    try:
        st = os.stat(shard)
        key = (os.fspath(shard), st.st_size, st.st_mtime_ns, path.stat().st_mtime_ns)
    except OSError:
        return None
    if key not in _COUNTS:
        try:
            _COUNTS[key] = len(read_index(shard)["samples"])
        except (TarIndexError, OSError):
            return None
    return _COUNTS[key]
