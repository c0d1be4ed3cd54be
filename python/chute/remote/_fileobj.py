"""A remote object as a read-only, seekable binary file: what h5py opens to
describe a remote HDF5 file (its metadata), and what inspection reads.

Reads go through the session's native range reader (retries, timeouts,
If-Match). HDF5 metadata is many small reads scattered over the file, so
reads are served from aligned blocks kept in a small least-recently-used
set: a run of small reads near each other costs one request.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

from chute import _core

BLOCK_BYTES = 256 << 10
MAX_BLOCKS = 64  # 16 MiB


class RemoteFileObject(io.RawIOBase):
    """``ranges`` (a ``RemoteRanges``) read as a file named ``url``."""

    def __init__(
        self, ranges: _core.RemoteRanges, url: str, block_bytes: int = BLOCK_BYTES
    ) -> None:
        super().__init__()
        self._ranges = ranges
        self.name = url
        self._size = int(ranges.size)
        self._block = int(block_bytes)
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._pos = 0

    @property
    def size(self) -> int:
        return self._size

    @property
    def version(self) -> str:
        return str(self._ranges.version)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), max(0, self._size - self._pos))
        if n == 0:
            return 0
        first, last = self._pos // self._block, (self._pos + n - 1) // self._block
        self._fetch(first, last)
        done = 0
        while done < n:
            at = self._pos + done
            index, within = divmod(at, self._block)
            block = self._blocks[index]
            self._blocks.move_to_end(index)
            take = min(n - done, len(block) - within)
            view[done : done + take] = block[within : within + take]
            done += take
        self._pos += n
        return n

    def _fetch(self, first: int, last: int) -> None:
        """Reads the missing blocks of [first, last], each run of them with one request."""
        for k in range(first, last + 1):
            if k in self._blocks:
                self._blocks.move_to_end(k)  # kept by the trim below
        index = first
        while index <= last:
            if index in self._blocks:
                index += 1
                continue
            end = index
            while end + 1 <= last and end + 1 not in self._blocks:
                end += 1
            start = index * self._block
            stop = min(self._size, (end + 1) * self._block)
            data = self._ranges.read(start, stop - start)
            for k in range(index, end + 1):
                lo = (k - index) * self._block
                self._blocks[k] = data[lo : lo + self._block]
            index = end + 1
        while len(self._blocks) > max(MAX_BLOCKS, last - first + 1):
            self._blocks.popitem(last=False)

    def close(self) -> None:
        self._blocks.clear()
        super().close()
