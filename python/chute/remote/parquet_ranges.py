"""Parts of a remote Parquet file as pyarrow reads files (seek, tell, read):
its footer, fetched with one request at open, and the byte ranges of the
column chunks of a row group, fetched before pyarrow parses them from memory.
Which ranges a row group's columns need is read from its footer
(`column_chunk_spans`)."""

from __future__ import annotations

from typing import Any

# Column chunks of one row group closer than this are fetched with one request.
MERGE_GAP = 1 << 20


class ReadOnlyFile:
    """A read-only file over parts of a remote object, as pyarrow reads
    Python files (seek, tell, read); subclasses say where bytes come from."""

    def __init__(self, url: str, size: int) -> None:
        self.name = url
        self._size = size
        self._pos = 0
        self.closed = False

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes | memoryview:
        end = self._size if n < 0 else min(self._size, self._pos + n)
        data = self._bytes(self._pos, end) if end > self._pos else b""
        self._pos = max(self._pos, end)
        return data

    def _bytes(self, start: int, end: int) -> bytes | memoryview:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


class RemoteFooter(ReadOnlyFile):
    """A remote object's tail, where its footer is, fetched with one request
    (anything before it with another). `ranges` reads the object's bytes
    (``_core.RemoteRanges``)."""

    def __init__(self, ranges: Any, url: str) -> None:
        super().__init__(url, int(ranges.size))
        self._ranges = ranges
        tail = min(self._size, 1 << 16)
        self._tail_at = self._size - tail
        self._tail = bytes(ranges.read(self._tail_at, tail)) if tail else b""

    def _bytes(self, start: int, end: int) -> bytes:
        if start >= self._tail_at:
            return self._tail[start - self._tail_at : end - self._tail_at]
        return bytes(self._ranges.read(start, end - start))


class FetchedSpans(ReadOnlyFile):
    """Byte ranges of a remote object fetched ahead, read by pyarrow as the
    file they came from (a read outside them is a bug, reported)."""

    def __init__(self, url: str, size: int, spans: list[tuple[int, bytes]]) -> None:
        super().__init__(url, size)
        self._spans = spans

    def _bytes(self, start: int, end: int) -> memoryview:
        for at, data in self._spans:
            if at <= start and end <= at + len(data):
                return memoryview(data)[start - at : end - at]
        raise OSError(f"'{self.name}': bytes [{start}, {end}) were not fetched")


def column_chunk_spans(row_group: Any, columns: list[str]) -> list[tuple[int, int]]:
    """The byte ranges [start, end) of a row group's (pyarrow
    ``RowGroupMetaData``) chunks of `columns`, neighbours less than
    `MERGE_GAP` apart merged into one."""
    # pyarrow reads, for a column name, every leaf whose dotted path is
    # the name or starts with it: a column's own leaves, and for a name
    # with a dot ("a.b") also those of a struct's field of that path.
    names, prefixes = set(columns), tuple(f"{c}." for c in columns)
    spans = []
    for j in range(row_group.num_columns):
        chunk = row_group.column(j)
        path = chunk.path_in_schema
        if path not in names and not path.startswith(prefixes):
            continue
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        spans.append((start, start + chunk.total_compressed_size))
    spans.sort()
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + MERGE_GAP:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]
