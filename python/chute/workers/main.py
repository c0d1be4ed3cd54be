"""A worker process: its start (signals, the one-thread rule, seeds,
``worker_init_fn``) and its loop over the loader's commands.

Commands, each a tuple whose second element is the tag of a task:
``("task", tag, kind, spec, credits)`` starts a task (ending the one that
runs), ``("credit", tag, n)`` allows `n` more results, ``("indices", tag,
idx)`` and ``("end", tag)`` feed an index-driven task, ``("stop", tag)``
ends it, ``("release", 0, ids)`` returns arenas the loader is done with
(whatever task runs); None (or the socket closing) ends the process. A task is a
generator of results (`Outgoing`) that the dataset's ``worker_task`` makes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import random
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from chute.workers.failures import Failure
from chute.workers.transport import ArenaPool, Channel


@dataclass
class Outgoing:
    """A result on its way to the loader, with its arena's descriptor (see
    `transport.pack`; the worker's `ArenaPool` owns it) and, where the task
    knows it, where each of its items came from (`origin(i)`: "shard ...,
    sample key ..."), for the error of an item that cannot be sent."""

    message: tuple[Any, ...]
    fd: int = -1
    origin: Callable[[int], str] | None = None


class Interrupted(BaseException):
    """A command that ends the running task arrived while the task waited
    for its next index batch (a BaseException: the task's own handlers,
    and the user's, must not take it for a failure of theirs)."""

    def __init__(self, command: Any) -> None:
        super().__init__("the loader gave this worker another command")
        self.command = command


@dataclass
class WorkerContext:
    """What a task knows of the worker it runs in."""

    index: int
    num_workers: int
    tag: int  # the task's: every result carries it
    collate_fn: Callable[[list[Any]], Any] | None
    next_indices: Callable[[], Any]  # the next index batch of this task; None at its end
    arenas: ArenaPool  # where results' arrays go (`transport.pack`)

    @property
    def where(self) -> str:
        return f"chute DataLoader worker {self.index} (pid {os.getpid()})"


def worker_main(
    index: int,
    num_workers: int,
    sock: socket.socket,
    payload: bytes | None,
    inherited: tuple[Any, Any, Any] | None,
    base_seed: int,
    close_in_child: list[int],
) -> None:
    """The body of worker `index`."""
    # Ctrl-C reaches the whole process group: the loader handles it and
    # closes the workers' sockets; a worker stopped mid-send would only
    # leave a torn message behind.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in close_in_child:
        os.close(fd)
    torch.set_num_threads(1)
    _keep_freed_memory()
    _seed(base_seed + index, base_seed, index)
    channel = Channel(sock)
    try:
        dataset, worker_init_fn, collate_fn = (
            pickle.loads(payload) if payload is not None else inherited  # type: ignore[misc]
        )
        if worker_init_fn is not None:
            worker_init_fn(index)
    except Exception as exc:  # noqa: BLE001 - any failure is the loader's to raise
        where = f"chute DataLoader worker {index} (pid {os.getpid()}) while starting"
        with contextlib.suppress(OSError):
            channel.send(("failed", None, Failure.capture(exc, where)))
        return
    try:
        _Loop(channel, dataset, index, num_workers, collate_fn).run()
    except (EOFError, ConnectionError):
        pass  # the loader went away: nothing to report to
    finally:
        channel.close()


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _unsendable_origin(out: Outgoing) -> str:
    """ ", for the item of shard ..., sample key ..." naming the first item
    of `out` that does not pickle, where the task says where its items came
    from; else ""."""
    body = out.message[2] if len(out.message) > 2 else None
    packed = body.get("items") if isinstance(body, dict) else None
    template = getattr(packed, "template", None)
    if out.origin is None or not isinstance(template, list):
        return ""
    for i, item in enumerate(template):
        try:
            pickle.dumps(item, protocol=5)
        except Exception:  # noqa: BLE001 - this is the one
            return f" (the item of {out.origin(i)})"
    return ""


def _keep_freed_memory() -> None:
    """Lets the tensors a Python stage makes for each item reuse the memory
    that the previous items' tensors freed. By default glibc serves a large
    block from a fresh mapping until one is freed, and gives the top of its
    heap back to the system whenever twice the largest freed block lies free
    there; every page of the next block then faults and is zeroed again, work
    as large as the stage's own arithmetic on it. Here blocks below 32 MiB
    come from the heap and up to 128 MiB of it stay free for reuse. Only in
    chute's worker processes (the loader's process keeps the user's
    settings); nothing where the C library has no mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 128 << 20)


def _seed(seed: int, base_seed: int, index: int) -> None:
    """Seeds Python's, torch's and numpy's global generators as torch's
    DataLoader seeds its workers'."""
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        import numpy as np

        try:
            from torch.utils.data._utils.worker import _generate_state

            np.random.seed(_generate_state(base_seed, index))  # type: ignore[no-untyped-call]
        except ImportError:
            np.random.seed(seed % (1 << 32))


class _Loop:
    def __init__(
        self,
        channel: Channel,
        dataset: Any,
        index: int,
        num_workers: int,
        collate_fn: Callable[[list[Any]], Any] | None,
    ) -> None:
        self.channel = channel
        self.dataset = dataset
        self.index = index
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.task: Iterator[Outgoing] | None = None
        self.tag: int | None = None
        self.credits = 0
        self.inbox: deque[tuple[Any, ...]] = deque()
        self.arenas = ArenaPool()

    def run(self) -> None:
        try:
            self.serve()
        finally:
            self.end_task()
            self.arenas.close()

    def serve(self) -> None:
        while True:
            if self.task is None or self.credits <= 0:
                if not self.handle(self.channel.recv()[0]):
                    return
                continue
            while self.task is not None and self.channel.poll(0):
                if not self.handle(self.channel.recv()[0]):
                    return
            if self.task is None or self.credits <= 0:
                continue
            try:
                out = next(self.task)
            except StopIteration:
                self.task = None
                continue
            except Interrupted as interrupt:
                self.end_task()
                if not self.handle(interrupt.command):
                    return
                continue
            except (EOFError, ConnectionError):
                raise  # the loader went away
            except Exception as exc:  # noqa: BLE001 - the task's failure, for the loader
                where = f"chute DataLoader worker {self.index} (pid {os.getpid()})"
                out = Outgoing(("error", self.tag, Failure.capture(exc, where)))
                self.end_task()
            self.send(out)

    def send(self, out: Outgoing) -> None:
        try:
            payload = pickle.dumps(out.message, protocol=5)
        except Exception as exc:  # noqa: BLE001 - the loader raises it in its place
            where = f"chute DataLoader worker {self.index} (pid {os.getpid()})"
            where += f" sending its result{_unsendable_origin(out)} to the loader"
            payload = pickle.dumps(("error", self.tag, Failure.capture(exc, where)), protocol=5)
            out = Outgoing(())
            self.end_task()
        self.channel.send_pickled(payload, [out.fd] if out.fd >= 0 else [])
        self.credits -= 1

    def end_task(self) -> None:
        task, self.task = self.task, None
        self.inbox.clear()
        if task is not None:
            close = getattr(task, "close", None)
            if close is not None:
                close()

    def handle(self, command: Any) -> bool:
        """Applies `command`; False when the process is to end."""
        if command is None:
            self.end_task()
            return False
        kind, tag = command[0], command[1]
        if kind == "release":
            self.arenas.release(command[2])
        elif kind == "task":
            self.end_task()
            self.tag = tag
            self.credits = int(command[4])
            context = WorkerContext(
                self.index, self.num_workers, tag, self.collate_fn, self.next_indices, self.arenas
            )
            self.task = self.dataset.worker_task(command[2], command[3], context)
        elif tag != self.tag:
            pass  # a command of a task given up
        elif kind == "credit":
            self.credits += int(command[2])
        elif kind in ("indices", "end"):
            self.inbox.append(command)
        elif kind == "stop":
            self.end_task()
        return True

    def next_indices(self) -> Any:
        """The running task's next index batch (None at its end), waiting
        for the loader to send it; Interrupted by any other command."""
        while not self.inbox:
            command = self.channel.recv()[0]
            if command is not None and command[0] == "release":
                self.arenas.release(command[2])
                continue
            if command is not None and command[0] in ("indices", "end", "credit"):
                if command[1] == self.tag:
                    if command[0] == "credit":
                        self.credits += int(command[2])
                    else:
                        self.inbox.append(command)
                continue
            if command is not None and command[1] != self.tag and command[0] != "task":
                continue
            raise Interrupted(command)
        command = self.inbox.popleft()
        return command[2] if command[0] == "indices" else None
