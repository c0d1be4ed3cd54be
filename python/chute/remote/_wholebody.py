"""Objects on HTTP servers that ignore ``Range`` (``python -m http.server``,
many static hosts and some proxies): they answer a ranged GET with status
200 and the whole body, which obstore refuses. A source that reads its
object in order (a shard as a stream) is then served from one plain GET of
the whole object: its ranges are cut from that body as it arrives
(WholeBody).

Readers that jump around in an object (TarDataset's members, HDF5) get the
object downloaded whole and kept in memory (WholeCopy), within a bound on
all such copies of a session (its prefetch_bytes); a larger object is
refused with a message that says why."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

# What obstore says when a server answered a ranged GET with the whole body.
_RANGES_REFUSED = "Range request not supported"
# Objects read as whole bodies at once per session (each holds a connection
# and the bytes between its ranges in flight); the least recently used goes.
MAX_BODIES = 8
_CHUNK_BYTES = 1 << 20


def ranges_refused(exc: BaseException) -> bool:
    """Whether a ranged GET failed because the server ignores ``Range``."""
    from obstore import exceptions as ox

    return isinstance(exc, ox.NotSupportedError) and _RANGES_REFUSED in str(exc)


class TooLargeForACopy(Exception):
    """An object to be read at random is larger than the copies may hold."""

    def __init__(self, url: str, limit: int) -> None:
        super().__init__(
            f"the server of {url} ignores Range requests (it answers a ranged GET with the "
            f"whole object), and the object is larger than the {limit} bytes (prefetch_bytes) "
            "kept in memory of such objects to read them at random: read its shards as streams "
            "(WebDataset), raise prefetch_bytes, or serve it with a server that supports ranges"
        )


class WholeBody:
    """One object read with a plain GET, its ranges served in order.

    Bytes that arrived are kept from the lowest offset a waiting range still
    needs (a sequential source has at most its ranges in flight waiting, so
    this is bounded by max_in_flight x range_bytes); a range behind what was
    kept (a retry) restarts the GET from the beginning."""

    def __init__(self, calls: Any, obstore: Any, store: Any, path: str) -> None:
        self._calls = calls  # a StoreCalls
        self._obstore = obstore
        self._store = store
        self._path = path
        self._lock = asyncio.Lock()
        self._chunks: Any = None  # the body's async iterator; None: not started or cut
        self._start = 0  # the object offset of _kept[0]
        self._kept = bytearray()
        self._waiting: list[int] = []  # offsets of the ranges waiting to be served

    async def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length), fewer where the body ends first
        (which the queue retries as a short response)."""
        end = offset + length
        self._waiting.append(offset)
        try:
            async with self._lock:
                if self._chunks is None or offset < self._start:
                    await self._restart()
                while self._start + len(self._kept) < end:
                    with self._calls.store_call():
                        pending = self._chunks.__anext__()
                    try:
                        chunk = await pending
                    except StopAsyncIteration:
                        break
                    self._kept += memoryview(chunk)
                    self._drop_below(min(self._waiting))
                data = bytes(self._kept[offset - self._start : end - self._start])
        except BaseException:
            self._chunks = None  # cut or cancelled mid-body: the next read starts again
            raise
        finally:
            self._waiting.remove(offset)
        self._drop_below(min(self._waiting, default=end))
        return data

    async def _restart(self) -> None:
        with self._calls.store_call():
            get = self._obstore.get_async(self._store, self._path)
        result = await get
        self._chunks = result.stream(min_chunk_size=_CHUNK_BYTES)
        self._start = 0
        self._kept = bytearray()

    def _drop_below(self, offset: int) -> None:
        n = min(len(self._kept), offset - self._start)
        if n > 0:
            del self._kept[:n]
            self._start += n


class WholeCopy:
    """One object downloaded whole (once, by the first range asked for) and
    kept, for readers that read it at random."""

    def __init__(self, calls: Any, obstore: Any, store: Any, path: str, url: str) -> None:
        self._calls = calls  # a StoreCalls
        self._obstore = obstore
        self._store = store
        self._path = path
        self._url = url
        self._lock = asyncio.Lock()
        self.data: bytes | None = None

    async def read(self, offset: int, length: int, limit: int) -> bytes:
        """Bytes [offset, offset + length); raises TooLargeForACopy past `limit`."""
        async with self._lock:
            if self.data is None:
                self.data = await self._download(limit)
        return self.data[offset : offset + length]

    async def _download(self, limit: int) -> bytes:
        with self._calls.store_call():
            get = self._obstore.get_async(self._store, self._path)
        result = await get
        chunks = result.stream(min_chunk_size=_CHUNK_BYTES)
        body = bytearray()
        while True:
            with self._calls.store_call():
                pending = chunks.__anext__()
            try:
                chunk = await pending
            except StopAsyncIteration:
                return bytes(body)
            body += memoryview(chunk)
            if len(body) > limit:
                raise TooLargeForACopy(self._url, limit)


class WholeObjects:
    """What one session reads of servers that ignore Range: the urls known
    to be on such a server, the objects read in order (WholeBody, the
    MAX_BODIES used last), and the copies read at random (WholeCopy, the
    ones used last within `copy_limit` bytes in all)."""

    def __init__(self, copy_limit: int) -> None:
        self.copy_limit = copy_limit
        self._no_ranges: set[str] = set()
        self._bodies: OrderedDict[str, WholeBody] = OrderedDict()
        self._copies: OrderedDict[str, WholeCopy] = OrderedDict()

    def ignores_ranges(self, url: str) -> bool:
        return url in self._no_ranges

    def body(self, url: str, make: Any) -> WholeBody:
        """The object's WholeBody (`make()` builds one when there is none)."""
        self._no_ranges.add(url)
        body = self._bodies.get(url)
        if body is None:
            body = self._bodies[url] = make()
            while len(self._bodies) > MAX_BODIES:
                self._bodies.popitem(last=False)
        self._bodies.move_to_end(url)
        return body

    def copy(self, url: str, make: Any) -> WholeCopy:
        """The object's WholeCopy (`make()` builds one when there is none)."""
        self._no_ranges.add(url)
        copy = self._copies.get(url)
        if copy is None:
            copy = self._copies[url] = make()
        self._copies.move_to_end(url)
        return copy

    def kept(self, url: str) -> None:
        """After a copy was downloaded: the oldest others go beyond the limit."""
        total = sum(len(c.data or b"") for c in self._copies.values())
        for other in list(self._copies):
            if total <= self.copy_limit or other == url:
                break
            total -= len(self._copies.pop(other).data or b"")

    def drop_body(self, url: str) -> None:
        self._bodies.pop(url, None)

    def drop_copy(self, url: str) -> None:
        self._copies.pop(url, None)
