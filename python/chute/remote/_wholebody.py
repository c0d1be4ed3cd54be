"""Objects on HTTP servers that ignore ``Range`` (``python -m http.server``,
many static hosts and some proxies): they answer a ranged GET with status
200 and the whole body, which obstore refuses. A source that reads its
object in order (a shard as a stream) is then served from one plain GET of
the whole object: its ranges are cut from that body as it arrives.

Readers that jump around in an object (TarDataset's members, HDF5) cannot be
served this way without downloading it again and again: their requests are
refused with a message that says so."""

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


def random_access_message(url: str) -> str:
    return (
        f"the server of {url} ignores Range requests (it answers a ranged GET with the whole "
        "object), so it cannot be read at random: read its shards as streams (WebDataset), "
        "download it, or serve it with a server that supports ranges"
    )


class WholeBody:
    """One object read with a plain GET, its ranges served in order.

    Bytes that arrived are kept from the lowest offset a waiting range still
    needs (a sequential source has at most its ranges in flight waiting, so
    this is bounded by max_in_flight x range_bytes); a range behind what was
    kept (a retry) restarts the GET from the beginning."""

    def __init__(self, loop: Any, obstore: Any, store: Any, path: str) -> None:
        self._loop = loop
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
                    with self._loop.store_call():
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
        with self._loop.store_call():
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


class WholeBodies:
    """The objects of one session read as whole bodies, by url."""

    def __init__(self) -> None:
        self._bodies: OrderedDict[str, WholeBody] = OrderedDict()

    def get(self, url: str) -> WholeBody | None:
        body = self._bodies.get(url)
        if body is not None:
            self._bodies.move_to_end(url)
        return body

    def add(self, url: str, body: WholeBody) -> WholeBody:
        self._bodies[url] = body
        while len(self._bodies) > MAX_BODIES:
            self._bodies.popitem(last=False)
        return body

    def drop(self, url: str) -> None:
        self._bodies.pop(url, None)
