"""Text shards tokenized into Megatron-LM token files, kept in a cache.

``tokenize_shards(urls, tokenizer, cache_dir)`` turns each input shard (a tar
shard of ``.txt``/``.json`` members, a JSON Lines file or a Parquet file's
string column; local or remote) into one ``.bin`` + ``.idx`` pair in
`cache_dir` and returns the ``.bin`` paths, in the order of `urls`. The
tokenizer is Hugging Face ``tokenizers``' (``pip install 'chute[tokenizers]'``):
its batch encoder runs in Rust on all cores with the GIL released, so a
reading thread parses the next documents while the current batch is encoded.

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

One input document is one sequence and one document (a sample of a tar
shard, a non-blank line of a JSON Lines file, a row of a Parquet file), in
input order.

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
import gzip
import hashlib
import json
import logging
import os
import queue
import re
import struct
import threading
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from chute import _core
from chute._core import DataError
from chute.datasets.parquet import RemoteFooter, pyarrow_module
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.remote_urls import expand_file_patterns
from chute.sources.shards import local_path

logger = logging.getLogger("chute")

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
# Megatron's DType codes for the two token types written here (it has no uint32).
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}

MANIFEST_FORMAT = "chute.token-cache"
# 2: a local input's SHA-256 is recorded (its size and modification time
# alone let an input rewritten with its time set back pass for the old one).
MANIFEST_VERSION = 2

# Text handed to one encode call (characters, documents): large enough that
# the tokenizer's threads share it out, small enough that reading and
# encoding overlap.
BATCH_TEXT_CHARS = 1 << 20
BATCH_DOCUMENTS = 4096
READ_CHUNK_BYTES = 8 << 20
# Batches read ahead of the encoder.
QUEUE_DEPTH = 4
# Batches encoded at once (see _build).
ENCODERS = 2
# How often a process waiting for an entry another process builds looks again.
LOCK_POLL_SECONDS = 0.05
# Shards whose input and cache entry are checked at once.
LOOKUP_THREADS = 16


@dataclass(frozen=True)
class TokenizeOptions:
    """What, besides the input and the tokenizer, decides the tokens."""

    text_key: str
    eod_id: int | None
    add_special_tokens: bool

    def record(self) -> dict[str, Any]:
        return {
            "text_key": self.text_key,
            "eod_id": self.eod_id,
            "add_special_tokens": self.add_special_tokens,
        }


@dataclass(frozen=True)
class InputIdentity:
    """The input as it is now: a local file's size and modification time, a
    remote object's size and ETag (else its modification time)."""

    url: str
    size: int
    version: str

    def record(self) -> dict[str, Any]:
        return {"url": self.url, "size": self.size, "version": self.version}


