"""What chute does when the interpreter exits with threads still loading.

Once Python finalizes, a daemon thread that takes the GIL back is ended by
``pthread_exit``, and its forced unwind aborts the process ("terminate
called without an active exception") when it crosses a native frame that
cannot be unwound. torch's ops release the GIL and take it back inside such
frames: each epoch's seed draw (``random_``), a tensor's deallocation. So a
daemon thread inside a chute loader must be stopped for good before the
interpreter finalizes, the way Python 3.14 parks such threads itself.

At exit, in this order: the flags that `park_if_exiting` and the engines'
native waits read are set, so that a thread whose wait the hooks end parks
there instead of running on (the Python waits call `park_if_exiting`: the
block readers' futures, an error out of a loader's ``next()``); the hooks
run (``chute.sources.reader_threads`` stops its readers and cancels their
reads); every engine is closed (``_core._close_live_engines``), which parks
a thread waiting in one or reaching one later
(``csrc/bindings/engine_face.h``); and the threads inside a loader's
``next()`` (`enter_loader`) get a short while to reach a park, in a native
wait or at the start of an epoch.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable

# Imported before the handler below is registered: atexit runs the last
# registered first, so the handler runs before _core's own (a no-op then).
from chute import _core

# How long exit waits for the threads inside a loader's next() to park: each
# is at most a batch's Python work away from a native wait.
_SETTLE_S = 1.0

_exiting = threading.Event()
_hooks: list[Callable[[], None]] = []
_lock = threading.Lock()
_inside: dict[int, int] = {}  # thread id -> nesting depth inside a loader's next()
_parked: set[int] = set()  # the threads parked by park_if_exiting


def at_exit(hook: Callable[[], None]) -> None:
    """Runs `hook` at exit, after `park_if_exiting` parks and before the
    engines close."""
    _hooks.append(hook)


def park_if_exiting() -> None:
    """Blocks for good a thread other than the main one once the interpreter
    has begun to exit; otherwise returns at once."""
    if _exiting.is_set() and threading.current_thread() is not threading.main_thread():
        with _lock:
            _parked.add(threading.get_ident())
        threading.Event().wait()  # never set: the thread waits without the GIL until exit


def enter_loader() -> None:
    """Marks the calling thread as inside a loader's ``next()`` (until its
    `leave_loader`): exit waits to see such a thread parked."""
    # No lock: each thread writes only its own entry, and the GIL keeps a
    # dict's single operations whole.
    ident = threading.get_ident()
    _inside[ident] = _inside.get(ident, 0) + 1


def leave_loader() -> None:
    ident = threading.get_ident()
    depth = _inside.pop(ident) - 1
    if depth:
        _inside[ident] = depth


def _unparked_inside() -> set[int]:
    with _lock:
        inside = set(_inside) - _parked
    inside.discard(threading.get_ident())
    return inside - set(_core._parked_threads())


@atexit.register
def _exit() -> None:
    _exiting.set()
    # Before the hooks: a thread whose engine wait they end (by cancelling
    # its reads) must park there, not raise into Python that would still
    # be running when the interpreter finalizes.
    _core._exit_begins()
    for hook in _hooks:
        with contextlib.suppress(Exception):
            hook()
    _core._close_live_engines()
    deadline = time.monotonic() + _SETTLE_S
    while _unparked_inside() and time.monotonic() < deadline:
        time.sleep(0.005)
