"""Sidecar indexes for tar shards (``chute index``, ``chute.TarDataset``).

A shard ``data/shard-000000.tar`` gets ``data/shard-000000.tar.idx.json``,
or, when the indexes live in a directory of their own,
``DIR/shard-000000.tar.<16 hex digits>.idx.json``: the digits are a hash
of the shard's absolute path (or url), so ``train/shard-000000.tar`` and
``val/shard-000000.tar`` never share an index::

    {
      "format": "chute-tar-index",
      "version": 2,
      "shard": "/data/shard-000000.tar",  # absolute path, or url, when indexed
      "shard_size": 1290240,             # bytes; a shard of another size is stale
      "shard_mtime_ns": 1764108000000000000,
      "shard_version": "",               # a remote object's ETag when it was indexed
      "headers_digest": "9f86d081884c7d65",
      "samples": [
        {"key": "img000000", "offset": 0,
         "members": [["cls", 512, 1, 0], ["jpg", 1536, 20931, 1024]]},
        ...
      ]
    }

Per sample: its key, the byte offset of its first member's header, and per
member ``[extension, payload offset, payload size, header offset]``, in
archive order. The payload offset points at the first byte of the member's
data (after any PAX or GNU long-name headers), so one ``pread(size,
offset)`` reads it; the header offset is where the member's first header
block (extension headers included) starts. Samples are grouped by the
engine's own reader (``_core.scan_tar_index``, the key rule of
``csrc/tar/sample_key.h``): the key is the member path up to the first dot
of its basename, the extension the rest, lowercased; consecutive members
with the same key form one sample; metadata members (``__*__``) and names
without an extension are left out. A shard with a GNU sparse member cannot
be indexed: its payload is not one range of the shard. ``headers_digest``
is a 64-bit FNV-1a hash of those members' header bytes: what tells a
rewrite of the shard that kept its size apart from the shard indexed, and
what a loader state records of each shard.

An index is used only when it still describes its shard: it must be this
version, name the shard (its base name beside the shard, so a directory of
shards and their indexes can move; its full path in an index directory),
the shard's size and modification time must equal the recorded ones, and
the document must be whole (every sample with members, offsets increasing,
every member's headers before its payload, every payload inside the
shard). Anything else is stale or corrupt; ``load_indexes`` then rebuilds
it where it can write, and otherwise refuses it (`TarIndexError`), so wrong
offsets are never used to read. Since a shard can be rewritten with its
size and modification time put back, every read also checks each member
against the tar headers in front of its payload (name, size, where the
payload starts; natively, in the same read), and a member that does not
match fails with an error naming the shard, the member and its offsets.

JSON rather than a binary table: an index is read once per shard at open, its
size is about 70 bytes per member, and it stays readable with any tool.
"""

from __future__ import annotations

import hashlib
import json
import os
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
from chute.common.warning_types import IndexNotSavedWarning

INDEX_SUFFIX = ".idx.json"
FORMAT = "chute-tar-index"
VERSION = 2


class TarIndexError(ValueError):
    """An index that does not describe its shard (stale or corrupt) and could
    not be rebuilt where it lives."""


def shard_identity(shard: str | os.PathLike[str]) -> str:
    """What an index records of the shard it describes: a url as it is, a
    local path made absolute."""
    name = os.fspath(shard)
    return name if "://" in name else os.path.abspath(name)


