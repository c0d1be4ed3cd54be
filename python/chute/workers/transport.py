"""How results travel from a worker process to the loader: messages over a
Unix stream socket, with every array of a message in one shared-memory
arena whose file descriptor rides along (``SCM_RIGHTS``).

Why an arena of its own rather than torch's ``file_descriptor`` sharing
strategy: the arena is a ``memfd`` (anonymous, so a worker killed at any
moment leaves no named segment in /dev/shm behind, not even while it is
being created), the receiving process gets the descriptor in the same
``sendmsg`` as the message (torch's strategy fetches each descriptor over a
connection of its own to a thread of the sending process, which must then
still be alive), and a message costs one descriptor however many tensors
and numpy arrays it holds. Arrays of the same shape and dtype at the same
place of consecutive items are laid out back to back, so that collating
them is a view (`collate_tensors`), not a copy.

Only the arrays' bytes go through the arena; the rest of a message (ints,
strings, the structure) is pickled, as are tensors the arena does not take
(ones that require grad, sparse or quantized ones, subclasses).

Arenas are reused (`ArenaPool`): once the loader no longer views one (the
last tensor or array of its message is gone), it tells the worker, which
writes a later message into the same pages. A new arena's pages must each
be faulted in and zeroed by the kernel, which for float images costs more
than the copy into them and often more than the user's transform.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import select
import socket
import struct
import weakref
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

_HEADER = struct.Struct("<QI4x")  # payload bytes, descriptors
_MAX_FDS = 4
_ALIGN = 64
_ARENA_GRAIN = 1 << 16  # arena sizes are multiples of this
_NUMPY_KINDS = frozenset("biufcmM")


class Leaf:
    """Where one array of a packed message lies in its arena."""

    __slots__ = ("kind", "dtype", "shape", "nbytes", "offset")

    def __init__(
        self, kind: str, dtype: str, shape: tuple[int, ...], nbytes: int, offset: int = -1
    ) -> None:
        self.kind = kind  # "tensor" or "numpy"
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (Leaf, (self.kind, self.dtype, self.shape, self.nbytes, self.offset))


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."))
    assert isinstance(dtype, torch.dtype)
    return dtype


def _packable_tensor(value: Any) -> bool:
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.requires_grad
        and not value.is_quantized
    )


def _packable_array(value: Any) -> bool:
    return type(value) is np.ndarray and value.dtype.kind in _NUMPY_KINDS


class Packed:
    """A list of items whose arrays are in an arena (see `pack`)."""

    def __init__(self, template: list[Any], arena_bytes: int, arena_id: int = 0) -> None:
        self.template = template
        self.arena_bytes = arena_bytes
        self.arena_id = arena_id  # the worker's name for the arena; 0: none


class _Arena:
    """A memfd and the worker's mapping of it, kept for as long as the
    arena is: a fresh mapping would fault on every page it writes again."""

    __slots__ = ("arena_id", "fd", "size", "mapping")

    def __init__(self, arena_id: int, size: int) -> None:
        self.arena_id = arena_id
        self.size = size
        self.fd = os.memfd_create("chute-batch")
        try:
            os.ftruncate(self.fd, size)
            self.mapping = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        self.mapping.close()
        os.close(self.fd)


class ArenaPool:
    """A worker's arenas. `take` lends one out for a message: a released
    one of a fitting size when there is one, else a new one. `release`
    takes back those the loader is done with; at most `keep` wait for reuse
    and the rest are closed. The worker forgets the oldest lent arena beyond
    `max_lent` (closing its descriptor and mapping: the loader's mapping
    keeps the memory for as long as it views it), so a loader whose user
    keeps every batch does not make the worker hold one of each."""

    def __init__(self, keep: int = 2, max_lent: int = 64) -> None:
        self.keep = keep
        self.max_lent = max_lent
        self._ids = itertools.count(1)
        self._lent: dict[int, _Arena] = {}  # oldest first
        self._free: list[_Arena] = []
        self.created = 0

    def take(self, nbytes: int) -> _Arena:
        """An arena of at least `nbytes` (and at most twice that, rounded,
        when it is a reused one)."""
        size = -(-nbytes // _ARENA_GRAIN) * _ARENA_GRAIN
        fitting = [arena for arena in self._free if size <= arena.size <= 2 * size]
        if fitting:
            arena = min(fitting, key=lambda a: a.size)
            self._free.remove(arena)
        else:
            arena = _Arena(next(self._ids), size)
            self.created += 1
        self._lent[arena.arena_id] = arena
        while len(self._lent) > self.max_lent:
            self._lent.pop(next(iter(self._lent))).close()
        return arena

    def release(self, ids: Iterable[int]) -> None:
        for arena_id in ids:
            arena = self._lent.pop(arena_id, None)
            if arena is not None:
                self._free.append(arena)
        self._free.sort(key=lambda a: a.size)
        while len(self._free) > self.keep:
            self._free.pop(0).close()  # the smallest go first

    @property
    def free(self) -> int:
        """Arenas waiting for reuse."""
        return len(self._free)

    def close(self) -> None:
        for arena in [*self._lent.values(), *self._free]:
            arena.close()
        self._lent.clear()
        self._free.clear()


def pack(items: list[Any], arenas: ArenaPool) -> tuple[Packed, int]:
    """`items` with their tensors and numpy arrays copied into an arena of
    `arenas`: the packed form and the arena's descriptor (-1 when there is
    nothing to put in one), which the caller sends with the message and
    does not close (the pool owns it)."""
    groups: dict[tuple[Any, ...], list[tuple[Leaf, Any]]] = {}
    # A plain function, not a closure: a closure that calls itself is a
    # reference cycle, which would keep every array of `items` alive until
    # the garbage collector next runs.
    template = [_leaves(item, (), groups) for item in items]
    size = 0
    for members in groups.values():
        size = -(-size // _ALIGN) * _ALIGN
        for leaf, _ in members:
            leaf.offset = size
            size += leaf.nbytes
    if size == 0:
        return Packed(template, 0), -1
    arena = arenas.take(size)
    _fill(arena.mapping, groups)
    return Packed(template, arena.size, arena.arena_id), arena.fd


def _leaves(
    value: Any, path: tuple[Any, ...], groups: dict[tuple[Any, ...], list[tuple[Leaf, Any]]]
) -> Any:
    """`value` with a `Leaf` in place of each array it holds, and each array
    filed in `groups` under its place, kind, dtype and shape."""
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(_leaves(v, (*path, i), groups) for i, v in enumerate(value))
    if kind is dict:
        return {k: _leaves(v, (*path, k), groups) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return kind(*(_leaves(v, (*path, i), groups) for i, v in enumerate(value)))
    if _packable_tensor(value):
        nbytes = value.numel() * value.element_size()
        leaf = Leaf("tensor", str(value.dtype), tuple(value.shape), nbytes)
    elif _packable_array(value):
        leaf = Leaf("numpy", value.dtype.str, tuple(value.shape), value.nbytes)
    else:
        return value
    groups.setdefault((path, leaf.kind, leaf.dtype, leaf.shape), []).append((leaf, value))
    return leaf


def _fill(arena: mmap.mmap, groups: dict[tuple[Any, ...], list[tuple[Leaf, Any]]]) -> None:
    """Copies the arrays into their places in `arena`; no view of it
    outlives the call (the pool may close the mapping later)."""
    base = torch.frombuffer(arena, dtype=torch.uint8)
    for members in groups.values():
        for leaf, value in members:
            n = leaf.nbytes
            if n == 0:
                continue
            if leaf.kind == "tensor":
                base[leaf.offset : leaf.offset + n].view(value.dtype).view(value.shape).copy_(value)
            else:
                target = np.frombuffer(
                    arena, dtype=value.dtype, count=value.size, offset=leaf.offset
                )
                target.reshape(value.shape)[...] = value


def unpack(
    packed: Packed, fd: int, pin: bool = False, on_release: Callable[[int], None] | None = None
) -> list[Any]:
    """The items of `packed`, their arrays viewing the arena `fd` (which is
    mapped, then closed: the views keep the mapping alive); with `pin`, the
    tensors copied to page-locked memory instead (``pin_memory=True``).
    `on_release(arena_id)` runs once nothing views the arena any more (on
    whichever thread drops the last view: it must only record the id)."""
    arena: mmap.mmap | None = None
    base: torch.Tensor | None = None
    if packed.arena_bytes:
        try:
            arena = mmap.mmap(fd, packed.arena_bytes)
        finally:
            os.close(fd)
        if on_release is not None:
            weakref.finalize(arena, on_release, packed.arena_id)
        base = torch.frombuffer(arena, dtype=torch.uint8)
    # Plain functions, not closures over the arena: a closure that calls
    # itself is a reference cycle, which would keep the arena mapped (and
    # from its worker) until the garbage collector next runs.
    return [_rebuild(item, arena, base, pin) for item in packed.template]


def _rebuild(value: Any, arena: mmap.mmap | None, base: torch.Tensor | None, pin: bool) -> Any:
    kind = type(value)
    if kind is Leaf:
        return _leaf_value(value, arena, base, pin)
    if kind is tuple or kind is list:
        return kind(_rebuild(v, arena, base, pin) for v in value)
    if kind is dict:
        return {k: _rebuild(v, arena, base, pin) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return kind(*(_rebuild(v, arena, base, pin) for v in value))
    return value


def _leaf_value(leaf: Leaf, arena: mmap.mmap | None, base: torch.Tensor | None, pin: bool) -> Any:
    n = leaf.nbytes
    if leaf.kind == "tensor":
        dtype = _torch_dtype(leaf.dtype)
        if n == 0 or base is None:
            tensor = torch.empty(leaf.shape, dtype=dtype)
        else:
            tensor = base[leaf.offset : leaf.offset + n].view(dtype).view(leaf.shape)
        return tensor.pin_memory() if pin else tensor
    np_dtype = np.dtype(leaf.dtype)
    if n == 0 or arena is None:
        return np.empty(leaf.shape, dtype=np_dtype)
    count = n // np_dtype.itemsize
    return np.frombuffer(arena, dtype=np_dtype, count=count, offset=leaf.offset).reshape(leaf.shape)


def collate_tensors(
    batch: Sequence[torch.Tensor],
    *,
    collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] | None = None,
) -> torch.Tensor:
    """torch's default collation of tensors (a stack), as a view when they
    are consecutive rows of one arena: the same values without a copy."""
    first = batch[0]
    n = first.numel()
    if (
        n
        and all(type(t) is torch.Tensor for t in batch)
        and first.is_contiguous()
        and all(
            t.dtype == first.dtype
            and t.shape == first.shape
            and t.is_contiguous()
            and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            and t.storage_offset() == first.storage_offset() + i * n
            for i, t in enumerate(batch)
        )
    ):
        return first.as_strided(
            (len(batch), *first.shape), (n, *first.stride()), first.storage_offset()
        )
    from torch.utils.data._utils.collate import collate_tensor_fn

    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)  # type: ignore[no-any-return]


def default_collate(batch: list[Any]) -> Any:
    """torch's ``default_collate``, with tensors collated by `collate_tensors`."""
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    return collate(batch, collate_fn_map={**default_collate_fn_map, torch.Tensor: collate_tensors})


