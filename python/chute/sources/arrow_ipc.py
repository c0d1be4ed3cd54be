"""The layout of an Arrow IPC file (Feather version 2) read from its
message headers alone: the schema message and where each record batch lies,
the bodies stepped over, by pread on a local file or by ranged reads a
window at a time on a remote one."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from chute.common.errors import EngineDataError

# The IPC file format's magic, at its start (padded to 8 bytes) and end.
_FILE_MAGIC = b"ARROW1"
# A Feather version 1 file (a format of its own, before Arrow IPC).
_FEATHER_V1_MAGIC = b"FEA1"
# Message header types (the IPC format's MessageHeader union).
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
# A remote file's message headers are fetched this many bytes at a time
# (the headers of small record batches share a request).
_HEADER_WINDOW = 64 << 10


@dataclass(frozen=True)
class BatchLocation:
    """Where one record batch's message lies in its file."""

    offset: int
    length: int  # header, metadata and body
    rows: int
    compressed: bool  # its buffers are compressed (LZ4 or ZSTD frames)


class _Flat:
    """The fields of one flatbuffer table (the IPC format's message metadata
    is a flatbuffer: a table's fields are found through its vtable)."""

    def __init__(self, data: bytes, table: int) -> None:
        self.data = data
        self.table = table
        self.vtable = table - struct.unpack_from("<i", data, table)[0]
        self.vtable_size = struct.unpack_from("<H", data, self.vtable)[0]

    @classmethod
    def root(cls, data: bytes) -> _Flat:
        return cls(data, struct.unpack_from("<I", data, 0)[0])

    def _at(self, k: int) -> int:
        slot = 4 + 2 * k
        if slot + 2 > self.vtable_size:
            return 0
        offset: int = struct.unpack_from("<H", self.data, self.vtable + slot)[0]
        return self.table + offset if offset else 0

    def scalar(self, k: int, fmt: str) -> int:
        at = self._at(k)
        return int(struct.unpack_from(fmt, self.data, at)[0]) if at else 0

    def table_field(self, k: int) -> _Flat | None:
        at = self._at(k)
        if not at:
            return None
        return _Flat(self.data, at + struct.unpack_from("<I", self.data, at)[0])


def walk_messages(read: Any, size: int, url: str) -> tuple[bytes, list[BatchLocation]]:
    """The schema message and the record batches of an Arrow IPC file whose
    bytes `read(offset, n)` returns (`size` bytes in all), from the message
    headers alone (bodies are stepped over)."""
    head = bytes(read(0, min(size, 8)))
    if head.startswith(_FEATHER_V1_MAGIC):
        raise EngineDataError(
            f"'{url}' is a Feather version 1 file, which ArrowDataset does not read: write it "
            "again as Arrow IPC (pyarrow.feather.write_feather(version=2))"
        )
    end = size
    pos = 0
    if head.startswith(_FILE_MAGIC):
        pos = 8
        tail = bytes(read(size - 10, 10)) if size >= 18 else b""
        if tail[4:] != _FILE_MAGIC:
            raise EngineDataError(f"'{url}' is not a readable Arrow IPC file: its end is cut off")
        end = size - 10 - struct.unpack_from("<i", tail, 0)[0]
    schema: bytes | None = None
    batches: list[BatchLocation] = []
    while pos + 4 <= end:
        prefix = bytes(read(pos, min(8, end - pos)))
        (first,) = struct.unpack_from("<i", prefix, 0)
        if first == -1:  # a continuation marker, then the metadata's length
            if len(prefix) < 8:
                break
            (meta_len,) = struct.unpack_from("<i", prefix, 4)
            header = 8
        else:  # the format before Arrow 0.15: the length alone
            meta_len, header = first, 4
        if meta_len == 0:  # end of stream
            break
        if meta_len < 0 or pos + header + meta_len > end:
            raise EngineDataError(
                f"'{url}' is not a readable Arrow IPC file: the message at byte {pos} "
                f"declares {meta_len} bytes of metadata, past the file's end ({size} bytes)"
            )
        meta = bytes(read(pos + header, meta_len))
        try:
            message = _Flat.root(meta)
            kind = message.scalar(1, "<B")
            body = message.scalar(3, "<q")
            header_table = message.table_field(2)
        except struct.error:
            raise EngineDataError(
                f"'{url}' is not a readable Arrow IPC file: the message at byte {pos} has "
                "metadata that does not parse"
            ) from None
        length = header + meta_len + body
        if body < 0 or pos + length > end:
            raise EngineDataError(
                f"'{url}' is not a readable Arrow IPC file: the message at byte {pos} declares "
                f"a body of {body} bytes, past the file's end ({size} bytes)"
            )
        if kind == _SCHEMA and schema is None:
            schema = bytes(read(pos, header + meta_len))
        elif kind == _DICTIONARY_BATCH:
            raise EngineDataError(
                f"'{url}' holds dictionary-encoded columns, which ArrowDataset does not read: "
                "cast them to their value type (pyarrow's Table.cast, pandas' astype) and "
                "write the file again"
            )
        elif kind == _RECORD_BATCH:
            if schema is None or header_table is None:
                raise EngineDataError(
                    f"'{url}' is not a readable Arrow IPC file: a record batch at byte {pos} "
                    "comes before its schema"
                )
            rows = header_table.scalar(0, "<q")
            compressed = header_table.table_field(3) is not None
            batches.append(BatchLocation(pos, length, rows, compressed))
        pos += length
    if schema is None:
        raise EngineDataError(
            f"'{url}' is not a readable Arrow IPC file (no schema message at its start)"
        )
    return schema, batches


class LocalRanges:
    """`read(offset, n)` of a local file, by pread (no mapping)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def read(self, offset: int, n: int) -> bytes:
        with open(self._path, "rb", buffering=0) as f:
            return os.pread(f.fileno(), n, offset)


def walk_local_file(path: str, url: str) -> tuple[bytes, list[BatchLocation]]:
    """`walk_messages` of a local file, its headers read by pread."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise EngineDataError(f"'{url}' is not a readable Arrow IPC file: it is empty")
        return walk_messages(HeaderWindow(_Preads(f.fileno()), size), size, url)


class _Preads:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)


def layout_digest(schema: bytes, batches: list[BatchLocation]) -> str:
    text = json.dumps([[b.offset, b.length, b.rows] for b in batches])
    return hashlib.sha256(schema + text.encode()).hexdigest()[:16]


class HeaderWindow:
    """`read(offset, n)` over a remote object through ranged reads, a window
    of `_HEADER_WINDOW` bytes at a time (headers near each other share it)."""

    def __init__(self, ranges: Any, size: int) -> None:
        self._ranges = ranges
        self._size = size
        self._start = 0
        self._data = b""

    def __call__(self, offset: int, n: int) -> bytes:
        if not (self._start <= offset and offset + n <= self._start + len(self._data)):
            want = min(self._size - offset, max(n, _HEADER_WINDOW))
            self._data = bytes(self._ranges.read(offset, want))
            self._start = offset
        at = offset - self._start
        return self._data[at : at + n]
