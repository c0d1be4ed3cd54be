"""The loader's side of its worker processes: starting them, handing them
tasks, receiving their results in the order the loader asks for them, and
ending them.

Each worker has one Unix socket to the loader (commands one way, results
the other; see `chute.workers.transport`). The loader holds only its own
end: a worker that dies, however it dies, closes the other, so the loader's
wait ends at once with a RuntimeError naming the worker and how it ended,
and a worker whose loader is gone (closed, collected, killed) finds its
socket closed and exits. Results are bounded by credits: a worker sends a
result only for a credit the loader gave it, `prefetch` at the start of a
task and one for each result taken. Arenas the loader no longer views go
back to their worker (``("release", 0, ids)``) ahead of the next command
the loader sends it, as do the negated ids of retired arenas it unmapped.
The loader maps each arena once and keeps it mapped (and page-locked, with
``pin_memory``) until its worker retires it.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import select
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from chute.gpu import pinning
from chute.workers.failures import Failure
from chute.workers.transport import ArenaMappings, Channel, Packed

# Seconds close() waits for the workers to exit before it ends them (one
# busy in a user's function does not look at its socket meanwhile).
_EXIT_GRACE = 1.0


class NotSendable(Exception):
    """What a worker needs does not pickle (the cause says why)."""


class WorkerPool:
    """`num_workers` processes, each holding a copy of `dataset`."""

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        *,
        threads: int,
        prefetch: int,
        context: Any = None,
        worker_init_fn: Callable[[int], None] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        base_seed: int = 0,
    ) -> None:
        """Raises NotSendable when `dataset`, `worker_init_fn` or
        `collate_fn` cannot be sent to a worker of `context`."""
        self.channels: list[Channel] = []
        self.processes: list[Any] = []
        self.dataset = dataset
        self.num_workers = num_workers
        self.threads = threads
        self.prefetch = prefetch
        reads_remote = getattr(dataset, "reads_remote", None)
        self.context = resolve_context(context, reads_remote() if callable(reads_remote) else True)
        self.tags = itertools.count(1)
        self.broken = False
        # Per worker, the ids of its arenas that nothing here views any more.
        self.released: list[deque[int]] = [deque() for _ in range(num_workers)]
        # Per worker, this process's mappings of its arenas (kept across tasks).
        self.arenas = [ArenaMappings(released.append) for released in self.released]
        forked = self.context.get_start_method() == "fork"
        payload = None
        if not forked:
            try:
                payload = pickle.dumps((dataset, worker_init_fn, collate_fn), protocol=5)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                raise NotSendable(str(exc)) from exc
        inherited = (dataset, worker_init_fn, collate_fn) if forked else None
        from chute.workers.main import worker_main

        try:
            for index in range(num_workers):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                self.channels.append(Channel(ours))
                # A forked child inherits every descriptor: it closes the
                # loader's ends, or a worker would never see its loader go.
                close_in_child = [c.fileno() for c in self.channels] if forked else []
                process = self.context.Process(
                    target=worker_main,
                    args=(
                        index,
                        num_workers,
                        theirs,
                        payload,
                        inherited,
                        base_seed,
                        close_in_child,
                    ),
                    name=f"chute-worker-{index}",
                    daemon=True,
                )
                process.start()
                theirs.close()
                self.processes.append(process)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return not self.broken and bool(self.processes)

    def new_task(self, kind: str, spec: Any, credits: int) -> int:
        """Hands every worker the task `spec` (of `kind`) and `credits`;
        returns its tag (results of earlier tasks are dropped from now on)."""
        tag = next(self.tags)
        for worker in range(len(self.channels)):
            self.send(worker, ("task", tag, kind, spec, credits))
        return tag

    def send(self, worker: int, command: tuple[Any, ...]) -> None:
        """Sends `command` to `worker`, after the ids of its arenas released
        since the last command."""
        channel = self.channels[worker]
        released = self.released[worker]
        ids = [released.popleft() for _ in range(len(released))]
        try:
            if ids:
                channel.send(("release", 0, ids))
            channel.send(command)
        except OSError as exc:
            self._raise_reported_failure(worker)
            raise self._ended(worker) from exc

    def unpack(self, worker: int, packed: Packed, pin: bool) -> list[Any]:
        """The items of `packed`, a result of `worker` that `receive`
        returned, viewing its arena; with `pin` and CUDA, the arena is
        registered page-locked (once: the mapping is kept)."""
        runtime = pinning.cuda_runtime() if pin else None
        return self.arenas[worker].unpack(packed, runtime)

    def stop_task(self, tag: int) -> None:
        """Asks every worker to drop the task `tag`."""
        if self.broken:
            return
        for worker in range(len(self.channels)):
            try:
                self.send(worker, ("stop", tag))
            except RuntimeError:
                return

    def receive(self, worker: int, tag: int, timeout: float) -> Any:
        """The next message of `worker` for the task `tag` (its arena, if
        any, admitted: `unpack` its items). RuntimeError when the worker has
        died, TimeoutError after `timeout` > 0 seconds without one."""
        channel = self.channels[worker]
        sentinel = self.processes[worker].sentinel
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([channel.fileno(), sentinel], [], [], wait)
            if not ready:
                raise TimeoutError(
                    f"chute DataLoader worker {worker} sent no batch within {timeout} s"
                )
            if channel.fileno() not in ready:
                raise self._ended(worker)
            try:
                message, fds = channel.recv()
            except (EOFError, ConnectionError) as exc:
                raise self._ended(worker) from exc
            self._raise_if_failed(message)
            packed = _packed_items(message)
            if packed is not None:
                self.arenas[worker].admit(packed, fds)
            else:
                for fd in fds:
                    os.close(fd)
            if message[1] != tag:  # a result of a task given up
                if packed is not None:
                    self.arenas[worker].release_unread(packed)
                continue
            return message

    def _raise_reported_failure(self, worker: int) -> None:
        """Raises the failure `worker` sent before it went, if it sent one:
        a worker that cannot start reports why and exits, and a command
        that then finds its socket closed must not hide that report."""
        channel = self.channels[worker]
        while select.select([channel.fileno()], [], [], 0)[0]:
            try:
                message, fds = channel.recv()
            except (EOFError, OSError):
                return
            for fd in fds:
                os.close(fd)
            self._raise_if_failed(message)

    def _raise_if_failed(self, message: tuple[Any, ...]) -> None:
        """Raises the failure in `message` when it says its worker could not
        start (the pool is then broken)."""
        if message[0] == "failed":
            self.broken = True
            failure: Failure = message[2]
            failure.reraise()

    def _ended(self, worker: int) -> RuntimeError:
        """The error of a worker that died or closed its connection."""
        self.broken = True
        process = self.processes[worker]
        process.join(1.0)
        code = process.exitcode
        if code is None:
            how = "closed its connection unexpectedly"
        elif code < 0:
            how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
        else:
            how = f"exited unexpectedly with code {code}"
        return RuntimeError(
            f"chute DataLoader worker {worker} (pid {process.pid}) {how}; "
            "the iteration cannot go on"
        )

    def close(self) -> None:
        """Ends the workers: each is told to exit and finds its socket
        closed; one still there after a grace period is terminated."""
        # Unmapped while the workers still hold the arenas: the last process
        # to let go of an arena's pages pays for freeing them.
        for arenas in getattr(self, "arenas", []):
            arenas.close()
        for channel in self.channels:
            with contextlib.suppress(OSError):
                channel.send(None)
            channel.close()
        self.channels = []
        deadline = time.monotonic() + _EXIT_GRACE
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.terminate()
                process.join(1.0)
            if process.exitcode is None:
                process.kill()
                process.join()
            process.close()
        self.processes = []
        self.broken = True

    def __del__(self) -> None:
        if getattr(self, "processes", None) or getattr(self, "channels", None):
            self.close()


def _packed_items(message: Any) -> Packed | None:
    """The items of a worker's result (``(kind, tag, {"items": Packed,
    ...})``), whose arena and retired arenas the loader takes in whatever
    the message's tag."""
    body = message[2] if len(message) > 2 else None
    items = body.get("items") if type(body) is dict else None
    return items if type(items) is Packed else None