class Channel:
    """One end of a worker's connection: pickled messages, each with up to
    a few descriptors."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any, fds: Sequence[int] = ()) -> None:
        self.send_pickled(pickle.dumps(message, protocol=5), fds)

    def send_pickled(self, payload: bytes, fds: Sequence[int] = ()) -> None:
        """Sends a message already pickled (protocol 5)."""
        header = _HEADER.pack(len(payload), len(fds))
        if fds:
            sent = self.sock.sendmsg(
                [header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))]
            )
            if sent < len(header):
                self.sock.sendall(header[sent:])
        else:
            self.sock.sendall(header)
        self.sock.sendall(payload)

    def poll(self, timeout: float) -> bool:
        """Whether a message (or the end of the connection) is there to
        read, waiting up to `timeout` seconds."""
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        return bool(ready)

    def recv(self) -> tuple[Any, list[int]]:
        """The next message and its descriptors; EOFError when the other
        end has closed."""
        header = b""
        fds: list[int] = []
        try:
            while len(header) < _HEADER.size:
                data, ancillary, flags, _ = self.sock.recvmsg(
                    _HEADER.size - len(header),
                    socket.CMSG_SPACE(_MAX_FDS * 4),
                    getattr(socket, "MSG_CMSG_CLOEXEC", 0),
                )
                for level, kind, cdata in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.extend(array("i", cdata[: len(cdata) - len(cdata) % 4]))
                if not data:
                    raise EOFError("the other end closed the connection")
                if flags & socket.MSG_CTRUNC:
                    raise OSError("a message carried more descriptors than expected")
                header += data
            size, _ = _HEADER.unpack(header)
            payload = bytearray(size)
            view = memoryview(payload)
            got = 0
            while got < size:
                n = self.sock.recv_into(view[got:])
                if n == 0:
                    raise EOFError("the other end closed the connection mid-message")
                got += n
            return pickle.loads(payload), fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def close(self) -> None:
        self.sock.close()