def index_path(
    shard: str | os.PathLike[str], index_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Where the index of `shard` lives: beside it, or in `index_dir` under
    its base name and a hash of its full path (or url)."""
    if index_dir is None:
        return Path(os.fspath(shard) + INDEX_SUFFIX)
    identity = shard_identity(shard)
    digest = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    base = identity.rstrip("/").rsplit("/", 1)[-1]
    return Path(index_dir) / f"{base}.{digest}{INDEX_SUFFIX}"


def build_index(
    shard: str | os.PathLike[str], identity: str | None = None, version: str = ""
) -> dict[str, Any]:
    """Scans a shard once (headers only) and returns its index document,
    naming the shard `identity` (default: its absolute path) of `version`
    (a remote object's ETag; local files have none).

    Raises ``chute.DataError`` for a corrupt or truncated shard, a sample
    that repeats an extension (readers leave the repeat out; an index would
    not know which one) or a sparse member (its payload is not one range),
    and ``ValueError`` for a gzip-compressed shard.
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
    (
        keys,
        offsets,
        counts,
        extensions,
        member_offsets,
        member_sizes,
        header_offsets,
        digest,
    ) = _core.scan_tar_index(path)
    samples: list[dict[str, Any]] = []
    j = 0
    for key, offset, count in zip(keys, offsets.tolist(), counts.tolist(), strict=True):
        members = [
            [
                extensions[j + k],
                int(member_offsets[j + k]),
                int(member_sizes[j + k]),
                int(header_offsets[j + k]),
            ]
            for k in range(count)
        ]
        j += count
        samples.append({"key": key, "offset": offset, "members": members})
    return {
        "format": FORMAT,
        "version": VERSION,
        "shard": identity if identity is not None else shard_identity(path),
        "shard_size": int(st.st_size),
        "shard_mtime_ns": int(st.st_mtime_ns),
        "shard_version": version,
        "headers_digest": digest,
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
    that is stale (of another version of chute's format, or its shard has
    changed size or modification time since it was written), of another
    shard, or corrupt."""
    path = index_path(shard, index_dir)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TarIndexError(f"{path}: corrupt index of {os.fspath(shard)}: {exc}") from None
    problem = _problem(
        document, shard, os.stat(shard) if check else None, exact=index_dir is not None
    )
    if problem is not None:
        raise TarIndexError(f"{path}: {problem}")
    return document  # type: ignore[no-any-return]


def _problem(
    document: Any, shard: str | os.PathLike[str], st: os.stat_result | None, *, exact: bool
) -> str | None:
    """Why `document` cannot be used as the index of `shard` (stat `st`;
    None: the shard is not checked), or None when it can. With `exact`, the
    index must name the shard's full path (or url), else its base name (an
    index beside its shard moves with it)."""
    name = os.fspath(shard)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return f"not a {FORMAT} file (index of {name})"
    if document.get("version") != VERSION:
        return (
            f"is stale: {FORMAT} version {document.get('version')!r}, this chute reads and "
            f"writes version {VERSION} (index of {name})"
        )
    recorded = document.get("shard")
    identity = shard_identity(name)
    if not isinstance(recorded, str) or (
        recorded != identity
        if exact
        else recorded.rstrip("/").rsplit("/", 1)[-1] != identity.rstrip("/").rsplit("/", 1)[-1]
    ):
        return f"is the index of {recorded!r}, not of {identity}"
    size = document.get("shard_size")
    if st is not None and (size != st.st_size or document.get("shard_mtime_ns") != st.st_mtime_ns):
        return f"is stale: {name} changed after it was indexed (size or modification time)"
    samples = document.get("samples")
    if (
        not isinstance(size, int)
        or not isinstance(samples, list)
        or not isinstance(document.get("shard_version"), str)
        or not isinstance(document.get("headers_digest"), str)
    ):
        return f"corrupt index of {name}: no shard size, version, headers digest or sample list"
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
                    and len(m) == 4
                    and isinstance(m[0], str)
                    and all(isinstance(v, int) for v in m[1:])
                    and s["offset"] <= m[3] <= m[1] - 512
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
    member_header_offsets: np.ndarray  # int64, per member: first header block
    size: int  # the shard's, as indexed
    mtime_ns: int
    version: str  # a remote object's ETag; "" for a local file
    headers_digest: str

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
            member_header_offsets=np.array([m[3] for m in members], dtype=np.int64),
            size=int(document["shard_size"]),
            mtime_ns=int(document["shard_mtime_ns"]),
            version=str(document["shard_version"]),
            headers_digest=str(document["headers_digest"]),
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
    with an `IndexNotSavedWarning`.
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
                IndexNotSavedWarning,
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