def resolve_context(context: Any, reads_remote: bool = True) -> Any:
    """The multiprocessing context workers start with: the one given (a
    context or a start method's name); else fork, as torch's DataLoader,
    while no thread of chute runs in this process and, for workers that read
    remote urls (`reads_remote`), its remote client is unused here; else
    forkserver where the platform has it, else spawn. A
    fork taken while an engine's threads (an open iteration of another
    loader) or the remote fetcher hold their locks can leave the child a
    lock no thread will release, and the remote client's runtime refuses to
    run in a child forked after it ran (RemoteForkError); with neither,
    fork is what torch does, and a worker starts in milliseconds. The
    forkserver imports chute's worker module (and so torch) once, so that
    a worker started from it does not import torch itself."""
    if context is None:
        methods = multiprocessing.get_all_start_methods()
        if "fork" in methods and not fork_unsafe(reads_remote):
            method = "fork"
        else:
            method = "forkserver" if "forkserver" in methods else "spawn"
        context = multiprocessing.get_context(method)
    elif isinstance(context, str):
        context = multiprocessing.get_context(context)
    if context.get_start_method() == "forkserver":
        _preload_worker_module()
    return context


def fork_unsafe(reads_remote: bool = True) -> bool:
    """Whether a child forked now could not run chute: a thread of chute
    runs here (an engine's, or for a child that reads remote urls the remote
    fetcher's), or the child reads remote urls and the remote client has
    been used here. A child that reads local data only never touches the
    fetcher's queue or the client's runtime, so their threads do not matter
    to it (the fetcher's lives as long as the process's remote session)."""
    from chute.remote._executor import FETCH_THREAD_NAME
    from chute.remote._stores import runtime_claimed_here

    if reads_remote and runtime_claimed_here():
        return True
    return native_threads_running(ignore=() if reads_remote else (FETCH_THREAD_NAME,))


def native_threads_running(ignore: tuple[str, ...] = ()) -> bool:
    """Whether a thread of chute runs in this process: an engine's (native,
    named chute-* for the kernel) or one of its Python threads (named
    chute-* for threading) other than those named in `ignore`; True where
    native threads cannot be listed."""
    if any(t.name.startswith("chute-") and t.name not in ignore for t in threading.enumerate()):
        return True
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("chute-"):
                    return True
        except OSError:
            continue  # a thread that ended meanwhile
    return False


def _preload_worker_module() -> None:
    """Adds chute's worker module to what the forkserver imports when it
    starts (no effect once it runs; the modules already named are kept)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        return
    modules = list(getattr(server, "_preload_modules", ["__main__"]))
    if "chute.workers.main" not in modules:
        forkserver.set_forkserver_preload([*modules, "chute.workers.main"])