def as_tokenizer(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from one, from a transformers fast
    tokenizer (its ``backend_tokenizer``) or from a tokenizer.json path."""
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(
            "tokenizing text needs the tokenizers library: pip install 'chute[tokenizers]'"
        ) from exc
    if isinstance(tokenizer, (str, os.PathLike)):
        return tokenizers.Tokenizer.from_file(os.fspath(tokenizer))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, tokenizers.Tokenizer):
        return backend
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer
    raise TypeError(
        "tokenizer must be a tokenizers.Tokenizer, a transformers fast tokenizer or the path "
        f"of a tokenizer.json, not {type(tokenizer).__name__}"
    )


def id_bound(tokenizer: Any, eod_id: int | None) -> int:
    """One past the largest id the tokens can hold: the vocabulary (added
    tokens included) and the end-of-document id."""
    bound = int(tokenizer.get_vocab_size(with_added_tokens=True))
    return max(bound, eod_id + 1) if eod_id is not None else bound


def token_dtype(tokenizer: Any, eod_id: int | None) -> np.dtype[Any]:
    """uint16 when every id fits (below 65,536), else int32 (Megatron's
    .idx has no uint32)."""
    return np.dtype(np.uint16) if id_bound(tokenizer, eod_id) <= 0x10000 else np.dtype(np.int32)


def _input_kind(url: str) -> str:
    name = url.split("?", 1)[0].lower()
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        return "tar"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise ValueError(
        f"cannot tokenize {url!r}: expected a tar shard (.tar, .tar.gz, .tgz) of .txt/.json "
        "members, a JSON Lines file (.jsonl, .ndjson) or a Parquet file (.parquet)"
    )


class _Input:
    """One input shard: its identity now, and its bytes read as they were then."""

    def __init__(self, url: str, remote: RemoteOptions | None) -> None:
        self.url = url
        self.kind = _input_kind(url)
        self._ranges: Any = None
        if is_remote_url(url):
            self._ranges = get_session(remote).ranges(url)
            self.identity = InputIdentity(url, int(self._ranges.size), str(self._ranges.version))
            self.path: str | None = None
        else:
            path = local_path(url)
            if path is None:
                raise ValueError(f"cannot read {url!r}: not a local file or remote url")
            self.path = os.path.abspath(path)
            self.identity, self._changes = self._stat()
        self._sha256: str | None = None

    def _stat(self) -> tuple[InputIdentity, tuple[int, int]]:
        """The identity recorded, and what else changes with the file's bytes
        (its inode and status-change time, which cannot be set back)."""
        assert self.path is not None
        st = os.stat(self.path)
        identity = InputIdentity(self.path, st.st_size, f"mtime_ns:{st.st_mtime_ns}")
        return identity, (st.st_ino, st.st_ctime_ns)

    def sha256(self) -> str | None:
        """A local file's SHA-256 (read once); None for a remote object,
        whose ETag or modification time stands for its bytes."""
        if self.path is not None and self._sha256 is None:
            self._sha256 = _file_digest(self.path)
        return self._sha256

    def check_unchanged(self) -> None:
        """Raises when a local file changed since it was looked up (its
        digest taken) or while it was read (a remote object with a strong
        ETag is read with If-Match: a replaced one fails its next read)."""
        if self.path is not None and self._stat() != (self.identity, self._changes):
            raise DataError(f"{self.url}: the file changed while it was tokenized")

    def chunks(self) -> Iterator[bytes]:
        if self._ranges is not None:
            size = self.identity.size
            for offset in range(0, size, READ_CHUNK_BYTES):
                yield self._ranges.read(offset, min(READ_CHUNK_BYTES, size - offset))
            return
        assert self.path is not None
        with open(self.path, "rb") as f:
            while chunk := f.read(READ_CHUNK_BYTES):
                yield chunk

    def parquet_file(self) -> Any:
        """A pyarrow reader of this Parquet file: a remote one reads its
        footer and then only the text column's chunks, by ranges."""
        pq = pyarrow_module().parquet
        try:
            if self._ranges is not None:
                return pq.ParquetFile(RemoteFooter(self._ranges, self.url))
            assert self.path is not None
            return pq.ParquetFile(self.path)
        except (OSError, ValueError) as exc:
            raise DataError(f"{self.url}: not a readable Parquet file ({exc})") from None

    def tar_samples(self) -> list[Any]:
        if self._ranges is not None:
            data = b"".join(self.chunks())
            # The local reader inflates gzip by its magic; bytes in memory are not.
            if data[:2] == b"\x1f\x8b":
                try:
                    data = gzip.decompress(data)
                except (OSError, EOFError, zlib.error) as exc:
                    raise DataError(
                        f"{self.url}: the gzip stream does not inflate ({exc})"
                    ) from None
            return list(_core.read_tar_bytes(data, self.url))
        assert self.path is not None
        return list(_core.read_tar_samples(self.path))


def _utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _json_text(data: bytes, text_key: str, where: str) -> str:
    try:
        value = json.loads(_utf8(data, where))
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise DataError(f"{where}: a JSON {type(value).__name__}, not an object")
    if text_key not in value:
        keys = ", ".join(repr(k) for k in list(value)[:10])
        raise DataError(f"{where}: no {text_key!r} key (keys: {keys})")
    text = value[text_key]
    if not isinstance(text, str):
        raise DataError(f"{where}: {text_key!r} is a {type(text).__name__}, not a string")
    return text


def _jsonl_documents(source: _Input, text_key: str) -> Iterator[str]:
    line_number = 0
    rest = b""
    for chunk in chain(source.chunks(), [b"\n"]):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            line_number += 1
            if line.strip():
                yield _json_text(line, text_key, f"{source.url}: line {line_number}")


def _tar_documents(source: _Input, text_key: str) -> Iterator[str]:
    for key, members, offset in source.tar_samples():
        where = f"{source.url}: member {key}"
        if "txt" in members:
            yield _utf8(members["txt"], f"{where}.txt (offset {offset})")
        elif "json" in members:
            yield _json_text(members["json"], text_key, f"{where}.json (offset {offset})")
        else:
            names = ", ".join(sorted(members))
            raise DataError(
                f"{where} (offset {offset}): no .txt or .json member to tokenize (has: {names})"
            )


def _parquet_documents(source: _Input, text_key: str) -> Iterator[str]:
    pa = pyarrow_module()
    reader = source.parquet_file()
    schema = reader.schema_arrow
    if text_key not in schema.names:
        columns = ", ".join(repr(n) for n in schema.names[:10])
        raise DataError(f"{source.url}: no {text_key!r} column (columns: {columns})")
    kind = schema.field(text_key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{source.url}: column {text_key!r} holds {kind}, not strings")
    for group in range(reader.num_row_groups):
        try:
            column = reader.read_row_group(group, columns=[text_key]).column(0)
        except (OSError, ValueError) as exc:
            raise DataError(f"{source.url}: row group {group} does not read ({exc})") from None
        if column.null_count:
            row = column.is_null().to_pylist().index(True)
            raise DataError(f"{source.url}: row group {group}, row {row}: {text_key!r} is null")
        yield from column.to_pylist()


def documents(source: _Input, text_key: str) -> Iterator[str]:
    """The text of each document of `source`, in order."""
    if source.kind == "tar":
        return _tar_documents(source, text_key)
    if source.kind == "parquet":
        return _parquet_documents(source, text_key)
    return _jsonl_documents(source, text_key)


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_TEXT_CHARS or len(batch) >= BATCH_DOCUMENTS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


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


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


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
        self, expected: dict[str, Any], verify: bool, source: _Input | None = None
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
            if verify and _file_digest(path) != manifest.get(f"{what}_sha256"):
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


class _EntryWriter:
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
            "idx_sha256": _file_digest(self._tmp[self.entry.idx]),
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


class _EntryLock:
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


class _Claims:
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
        self._locks: dict[int, _EntryLock] = {}

    def claimed(self) -> Iterator[int]:
        """The entries this process builds, each locked, in order; waits
        for entries another process holds."""
        held_elsewhere: list[int] = []
        for i, entry in enumerate(self.entries):
            lock = _EntryLock(entry.lock)
            if not lock.try_acquire():
                held_elsewhere.append(i)
            elif self._still_needed(i, lock):
                yield i
        for i in held_elsewhere:
            lock = _EntryLock(self.entries[i].lock)
            while not lock.try_acquire():
                if self.stop.wait(LOCK_POLL_SECONDS):
                    return
            if self._still_needed(i, lock):
                yield i

    def _still_needed(self, i: int, lock: _EntryLock) -> bool:
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


class _Reader(threading.Thread):
    """Reads the shards this process claims, one after another, into
    batches of texts on a bounded queue: (shard, texts) items, (shard, None)
    at each shard's end, (None, None) after the last, and (None, exception)
    when reading fails."""

    def __init__(self, sources: Sequence[_Input], claims: _Claims, text_key: str) -> None:
        super().__init__(name="chute-tokenize-reader", daemon=True)
        self.sources = sources
        self.claims = claims
        self.text_key = text_key
        self.items: queue.Queue[tuple[int | None, Any]] = queue.Queue(QUEUE_DEPTH)
        self.stop = claims.stop

    def _put(self, item: tuple[int | None, Any]) -> bool:
        while not self.stop.is_set():
            try:
                self.items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        try:
            for i in self.claims.claimed():
                source = self.sources[i]
                for batch in _batches(documents(source, self.text_key)):
                    if not self._put((i, batch)):
                        return
                source.check_unchanged()
                if not self._put((i, None)):
                    return
            self._put((None, None))
        except BaseException as exc:
            self._put((None, exc))


def _encode(
    tokenizer: Any, texts: list[str], options: TokenizeOptions, dtype: np.dtype[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `texts`, concatenated (each document followed by the
    end-of-document id when there is one), and each document's length."""
    # encode_batch_fast (tokenizers 0.20+) gives encode_batch's ids without
    # computing character offsets.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encodings = encode(texts, add_special_tokens=options.add_special_tokens)
    # Each document's ids become an array in one C loop, and the arrays one
    # by concatenation: no Python step per token.
    documents = [np.array(e.ids, dtype=dtype) for e in encodings]
    lengths = np.fromiter(map(len, documents), dtype=np.int64, count=len(documents))
    tokens = np.concatenate(documents) if documents else np.zeros(0, dtype)
    if options.eod_id is not None:
        tokens = np.insert(tokens, np.cumsum(lengths), np.array(options.eod_id, dtype))
        lengths += 1
    return tokens, lengths


def _build(
    sources: Sequence[_Input],
    entries: Sequence[CacheEntry],
    descriptions: Sequence[dict[str, Any]],
    tokenizer: Any,
    options: TokenizeOptions,
    dtype: np.dtype[Any],
    verify: bool,
) -> None:
    claims = _Claims(entries, descriptions, verify, threading.Event())
    reader = _Reader(sources, claims, options.text_key)
    # Batches are encoded on ENCODERS threads, so that while one thread
    # turns its batch's ids into arrays (holding the GIL) the tokenizer's
    # own threads encode the next batch; their results are written in order.
    pool = ThreadPoolExecutor(max_workers=ENCODERS, thread_name_prefix="chute-tokenize-encode")
    # (shard, its next batch's encoding, or None for the shard's end)
    pending: deque[tuple[int, Future[tuple[np.ndarray, np.ndarray]] | None]] = deque()
    writer: _EntryWriter | None = None
    read_all = False
    failure: BaseException | None = None
    reader.start()
    try:
        while pending or not read_all:
            encoding = sum(future is not None for _, future in pending)
            if pending and (
                read_all or pending[0][1] is None or encoding > ENCODERS or reader.items.empty()
            ):
                shard, future = pending.popleft()
                if writer is None:
                    writer = _EntryWriter(entries[shard], dtype)
                if future is not None:
                    writer.add(*future.result())
                    continue
                writer.finish(descriptions[shard])
                writer = None
                claims.release(shard)
                continue
            read, item = reader.items.get()
            if read is None:
                # The shards read whole before a failure are still written.
                failure = item
                read_all = True
            elif item is None:
                pending.append((read, None))
            else:
                pending.append((read, pool.submit(_encode, tokenizer, item, options, dtype)))
        if failure is not None:
            raise failure
    finally:
        claims.stop.set()
        for _, future in pending:
            if future is not None:
                future.cancel()
        pool.shutdown(wait=True)
        if writer is not None:
            writer.abort()
        reader.join()
        claims.release_all()


def tokenize_shards(
    urls: str | os.PathLike[str] | Iterable[str],
    tokenizer: Any,
    cache_dir: str | os.PathLike[str],
    *,
    text_key: str = "text",
    eod_id: int | None = None,
    add_special_tokens: bool = True,
    read_only: bool = False,
    verify: bool = True,
    remote: RemoteOptions | None = None,
) -> list[str]:
    """Tokenizes text shards into Megatron ``.bin`` + ``.idx`` token files in
    `cache_dir` (one pair per shard) and returns the ``.bin`` paths in the
    order of `urls`; the ``.idx`` of each lies beside it.

    `urls`: tar shards (``.tar``, ``.tar.gz``, ``.tgz``) whose samples each
    hold a ``.txt`` member (the document) or a ``.json`` member (its
    `text_key` field is), or JSON Lines files (``.jsonl``, ``.ndjson``: the
    `text_key` field of each non-blank line), or Parquet files (``.parquet``:
    the `text_key` string column, row by row); local paths or remote urls,
    brace ranges and globs (local, and on s3/gs/az buckets) expanded.
    `tokenizer`: a ``tokenizers.Tokenizer``, a transformers fast tokenizer
    or a tokenizer.json path; padding must be off. `eod_id`: appended to every document when given.
    `add_special_tokens`: passed to the tokenizer (its post-processor's
    tokens, BOS for instance). Tokens are uint16 when every id fits, else
    int32.

    A shard whose entry is present and still describes it (same input size
    and modification time or ETag, same tokenizer, same options, a local
    input and files that match their recorded SHA-256; `verify=False` checks
    sizes and times only) is not tokenized again. Any other is tokenized
    again (a warning on the "chute" logger says why an existing entry was
    not used), or with
    `read_only=True` refused with a ``ValueError`` naming the shard and
    the reason. Bad input raises ``chute.DataError`` naming the file and
    line or member.
    """
    tok = as_tokenizer(tokenizer)
    if tok.padding is not None:
        raise ValueError(
            "the tokenizer pads its encodings, which would put padding between documents: "
            "call tokenizer.no_padding() first"
        )
    if eod_id is not None and eod_id < 0:
        raise ValueError(f"eod_id must be a token id (>= 0), not {eod_id}")
    options = TokenizeOptions(text_key, eod_id, add_special_tokens)
    dtype = token_dtype(tok, eod_id)
    tokenizer_sha256 = hashlib.sha256(tok.to_str().encode()).hexdigest()
    cache = os.fspath(cache_dir)
    if not read_only:
        os.makedirs(cache, exist_ok=True)
    key = json.dumps([tokenizer_sha256, options.record()], sort_keys=True)

    remote_options = remote if remote is not None else RemoteOptions()

    def look_up(url: str) -> tuple[str, _Input, CacheEntry, dict[str, Any], str | None]:
        source = _Input(url, remote_options)
        entry = CacheEntry.for_input(cache, source.identity.url, key)
        expected = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "input": source.identity.record(),
            "tokenizer_sha256": tokenizer_sha256,
            "options": options.record(),
        }
        problem = entry.problem(expected, verify, source)
        if problem is not None and source.sha256() is not None:
            # The entry built records the input's digest, taken before it is read.
            expected["input_sha256"] = source.sha256()
        return url, source, entry, expected, problem

    # A remote shard's HEAD and an entry's digests wait on the network and on
    # hashlib, both without the GIL: the shards are looked up side by side.
    with ThreadPoolExecutor(max_workers=LOOKUP_THREADS) as pool:
        looked_up = list(
            pool.map(look_up, expand_file_patterns(urls, remote_options, "text shard"))
        )
    todo: list[tuple[_Input, CacheEntry, dict[str, Any]]] = []
    for url, source, entry, expected, problem in looked_up:
        if problem is None:
            continue
        if read_only:
            raise ValueError(
                f"{url}: the token cache {cache} cannot be used ({problem}) and read_only=True"
            )
        if problem != "no cache entry":
            logger.warning("%s: tokenizing again: %s", url, problem)
        todo.append((source, entry, expected))
    if todo:
        sources, entries, descriptions = zip(*todo, strict=True)
        _build(sources, entries, descriptions, tok, options, dtype, verify)
    return [entry.bin for _, _, entry, _, _ in looked_up]
