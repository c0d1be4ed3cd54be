"""Text shards read as documents, for the tokenizer: a tar shard of
``.txt``/``.json`` members, a JSON Lines file or a Parquet file's string
column, local or remote.

One input document is one sequence and one document (a sample of a tar
shard, a non-blank line of a JSON Lines file, a row of a Parquet file), in
input order.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from chute import _core
from chute._core import DataError
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.remote.parquet_ranges import RemoteFooter
from chute.sources.parquet_files import pyarrow_module
from chute.sources.shards import local_path

# Text handed to one encode call (characters, documents): large enough that
# the tokenizer's threads share it out, small enough that reading and
# encoding overlap.
BATCH_TEXT_CHARS = 1 << 20
BATCH_DOCUMENTS = 4096
READ_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class InputIdentity:
    """The input as it is now: a local file's size and modification time, a
    remote object's size and ETag (else its modification time)."""

    url: str
    size: int
    version: str

    def record(self) -> dict[str, Any]:
        return {"url": self.url, "size": self.size, "version": self.version}


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


class TextShard:
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
            self._sha256 = file_digest(self.path)
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


def _jsonl_documents(source: TextShard, text_key: str) -> Iterator[str]:
    line_number = 0
    rest = b""
    for chunk in chain(source.chunks(), [b"\n"]):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            line_number += 1
            if line.strip():
                yield _json_text(line, text_key, f"{source.url}: line {line_number}")


def _tar_documents(source: TextShard, text_key: str) -> Iterator[str]:
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


def _parquet_documents(source: TextShard, text_key: str) -> Iterator[str]:
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


def documents(source: TextShard, text_key: str) -> Iterator[str]:
    """The text of each document of `source`, in order."""
    if source.kind == "tar":
        return _tar_documents(source, text_key)
    if source.kind == "parquet":
        return _parquet_documents(source, text_key)
    return _jsonl_documents(source, text_key)


def text_batches(texts: Iterable[str]) -> Iterator[list[str]]:
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


def file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
