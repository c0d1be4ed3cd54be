"""Python threads that read for a native engine (the row-group readers of
``ParquetDataset`` and ``ParquetStream``), and how they end at exit.

They are daemon threads: the interpreter's exit must not wait for a read
that a stalled server holds (a ``concurrent.futures`` pool's threads are
joined before ``atexit`` runs, for as long as their reads take). Yet a
daemon thread still inside a native call when Python finalizes is ended by
a forced unwind, which native frames (pyarrow's, chute's) cannot take: the
process aborts. So at exit, before the engines close, every reader is told
to stop (its ``wake`` ends its wait for work), every remote object they read
is closed (a ranged read waiting on the network ends at once), every
remote session's requests are cancelled (for a read whose object is not
listed yet), and the readers are joined: a local read is a row group's
parse, a remote one ends within the fetcher's poll.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from chute.common import interpreter_exit

# How long exit waits for the readers, all of them together: once woken and
# their remote reads closed, each is left with at most one local parse.
_EXIT_JOIN_S = 30.0

_lock = threading.Lock()
_readers: dict[threading.Thread, Callable[[], None]] = {}  # thread -> its wake
# Remote objects the readers read through (``_core.RemoteRanges``), closed at exit.
_remote: weakref.WeakSet[Any] = weakref.WeakSet()
_stopping = threading.Event()


def stopping() -> bool:
    """Whether the process is exiting: a reader ends instead of starting a read."""
    return _stopping.is_set()


def start_reader(
    target: Callable[..., None], args: tuple[Any, ...], name: str, wake: Callable[[], None]
) -> threading.Thread:
    """Starts a daemon reader running ``target(*args)``; `wake` ends its
    wait for work (called at exit; it must not block)."""
    thread = threading.Thread(target=_run, args=(target, args), name=name, daemon=True)
    # Registered and started under the lock: exit joins only started
    # threads (a join before the start raises).
    with _lock:
        # A reader stays listed until it is gone, not just its target: its
        # thread-local data (pyarrow's readers) is freed after the target
        # returns, and freeing that lets the GIL go, which must not happen
        # once the interpreter finalizes. Exit joins every one listed.
        for done in [t for t in _readers if not t.is_alive() and t.ident is not None]:
            del _readers[done]
        _readers[thread] = wake
        try:
            thread.start()
        except BaseException:
            del _readers[thread]
            raise
    return thread


def _run(target: Callable[..., None], args: tuple[Any, ...]) -> None:
    if not _stopping.is_set():
        target(*args)


def close_at_exit(ranges: Any) -> None:
    """Closes `ranges` (a remote object's reader with ``close()``) at exit,
    unless it is collected first."""
    with _lock:
        _remote.add(ranges)


def _stop_readers() -> None:
    _stopping.set()
    with _lock:
        readers = list(_readers.items())
        remote = list(_remote)
    for _, wake in readers:
        with contextlib.suppress(Exception):
            wake()
    for ranges in remote:
        with contextlib.suppress(Exception):
            ranges.close()
    # Reads of remote objects not (or not yet) listed above end too. Only
    # a process that read remotely has sessions: nothing is imported here.
    session = sys.modules.get("chute.remote._session")
    if session is not None:
        with contextlib.suppress(Exception):
            session.cancel_every_request()
    deadline = time.monotonic() + _EXIT_JOIN_S
    for thread, _ in readers:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


interpreter_exit.at_exit(_stop_readers)
