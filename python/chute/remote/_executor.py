"""The fetcher: one daemon thread running an asyncio loop that performs the
requests of a native FetchQueue with obstore's async API.

Why asyncio rather than a pool of threads blocking in obstore's sync calls:
an awaited request can be cancelled (the connection is dropped), so closing
a reader or a session stops its requests at once instead of leaving threads
blocked until a stalled server times out; and one thread serves any number
of requests in flight. The thread sleeps on the queue's eventfd; the I/O runs
on obstore's own runtime without the GIL; handing bytes to the engine is one
copy with the GIL released.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
from typing import Any

from chute import _core
from chute.remote._stores import RemoteDependencyError, Stores, claim_runtime, obstore_module

# A timer tick even when nothing wakes the loop: lets the queue fail requests
# the store never answered (FetchQueue.try_pop does that).
_TICK_S = 1.0
_STATUS = re.compile(r"status code: (\d{3})")
_RETRYABLE_STATUS = {408, 429}


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
    match = _STATUS.search(str(exc))
    if match is not None:
        status = int(match.group(1))
        return "io", status, message, status >= 500 or status in _RETRYABLE_STATUS
    if isinstance(exc, (ox.BaseError, TimeoutError, ConnectionError)):
        # No status: the connection failed, was cut, timed out, or the body was short.
        return "io", 0, message, True
    return "io", 0, f"{type(exc).__name__}: {message}", False


class FetchExecutor:
    """Serves `queue` until it is closed; then the thread exits."""

    def __init__(self, queue: _core.FetchQueue, stores: Stores, max_concurrency: int) -> None:
        self._queue = queue
        self._stores = stores
        self._limit = max_concurrency
        self._obstore: Any = obstore_module()
        self._thread = threading.Thread(target=self._run, name="chute-fetch", daemon=True)

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
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
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
                    task = loop.create_task(self._fetch(ticket))
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

    async def _fetch(self, ticket: _core.FetchTicket) -> None:
        obstore = self._obstore
        try:
            store, path = self._stores.resolve(ticket.url)
            if ticket.op == "head":
                meta = await obstore.head_async(store, path)
                etag = meta["e_tag"] or ""
                version = etag or f"modified {meta['last_modified'].isoformat()}"
                ticket.complete_head(int(meta["size"]), etag, version)
                return
            options: dict[str, Any] = {"range": (ticket.offset, ticket.offset + ticket.length)}
            if ticket.if_match:
                options["if_match"] = ticket.if_match
            result = await obstore.get_async(store, path, options=options)
            ticket.complete(await result.bytes_async())
        except asyncio.CancelledError:
            raise  # the queue has already forgotten this request
        except Exception as exc:
            kind, status, message, retryable = classify(exc)
            ticket.fail(kind, status, message, retryable)
