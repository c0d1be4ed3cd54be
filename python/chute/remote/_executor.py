"""The fetcher: one daemon thread per process running an asyncio loop that
performs the requests of every open session's native FetchQueue with
obstore's async API. Sessions come and go (one per distinct set of options,
and those a user opens); the thread is shared so that they do not add
threads, and it ends when no session is open.

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
import os
import re
import threading
import time
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

    def __init__(self, loop: _FetchLoop, outstanding: set[_StoreFuture]) -> None:
        super().__init__(loop=loop)
        self._owner = loop
        self._outstanding = outstanding

    def cancelled(self) -> bool:
        cancelled = super().cancelled()
        if cancelled and threading.get_ident() != self._owner.thread_id:
            self.store_done()
        return cancelled

    def store_done(self) -> None:
        self._outstanding.discard(self)


class _FetchLoop(asyncio.SelectorEventLoop):
    """The fetcher's event loop, which knows which of its futures obstore's
    threads have yet to answer (each session's apart: see StoreCalls)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread_id: int | None = None  # set by the thread that runs it
        # Where the future of the obstore call being made goes (None: no such call).
        self._store_call: set[_StoreFuture] | None = None

    @contextlib.contextmanager
    def store_call(self, outstanding: set[_StoreFuture]) -> Iterator[None]:
        """Around a call of obstore's async API: the future it creates is
        answered by obstore's thread, and is in `outstanding` until that
        thread is done with it. (Only the loop's thread creates futures.)"""
        self._store_call = outstanding
        try:
            yield
        finally:
            self._store_call = None

    def create_future(self) -> asyncio.Future[Any]:
        outstanding = self._store_call
        if outstanding is None:
            return super().create_future()
        future = _StoreFuture(self, outstanding)
        outstanding.add(future)
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
                future.store_done()


class StoreCalls:
    """One session's calls of obstore's async API on the shared loop, and
    the futures of them that obstore's threads have yet to answer: a closing
    session waits for its own, not for those of the sessions that go on."""

    def __init__(self, loop: _FetchLoop) -> None:
        self._loop = loop
        self.outstanding: set[_StoreFuture] = set()

    def store_call(self) -> contextlib.AbstractContextManager[None]:
        return self._loop.store_call(self.outstanding)

    async def wait_for_store_threads(self, timeout: float) -> None:
        deadline = self._loop.time() + timeout
        while self.outstanding and self._loop.time() < deadline:
            await asyncio.sleep(_STORE_POLL_S)


# The fetcher's thread (it lives while a remote session of the process is open).
FETCH_THREAD_NAME = "chute-fetch"


class _LoopThread:
    """One run of the fetcher thread: its loop, and the sessions it serves."""

    def __init__(self) -> None:
        self.loop = _FetchLoop()
        self.thread = threading.Thread(target=self._run, name=FETCH_THREAD_NAME, daemon=True)
        self.sessions = 0  # counted under _Fetcher's lock
        self.idle = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()  # the loop holds its tasks weakly

    def _run(self) -> None:
        self.loop.thread_id = threading.get_ident()
        try:
            self.loop.run_until_complete(self.idle.wait())
        finally:
            self.loop.close()


class _Fetcher:
    """The process's fetcher: a thread started for the first session opened,
    serving every session opened while it runs, ended when the last one
    closes (the next session starts another)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: _LoopThread | None = None
        self._pid = os.getpid()

    def serve(self, executor: FetchExecutor) -> threading.Thread:
        """Serves `executor`'s queue on the fetcher thread (started if none
        runs) until it is closed; returns that thread."""
        with self._lock:
            current = self._current
            if current is None or self._pid != os.getpid():
                # A forked child has its parent's objects but not its thread.
                current = self._current = _LoopThread()
                self._pid = os.getpid()
                current.thread.start()
            current.sessions += 1
            current.loop.call_soon_threadsafe(self._begin, current, executor)
            return current.thread

    def _begin(self, current: _LoopThread, executor: FetchExecutor) -> None:
        task = current.loop.create_task(self._session(current, executor))
        current.tasks.add(task)
        task.add_done_callback(current.tasks.discard)

    async def _session(self, current: _LoopThread, executor: FetchExecutor) -> None:
        try:
            await executor.serve(current.loop)
        finally:
            with self._lock:
                current.sessions -= 1
                last = current.sessions == 0
                if last and self._current is current:
                    self._current = None  # a session opened from now on starts a thread
            # After the count: a join that sees the service ended sees the thread's end too.
            executor.finished.set()
            if last:
                current.idle.set()

    def ended(self, thread: threading.Thread) -> bool:
        """Whether `thread` serves no session any more (it is ending)."""
        with self._lock:
            return self._current is None or self._current.thread is not thread


_FETCHER = _Fetcher()


class FetchExecutor:
    """Serves `queue` on the process's fetcher thread until it is closed."""

    def __init__(
        self, queue: _core.FetchQueue, stores: Stores, max_concurrency: int, copy_limit: int
    ) -> None:
        self._queue = queue
        self._stores = stores
        self._limit = max_concurrency
        self._obstore: Any = obstore_module()
        self._thread: threading.Thread | None = None
        self.finished = threading.Event()
        # Objects of servers that ignore Range, read whole (see _wholebody).
        self._whole = WholeObjects(copy_limit)
        # What obstore's threads still owe the loop once it stopped (for tests).
        self.store_outstanding_at_exit = 0

    def start(self) -> None:
        claim_runtime()
        self._thread = _FETCHER.serve(self)

    def join(self, timeout: float) -> bool:
        """Waits for the queue's service to end, and for the thread too when
        no other session keeps it."""
        deadline = time.monotonic() + timeout
        if not self.finished.wait(timeout):
            return False
        thread = self._thread
        if thread is not None and _FETCHER.ended(thread):
            thread.join(max(0.0, deadline - time.monotonic()))
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and not self.finished.is_set()

    async def serve(self, loop: _FetchLoop) -> None:
        calls = StoreCalls(loop)
        try:
            await self._serve(loop, calls)
        finally:
            self.store_outstanding_at_exit = len(calls.outstanding)

    async def _serve(self, loop: _FetchLoop, calls: StoreCalls) -> None:
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
                    task = loop.create_task(self._fetch(calls, ticket))
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
            await calls.wait_for_store_threads(_STORE_GRACE_S)

    async def _fetch(self, calls: StoreCalls, ticket: _core.FetchTicket) -> None:
        obstore = self._obstore
        try:
            store, path = self._stores.resolve(ticket.url)
            if ticket.op == "head":
                with calls.store_call():
                    head = obstore.head_async(store, path)
                meta = await head
                etag = meta["e_tag"] or ""
                version = etag or f"modified {meta['last_modified'].isoformat()}"
                ticket.complete_head(int(meta["size"]), etag, version)
                return
            if self._whole.ignores_ranges(ticket.url):
                await self._read_whole(calls, ticket, store, path)
                return
            options: dict[str, Any] = {"range": (ticket.offset, ticket.offset + ticket.length)}
            if ticket.if_match:
                options["if_match"] = ticket.if_match
            try:
                with calls.store_call():
                    get = obstore.get_async(store, path, options=options)
                result = await get
            except Exception as exc:
                if not ranges_refused(exc):
                    raise
                await self._read_whole(calls, ticket, store, path)
                return
            with calls.store_call():
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
        self, calls: StoreCalls, ticket: _core.FetchTicket, store: Any, path: str
    ) -> None:
        """A range of an object whose server ignores Range (see _wholebody)."""
        url, obstore = ticket.url, self._obstore
        if ticket.sequential:
            body = self._whole.body(url, lambda: WholeBody(calls, obstore, store, path))
            ticket.complete(await body.read(ticket.offset, ticket.length))
            return
        copy = self._whole.copy(url, lambda: WholeCopy(calls, obstore, store, path, url))
        data = await copy.read(ticket.offset, ticket.length, self._whole.copy_limit)
        self._whole.kept(url)
        ticket.complete(data)
