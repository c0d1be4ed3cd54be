"""The token cache's entries: Megatron-LM token files and the manifest that
vouches for them, written through temporary files and built under a lock.


The ``.idx`` layout is Megatron-LM's (megatron/core/datasets/indexed_dataset.py,
version 1), so Megatron and chute's TokenDataset both read the files:

    b"MMIDIDX\\x00\\x00"          9 bytes
    version                     u64 little-endian, 1
    dtype code                  u8 (8: uint16, 4: int32)
    sequence count N            u64
    document index count N + 1  u64
    sequence lengths            N x int32 (tokens)
    sequence pointers           N x int64 (byte offsets into the .bin)
    document indices            (N + 1) x int64: 0, 1, ..., N

A cache entry is three files, ``<name>.bin``, ``<name>.idx`` and
``<name>.json``; the last, its manifest, records what the entry describes
(the input's url, size and modification time or ETag, a local input's
SHA-256, the SHA-256 of the tokenizer's JSON serialisation, the options)
and the size and SHA-256 of the other two. It is written last, each file
by a rename of a finished temporary file, so an interrupted run leaves no
entry that passes the check.
An entry is used only when its manifest matches the input as it is now and
its files match their digests; otherwise the shard is tokenized again (a
warning on the "chute" logger says why), or, with ``read_only=True``, the
call raises naming the shard and what differs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from chute.tokenize.text_shards import TextShard, file_digest

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
# Megatron's DType codes for the two token types written here (it has no uint32).
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}

MANIFEST_FORMAT = "chute.token-cache"
# 2: a local input's SHA-256 is recorded (its size and modification time
# alone let an input rewritten with its time set back pass for the old one).
MANIFEST_VERSION = 2
# How often a process waiting for an entry another process builds looks again.
LOCK_POLL_SECONDS = 0.05


def write_idx(path: str, lengths: np.ndarray, dtype: np.dtype[Any]) -> None:
    """Writes Megatron's version-1 .idx for sequences of `lengths` tokens,
    each its own document."""
    count = len(lengths)
    pointers = np.zeros(count, dtype="<i8")
    if count:
        np.cumsum(lengths[:-1].astype("<i8") * dtype.itemsize, out=pointers[1:])
    with open(path, "wb") as f:
        f.write(IDX_MAGIC)
        f.write(struct.pack("<QBQQ", IDX_VERSION, DTYPE_CODES[dtype], count, count + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(count + 1, dtype="<i8").tobytes())


class CacheEntry:
    """``<stem>.bin``, ``.idx`` and ``.json`` (the manifest) in the cache, and
    ``<stem>.lock`` while a process builds them."""

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self.bin = stem + ".bin"
        self.idx = stem + ".idx"
        self.manifest = stem + ".json"
        self.lock = stem + ".lock"

    @staticmethod
    def for_input(cache_dir: str, url: str, key: str) -> CacheEntry:
        base = os.path.basename(url.split("?", 1)[0].rstrip("/")) or "shard"
        base = re.sub(
            r"(\.tar\.gz|\.tgz|\.tar|\.jsonl|\.ndjson|\.parquet)$", "", base, flags=re.IGNORECASE
        )
        base = re.sub(r"[^A-Za-z0-9._-]", "_", base)[:80]
        name = hashlib.sha256(f"{url}\n{key}".encode()).hexdigest()[:16]
        return CacheEntry(os.path.join(cache_dir, f"{base}-{name}"))

    def problem(
        self, expected: dict[str, Any], verify: bool, source: TextShard | None = None
    ) -> str | None:
        """Why this entry cannot stand for `expected` (None: it can); with
        `verify`, also the digests of its files and of `source`, its input."""
        if not os.path.exists(self.manifest):
            return "no cache entry"
        try:
            with open(self.manifest, encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError) as exc:
            return f"its manifest {self.manifest} cannot be read ({exc})"
        if not isinstance(manifest, dict):
            return f"its manifest {self.manifest} is not a JSON object"
        for field, want in expected.items():
            have = manifest.get(field)
            if have != want:
                return f"the cache entry was made for {field} {have!r}, not {want!r}"
        for path, what in ((self.bin, "bin"), (self.idx, "idx")):
            try:
                size = os.path.getsize(path)
            except OSError:
                return f"{path} is missing"
            if size != manifest.get(f"{what}_size"):
                return f"{path} has {size} bytes, its manifest says {manifest.get(what + '_size')}"
            if verify and file_digest(path) != manifest.get(f"{what}_sha256"):
                return f"{path} does not match the SHA-256 its manifest records"
        if verify and source is not None and source.sha256() != manifest.get("input_sha256"):
            return (
                f"the input {source.url} does not match the SHA-256 the manifest records "
                "(it was rewritten with the same size and modification time)"
            )
        return None


def recorded_id_range(bin_path: str) -> tuple[int, int] | None:
    """The smallest and largest token id of a ``.bin`` in the cache, as its
    manifest records them (None: no manifest, an entry written before they
    were recorded, or no tokens)."""
    try:
        with open(bin_path[: -len(".bin")] + ".json", encoding="utf-8") as f:
            manifest = json.load(f)
        low, high = manifest["min_token_id"], manifest["max_token_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(low, int) or not isinstance(high, int):
        return None
    return low, high


class EntryWriter:
    """Writes one cache entry through temporary files renamed into place."""

    def __init__(self, entry: CacheEntry, dtype: np.dtype[Any]) -> None:
        self.entry = entry
        self.dtype = dtype
        tag = f".tmp-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"
        self._tmp = {path: path + tag for path in (entry.bin, entry.idx, entry.manifest)}
        # Closed by finish() or abort(), whichever ends the entry.
        self._bin = open(self._tmp[entry.bin], "wb")  # noqa: SIM115
        self._digest = hashlib.sha256()
        self._bin_size = 0
        self._lengths: list[np.ndarray] = []
        self._id_range: tuple[int, int] | None = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        data = tokens.data.cast("B")
        self._bin.write(data)
        self._digest.update(data)
        self._bin_size += len(data)
        self._lengths.append(lengths)
        if len(tokens):
            low, high = int(tokens.min()), int(tokens.max())
            if self._id_range is not None:
                low, high = min(low, self._id_range[0]), max(high, self._id_range[1])
            self._id_range = (low, high)

    def finish(self, description: dict[str, Any]) -> None:
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        write_idx(self._tmp[self.entry.idx], lengths, self.dtype)
        manifest = {
            **description,
            "dtype": self.dtype.name,
            "documents": int(len(lengths)),
            "tokens": int(lengths.sum()),
            # TokenDataset.from_text checks ids against the vocabulary with these.
            "min_token_id": None if self._id_range is None else self._id_range[0],
            "max_token_id": None if self._id_range is None else self._id_range[1],
            "bin_size": self._bin_size,
            "bin_sha256": self._digest.hexdigest(),
            "idx_size": os.path.getsize(self._tmp[self.entry.idx]),
            "idx_sha256": file_digest(self._tmp[self.entry.idx]),
        }
        with open(self._tmp[self.entry.manifest], "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
        # The manifest goes first and comes back last: between the renames no
        # manifest vouches for a mix of old and new files.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.entry.manifest)
        for path in (self.entry.bin, self.entry.idx, self.entry.manifest):
            os.replace(self._tmp[path], path)

    def abort(self) -> None:
        self._bin.close()
        for tmp in self._tmp.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


class EntryLock:
    """An exclusive ``flock`` of an entry's ``.lock`` file, held by the
    process that builds the entry. Its holder removes the file before
    letting go; a process that dies holding it loses the lock with its
    descriptors, so no stale lock outlives it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            # A holder that let go after this open removed the file: a lock
            # on a removed file excludes no one, so lock the path's file anew.
            try:
                here = os.stat(self.path)
            except FileNotFoundError:
                os.close(fd)
                continue
            held = os.fstat(fd)
            if (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino):
                os.close(fd)
                continue
            self._fd = fd
            return True

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


