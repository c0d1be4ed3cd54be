"""A RemoteSession: the native fetch queue, its fetcher thread and the stores."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from types import TracebackType
from typing import Any

from chute import _core
from chute.remote._executor import FetchExecutor
from chute.remote._fileobj import RemoteFileObject
from chute.remote._options import RemoteOptions
from chute.remote._stores import (
    READ_ONLY_STORES,
    Stores,
    claim_runtime,
    is_remote_url,
    list_objects,
    obstore_module,
    store_of,
)

# How long close() waits for the fetcher thread: its requests are cancelled,
# so it only has to unwind.
_JOIN_S = 10.0


class RemoteFile:
    """A remote object read as a stream of bytes (see RemoteSession.open)."""

    def __init__(self, reader: _core.RemoteReader, url: str) -> None:
        self._reader = reader
        self.url = url

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (the rest when ``n < 0``); ``b""`` at the end.
        Raises chute.ReadError naming the url (and byte range) when the object
        cannot be read, TimeoutError when nothing arrives for too long."""
        return self._reader.read(n)

    def drain(self) -> int:
        """Reads the rest without keeping it (with a cache directory: what
        completes the cache entry); returns the bytes read."""
        return self._reader.drain()

    @property
    def in_place(self) -> bool:
        """True when the object is read from a mapped local file (a cache hit)."""
        return self._reader.in_place

    def close(self) -> None:
        """Stops a read in progress (in any thread) and drops the object's requests."""
        self._reader.close()

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RemoteSession:
    """Reads remote objects for one process: a native FetchQueue (the byte
    budget, retries and bounds of every remote source opened with it) and the
    fetcher thread serving it. Close it to cancel everything in flight; the
    thread exits. Not usable in a process forked after it was created."""

    def __init__(self, options: RemoteOptions | None = None) -> None:
        obstore_module()  # fail now, with the extra's name, if it is missing
        self.options = options if options is not None else RemoteOptions()
        o = self.options
        self.queue = _core.FetchQueue(
            range_bytes=o.range_bytes,
            max_in_flight=o.max_in_flight,
            prefetch_bytes=o.prefetch_bytes,
            retries=o.retries,
            backoff_s=o.backoff_s,
            max_backoff_s=o.max_backoff_s,
            timeout_s=o.timeout_s,
        )
        self._stores = Stores(o)
        self._pid = os.getpid()
        self._executor = FetchExecutor(
            self.queue, self._stores, o.max_concurrency, copy_limit=o.prefetch_bytes
        )
        self._executor.start()
        _live.add(self)

    def _check(self) -> None:
        if self.queue.closed:
            raise ValueError("this RemoteSession is closed")
        if os.getpid() != self._pid:
            raise RuntimeError("a RemoteSession cannot be used in a forked child: create one there")

    def source_options(self) -> dict[str, Any]:
        """What a native source needs to read remote urls (SourceOptions'
        ``remote``, ``cache_dir``, ``cache_limit_bytes``, ``cache_fsync``)."""
        self._check()
        o = self.options
        return {
            "remote": self.queue,
            "cache_dir": os.path.expanduser(o.cache_dir) if o.cache_dir else "",
            "cache_limit_bytes": o.cache_limit_bytes,
            "cache_fsync": o.cache_fsync,
        }

    def native_source(self) -> _core.SourceOptions:
        """source_options() as the engine's SourceOptions (plans and tar
        helpers take it)."""
        options = _core.SourceOptions()
        for name, value in self.source_options().items():
            setattr(options, name, value)
        return options

    def ranges(self, url: str) -> _core.RemoteRanges:
        """Random access to a remote object (its HEAD is sent and awaited):
        ``read(offset, size)`` returns exactly those bytes, retried as every
        remote read is."""
        self._check()
        if not is_remote_url(url):
            raise ValueError(f"not a remote url: {url!r}")
        return _core.RemoteRanges(url, self.queue)

    def file(self, url: str) -> RemoteFileObject:
        """A remote object as a seekable binary file (what h5py opens)."""
        return RemoteFileObject(self.ranges(url), url)

    def open(self, url: str) -> RemoteFile:
        """Opens a remote object for reading; its HEAD and first ranges are
        requested at once, so opening ahead of use prefetches it."""
        self._check()
        if not is_remote_url(url):
            raise ValueError(f"not a remote url: {url!r}")
        s = self.source_options()
        reader = _core.RemoteReader(
            url, s["remote"], s["cache_dir"], s["cache_limit_bytes"], s["cache_fsync"]
        )
        return RemoteFile(reader, url)

    def read_bytes(self, url: str) -> bytes:
        with self.open(url) as f:
            return f.read()

    def read_tar(self, url: str, in_place: bool = False) -> list[tuple[str, dict[str, bytes], int]]:
        """The samples of a remote tar shard as ``_core.read_tar_samples``
        gives them for a local one, parsed by the engine as the shard arrives."""
        self._check()
        s = self.source_options()
        return _core.read_remote_tar(
            url, s["remote"], s["cache_dir"], s["cache_limit_bytes"], in_place
        )

    def put(self, url: str, data: bytes) -> None:
        """Writes an object (``chute index`` puts a shard's index beside it).
        Stores without writes (http(s) servers, the Hugging Face Hub) refuse."""
        self._check()
        if store_of(url) in READ_ONLY_STORES:
            raise ValueError(f"cannot write {url!r}: http(s) and hf:// urls are read-only here")
        store, path = self._stores.resolve(url)
        claim_runtime()
        obstore_module().put(store, path, data)

    def list_objects(self, pattern: str) -> list[str]:
        """Object urls matching a glob on a bucket (``s3://b/train/*.tar``,
        ``**`` crosses directories), sorted. Brace patterns are expanded by
        the caller first."""
        self._check()
        return list_objects(self._stores, pattern)

    def stats(self) -> dict[str, int]:
        return self.queue.stats()

    def close(self) -> None:
        """Cancels every request queued or in flight (their readers raise) and
        stops the fetcher thread."""
        self.queue.close()
        if os.getpid() == self._pid:
            self._executor.join(_JOIN_S)

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_sessions: dict[tuple[int, tuple[object, ...]], RemoteSession] = {}
_sessions_lock = threading.Lock()
# Every session not yet collected, closed at exit if its owner did not: its
# fetcher must stop before the interpreter finalizes (see _executor).
_live: weakref.WeakSet[RemoteSession] = weakref.WeakSet()


def get_session(options: RemoteOptions | None = None) -> RemoteSession:
    """The process's session for these options (created on first use, closed
    at exit): datasets with equal options share one queue, one byte budget
    and one fetcher thread."""
    options = options if options is not None else RemoteOptions()
    key = (os.getpid(), options.key())
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None or session.queue.closed:
            session = RemoteSession(options)
            _sessions[key] = session
        return session


def cancel_every_request() -> None:
    """Cancels what every session of this process has queued or in flight
    (their readers raise), without waiting for the fetcher: at exit, a
    reader that opened an object but has not yet handed it over to be
    closed must not wait out the store's retries."""
    for s in _own_sessions():
        s.queue.close()


def _own_sessions(forget: bool = False) -> list[RemoteSession]:
    """The live sessions this process made (a forked child's copies are
    not its own); `forget` also drops the shared ones from the table."""
    with _sessions_lock:
        if forget:
            _sessions.clear()
        return [s for s in list(_live) if s._pid == os.getpid()]


@atexit.register
def _close_sessions() -> None:
    for s in _own_sessions(forget=True):
        s.close()
