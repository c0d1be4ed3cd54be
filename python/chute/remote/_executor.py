"""The fetcher: one daemon thread running an asyncio loop that performs the
requests of a native FetchQueue with obstore's async API.

Why asyncio rather than a pool of threads blocking in obstore's sync calls:
an awaited request can be cancelled (the connection is dropped), so closing
a reader or a session stops its requests at once instead of leaving threads
blocked until a stalled server times out; and one thread serves any number
of requests in flight. The thread sleeps on the queue's eventfd; the I/O runs
on obstore's own runtime without the GIL; handing bytes to the engine is one
copy with the GIL released.

obstore answers an awaited call from one of its runtime's own threads: once
the request is over, that thread enters Python to check whether the future
was cancelled and, if not, hands the result to the loop with
call_soon_threadsafe (whose wake-up write releases the GIL). A native thread
that is inside Python, or waiting to enter it, once the interpreter has
begun to finalize is ended by a forced unwind that obstore's frames cannot
take, and the process aborts. So the loop tracks every future obstore
creates until its thread is done with it, and the fetcher does not exit
while one is outstanding: a closed session leaves no such thread behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from typing_extensions import TypeVarTuple, Unpack

from chute import _core
from chute.remote._stores import RemoteDependencyError, Stores, claim_runtime, obstore_module
from chute.remote._wholebody import (
    TooLargeForACopy,
    WholeBody,
    WholeCopy,
    WholeObjects,
    ranges_refused,
)

# A timer tick even when nothing wakes the loop: lets the queue fail requests
# the store never answered (FetchQueue.try_pop does that).
_TICK_S = 1.0
# How long a stopping fetcher waits for obstore's threads to be done with its
# futures (each is a moment's work once its request is over or cancelled),
# and how often it looks. Within RemoteSession's join.
_STORE_GRACE_S = 5.0
_STORE_POLL_S = 0.002
_Ts = TypeVarTuple("_Ts")
_STATUS = re.compile(r"status code: (\d{3})")
_RETRYABLE_STATUS = {408, 429}
# How obstore's errors (and the OS's) name a connection nobody accepted.
_CONNECTION_REFUSED = re.compile(r"ConnectionRefused|Connection refused")


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n\nDebug source", 1)[0].strip()
    lines = [line for line in text.splitlines() if line.strip()]
    message = " ".join(lines[:2]) if lines else type(exc).__name__
    return message[:1000]


def classify(exc: BaseException) -> tuple[str, int, str, bool]:
    """(kind, HTTP status or 0, message, retryable) for a failed request."""
    from obstore import exceptions as ox

    message = _first_line(exc)
    if isinstance(exc, (RemoteDependencyError, ValueError)) and not isinstance(exc, ox.BaseError):
        return "usage", 0, message, False
    if isinstance(exc, FileNotFoundError):
        return "io", 404, message, False
    if isinstance(exc, ox.PermissionDeniedError):
        return "io", 403, message, False
    if isinstance(exc, ox.UnauthenticatedError):
        return "io", 401, message, False
    if isinstance(exc, ox.PreconditionError):
        return "io", 412, "the object changed while it was being read: " + message, False
    if isinstance(
        exc, (ox.InvalidPathError, ox.NotSupportedError, ox.UnknownConfigurationKeyError)
    ):
        return "usage", 0, message, False
    if _CONNECTION_REFUSED.search(str(exc)):
        # Retried (a server may be restarting), but say what it most likely is.
        return "io", 0, message + " (connection refused: is the server running?)", True
    match = _STATUS.search(str(exc))
    if match is not None:
        status = int(match.group(1))
        return "io", status, message, status >= 500 or status in _RETRYABLE_STATUS
    if isinstance(exc, (ox.BaseError, TimeoutError, ConnectionError)):
        # No status: the connection failed, was cut, timed out, or the body was short.
        return "io", 0, message, True
    return "io", 0, f"{type(exc).__name__}: {message}", False


class _StoreFuture(asyncio.Future[Any]):
    """A future that obstore completes from its runtime's thread (see the
    module's docstring). That thread calls cancelled() first: when that is
    True it leaves Python at once, which ends its work on this future."""

    def __init__(self, loop: _FetchLoop) -> None:
        super().__init__(loop=loop)
        self._owner = loop

    def cancelled(self) -> bool:
        cancelled = super().cancelled()
        if cancelled and threading.get_ident() != self._owner.thread_id:
            self._owner.store_done(self)
        return cancelled


class _FetchLoop(asyncio.SelectorEventLoop):
    """The fetcher's event loop, which knows which of its futures obstore's
    threads have yet to answer."""

    def __init__(self) -> None:
        super().__init__()
        self.thread_id = threading.get_ident()
        self._store_call = False
        # Futures whose obstore thread has not yet left Python for good.
        self._outstanding: set[_StoreFuture] = set()

    @contextlib.contextmanager
    def store_call(self) -> Iterator[None]:
        """Around a call of obstore's async API: the future it creates is
        answered by obstore's thread. (Only the loop's thread creates futures.)"""
        self._store_call = True
        try:
            yield
        finally:
            self._store_call = False

    def create_future(self) -> asyncio.Future[Any]:
        if not self._store_call:
            return super().create_future()
        future = _StoreFuture(self)
        self._outstanding.add(future)
        return future

    def call_soon_threadsafe(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        finally:
            # obstore's thread hands over a result as (callback, future, ...);
            # the wake-up write is behind it, only returning is left.
            future = args[0] if args else None
            if isinstance(future, _StoreFuture):
                self.store_done(future)

    def store_done(self, future: _StoreFuture) -> None:
        self._outstanding.discard(future)

    @property
    def store_outstanding(self) -> int:
        return len(self._outstanding)

    async def wait_for_store_threads(self, timeout: float) -> None:
        deadline = self.time() + timeout
        while self._outstanding and self.time() < deadline:
            await asyncio.sleep(_STORE_POLL_S)


# The fetcher's thread (it lives as long as the process's remote session).
FETCH_THREAD_NAME = "chute-fetch"


class FetchExecutor:
    """Serves `queue` until it is closed; then the thread exits."""

    def __init__(
        self, queue: _core.FetchQueue, stores: Stores, max_concurrency: int, copy_limit: int
    ) -> None:
        self._queue = queue
        self._stores = stores
        self._limit = max_concurrency
        self._obstore: Any = obstore_module()
        self._thread = threading.Thread(target=self._run, name=FETCH_THREAD_NAME, daemon=True)
        # Objects of servers that ignore Range, read whole (see _wholebody).
        self._whole = WholeObjects(copy_limit)
        # What obstore's threads still owe the loop once it stopped (for tests).
        self.store_outstanding_at_exit = 0

    def start(self) -> None:
        claim_runtime()
        self._thread.start()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        loop = _FetchLoop()
        try:
            loop.run_until_complete(self._serve(loop))
        finally:
            self.store_outstanding_at_exit = loop.store_outstanding
            loop.close()

    async def _serve(self, loop: _FetchLoop) -> None:
        wake = asyncio.Event()
        queue = self._queue
        tasks: dict[int, asyncio.Task[None]] = {}

        def on_wake() -> None:
            queue.consume_wake()
            wake.set()

        def on_done(ticket_id: int, _task: asyncio.Task[None]) -> None:
            tasks.pop(ticket_id, None)
            wake.set()

        loop.add_reader(queue.wake_fd, on_wake)
        try:
            while True:
                wake.clear()
                if queue.closed:
                    break
                for ticket_id in queue.take_cancelled():
                    task = tasks.get(ticket_id)
                    if task is not None:
                        task.cancel()
                while len(tasks) < self._limit:
                    ticket = queue.try_pop()
                    if ticket is None:
                        break
                    task = loop.create_task(self._fetch(loop, ticket))
                    tasks[ticket.id] = task
                    task.add_done_callback(functools.partial(on_done, ticket.id))
                delay = queue.next_delay()
                timeout = _TICK_S if delay is None else min(delay, _TICK_S)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
        finally:
            loop.remove_reader(queue.wake_fd)
            pending = list(tasks.values())
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await loop.wait_for_store_threads(_STORE_GRACE_S)

    async def _fetch(self, loop: _FetchLoop, ticket: _core.FetchTicket) -> None:
        obstore = self._obstore
        try:
            store, path = self._stores.resolve(ticket.url)
            if ticket.op == "head":
                with loop.store_call():
                    head = obstore.head_async(store, path)
                meta = await head
                etag = meta["e_tag"] or ""
                version = etag or f"modified {meta['last_modified'].isoformat()}"
                ticket.complete_head(int(meta["size"]), etag, version)
                return
            if self._whole.ignores_ranges(ticket.url):
                await self._read_whole(loop, ticket, store, path)
                return
            options: dict[str, Any] = {"range": (ticket.offset, ticket.offset + ticket.length)}
            if ticket.if_match:
                options["if_match"] = ticket.if_match
            try:
                with loop.store_call():
                    get = obstore.get_async(store, path, options=options)
                result = await get
            except Exception as exc:
                if not ranges_refused(exc):
                    raise
                await self._read_whole(loop, ticket, store, path)
                return
            with loop.store_call():
                body = result.bytes_async()
            ticket.complete(await body)
        except asyncio.CancelledError:
            # The queue has already forgotten this request; a body being read
            # for it is dropped with it (its source was closed).
            self._whole.drop_body(ticket.url)
            raise
        except TooLargeForACopy as exc:
            self._whole.drop_copy(ticket.url)
            ticket.fail("usage", 0, str(exc), False)
        except Exception as exc:
            kind, status, message, retryable = classify(exc)
            ticket.fail(kind, status, message, retryable)

    async def _read_whole(
        self, loop: _FetchLoop, ticket: _core.FetchTicket, store: Any, path: str
    ) -> None:
        """A range of an object whose server ignores Range (see _wholebody)."""
        url, obstore = ticket.url, self._obstore
        if ticket.sequential:
            body = self._whole.body(url, lambda: WholeBody(loop, obstore, store, path))
            ticket.complete(await body.read(ticket.offset, ticket.length))
            return
        copy = self._whole.copy(url, lambda: WholeCopy(loop, obstore, store, path, url))
        data = await copy.read(ticket.offset, ticket.length, self._whole.copy_limit)
        self._whole.kept(url)
        ticket.complete(data)
