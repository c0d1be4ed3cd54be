"""pyarrow's Parquet reader (the optional extra every Parquet reader of
chute loads through) and the readers of row groups over it: of a file, and
of a remote file's fetched byte ranges."""

from __future__ import annotations

from typing import Any

from chute.remote.parquet_ranges import FetchedSpans, column_chunk_spans

PAGE_READ_BYTES = 1 << 20


def pyarrow_module() -> Any:
    """pyarrow, with its parquet module loaded (the optional extra)."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ImportError(
            "chute reads Parquet with pyarrow: pip install 'chute[parquet]'"
        ) from None
    return pyarrow


def release_unused_memory() -> None:
    """Hands the memory Arrow's pool holds but no longer uses back to the
    OS. Its allocators keep freed memory for reuse (mimalloc's segments,
    glibc's arenas: several times the row groups in use, on the threads
    that read and dropped them), and RSS would settle that far above the
    cache's bound. Called only where row groups' memory was just freed,
    so that its cost is paid once per row group, not per batch."""
    pyarrow_module().default_memory_pool().release_unused()


class RowGroupFile:
    """A pyarrow reader of one Parquet file, as the readers use it: row
    groups read whole, one at a time on each reader thread, so without
    pre-buffering (a pre-buffering reader keeps the raw column chunks of
    the row group it read last, as many bytes again as the decoded row
    group, for as long as it lives, unseen by the cache's bound) and
    without pyarrow's own threads (the readers are the parallelism: more
    threads allocating keep more freed memory in their allocator heaps)."""

    def __init__(self, source: Any, metadata: Any) -> None:
        parquet = pyarrow_module().parquet
        self._file = parquet.ParquetFile(
            source, metadata=metadata, pre_buffer=False, buffer_size=PAGE_READ_BYTES
        )

    def read_row_group(self, group: int, columns: list[str]) -> Any:
        return self._file.read_row_group(group, columns=columns, use_threads=False)


class RangedRowGroupFile:
    """Row groups of a remote Parquet file: the byte ranges of the asked-for
    column chunks fetched with `ranges` (neighbours in one request), then
    parsed by pyarrow from memory."""

    def __init__(self, ranges: Any, url: str, size: int, metadata: Any) -> None:
        self._ranges = ranges
        self._url = url
        self._size = size
        self._metadata = metadata

    def read_row_group(self, group: int, columns: list[str]) -> Any:
        fetched = [
            (start, self._ranges.read(start, end - start))
            for start, end in column_chunk_spans(self._metadata.row_group(group), columns)
        ]
        source = FetchedSpans(self._url, self._size, fetched)
        return RowGroupFile(source, self._metadata).read_row_group(group, columns)