class Claims:
    """Which of the entries to build this process builds, when several
    processes tokenize into one cache at once. An entry is built under its
    lock by the process that takes the lock first; the others pass over it,
    build the entries nobody holds, then wait for the held ones and use what
    their holder made (or build it, when the holder failed)."""

    def __init__(
        self,
        entries: Sequence[CacheEntry],
        expected: Sequence[dict[str, Any]],
        verify: bool,
        stop: threading.Event,
    ) -> None:
        self.entries = entries
        self.expected = expected
        self.verify = verify
        self.stop = stop
        self._locks: dict[int, EntryLock] = {}

    def claimed(self) -> Iterator[int]:
        """The entries this process builds, each locked, in order; waits
        for entries another process holds."""
        held_elsewhere: list[int] = []
        for i, entry in enumerate(self.entries):
            lock = EntryLock(entry.lock)
            if not lock.try_acquire():
                held_elsewhere.append(i)
            elif self._still_needed(i, lock):
                yield i
        for i in held_elsewhere:
            lock = EntryLock(self.entries[i].lock)
            while not lock.try_acquire():
                if self.stop.wait(LOCK_POLL_SECONDS):
                    return
            if self._still_needed(i, lock):
                yield i

    def _still_needed(self, i: int, lock: EntryLock) -> bool:
        # Another process may have built the entry since it was looked up.
        if self.entries[i].problem(self.expected[i], self.verify) is None:
            lock.release()
            return False
        self._locks[i] = lock
        return True

    def release(self, i: int) -> None:
        lock = self._locks.pop(i, None)
        if lock is not None:
            lock.release()

    def release_all(self) -> None:
        for i in list(self._locks):
            self.release(i)
