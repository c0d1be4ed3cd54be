"""How results travel from a worker process to the loader: messages over a
Unix stream socket, with every array of a message in one shared-memory
arena whose file descriptor rides along (``SCM_RIGHTS``) with the first
message that uses it.

Why an arena of its own rather than torch's ``file_descriptor`` sharing
strategy: the arena is a ``memfd`` (anonymous, so a worker killed at any
moment leaves no named segment in /dev/shm behind, not even while it is
being created), the receiving process gets the descriptor in the same
``sendmsg`` as the message (torch's strategy fetches each descriptor over a
connection of its own to a thread of the sending process, which must then
still be alive), and a message costs one descriptor however many tensors
and numpy arrays it holds. Arrays of the same shape and dtype at the same
place of consecutive items are laid out back to back, so that collating
them is a view (`chute.common.torch_collate`), not a copy.

Only the arrays' bytes go through the arena; the rest of a message (ints,
strings, the structure) is pickled, as are tensors the arena does not take
(ones that require grad, sparse or quantized ones, subclasses).

Arenas are reused (`ArenaPool`): once the loader no longer views one (the
last tensor or array of its message is gone), it tells the worker, which
writes a later message into the same pages. A new arena's pages must each
be faulted in and zeroed by the kernel, which for float images costs more
than the copy into them and often more than the user's transform.

The loader maps each arena once (`ArenaMappings`) and keeps the mapping
until the worker retires the arena, registering it page-locked once when
batches are to be pinned: a message then costs the loader a few Python
objects per item, whatever its size and however many workers there are,
and it never touches a byte of the arrays.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import mmap
import os
import pickle
import select
import socket
import struct
import warnings
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

_HEADER = struct.Struct("<QI4x")  # payload bytes, descriptors
_MAX_FDS = 4
_ALIGN = 64
_ARENA_GRAIN = 1 << 16  # arena sizes are multiples of this
_JOINED_SEND = 1 << 16  # payloads up to this size go in one send with their header
_NUMPY_KINDS = frozenset("biufcmM")


class Leaf:
    """An array of a packed item: row `row` of the packed message's group
    `group` (see `Packed.groups`)."""

    __slots__ = ("group", "row")

    def __init__(self, group: int, row: int) -> None:
        self.group = group
        self.row = row

    def __reduce__(self) -> tuple[Any, ...]:
        return (Leaf, (self.group, self.row))


@functools.cache
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
    """A list of items whose arrays are in an arena (see `pack`).

    `groups` describes the arena: for each place in the items (and kind,
    dtype, shape) the arrays there, back to back as
    ``(kind, dtype, shape, offset, count)``; each array of `template` is a
    `Leaf` naming its group and row. `retired` lists the worker's arenas
    closed since its previous message, which the loader unmaps once it no
    longer views them."""

    def __init__(
        self,
        template: list[Any],
        groups: list[tuple[str, str, tuple[int, ...], int, int]],
        arena_bytes: int,
        arena_id: int = 0,
        retired: list[int] | None = None,
    ) -> None:
        self.template = template
        self.groups = groups
        self.arena_bytes = arena_bytes
        self.arena_id = arena_id  # the worker's name for the arena; 0: none
        self.retired = retired or []


class _Arena:
    """A memfd and the worker's mapping of it, kept for as long as the
    arena is: a fresh mapping would fault on every page it writes again.
    `announced` once its descriptor went to the loader, which keeps its own
    mapping from then on."""

    __slots__ = ("arena_id", "fd", "size", "mapping", "announced")

    def __init__(self, arena_id: int, size: int) -> None:
        self.arena_id = arena_id
        self.size = size
        self.announced = False
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
    keeps every batch does not make the worker hold one of each.

    A released arena the pool lets go of while the loader still maps it is
    retired, not closed: its id goes to the loader with the next message
    (`Packed.retired`), which unmaps it and says so (its id negated, in a
    later release); only then does the worker close it. The last process
    to let go of an arena's pages frees them, which costs about as much as
    writing them: this way that is the worker, not the loader."""

    def __init__(self, keep: int = 2, max_lent: int = 64) -> None:
        self.keep = keep
        self.max_lent = max_lent
        self._ids = itertools.count(1)
        self._lent: dict[int, _Arena] = {}  # oldest first
        self._free: list[_Arena] = []
        self._retiring: dict[int, _Arena] = {}  # retired, until the loader unmaps them
        self._retired: list[int] = []  # ids the loader has not been told of yet
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
        """Takes back the arenas `ids` (the loader views them no more) and
        closes those of the negated ids (the loader unmapped them)."""
        for arena_id in ids:
            if arena_id < 0:
                retired = self._retiring.pop(-arena_id, None)
                if retired is not None:
                    retired.close()
                continue
            arena = self._lent.pop(arena_id, None)
            if arena is not None:
                self._free.append(arena)
        self._free.sort(key=lambda a: a.size)
        while len(self._free) > self.keep:
            arena = self._free.pop(0)  # the smallest go first
            if arena.announced:
                self._retiring[arena.arena_id] = arena
                self._retired.append(arena.arena_id)
            else:
                arena.close()

    def take_retired(self) -> list[int]:
        """The ids of announced arenas closed since the last call."""
        retired, self._retired = self._retired, []
        return retired

    @property
    def free(self) -> int:
        """Arenas waiting for reuse."""
        return len(self._free)

    @property
    def retiring(self) -> int:
        """Retired arenas the loader has not unmapped yet."""
        return len(self._retiring)

    def close(self) -> None:
        for arena in [*self._lent.values(), *self._free, *self._retiring.values()]:
            arena.close()
        self._lent.clear()
        self._free.clear()
        self._retiring.clear()


_Groups = dict[tuple[Any, ...], tuple[int, list[Any]]]


def pack(items: list[Any], arenas: ArenaPool) -> tuple[Packed, int]:
    """`items` with their tensors and numpy arrays copied into an arena of
    `arenas`: the packed form and the descriptor to send with it, the
    arena's when the loader has not mapped it yet, else -1 (the pool owns
    the descriptor: the caller does not close it)."""
    groups: _Groups = {}
    # A plain function, not a closure: a closure that calls itself is a
    # reference cycle, which would keep every array of `items` alive until
    # the garbage collector next runs.
    template = [_leaves(item, (), groups) for item in items]
    layout: list[tuple[str, str, tuple[int, ...], int, int]] = []
    size = 0
    for (_, kind, dtype, shape), (_, members) in groups.items():
        size = -(-size // _ALIGN) * _ALIGN
        layout.append((kind, dtype, shape, size, len(members)))
        size += _nbytes(members[0]) * len(members)
    retired = arenas.take_retired()
    if size == 0:
        return Packed(template, layout, 0, retired=retired), -1
    arena = arenas.take(size)
    _fill(arena.mapping, layout, groups)
    fd = -1 if arena.announced else arena.fd
    arena.announced = True
    return Packed(template, layout, arena.size, arena.arena_id, retired), fd


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return int(value.nbytes)


def _leaves(value: Any, path: tuple[Any, ...], groups: _Groups) -> Any:
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
        key = (path, "tensor", str(value.dtype), tuple(value.shape))
    elif _packable_array(value):
        key = (path, "numpy", value.dtype.str, value.shape)
    else:
        return value
    entry = groups.get(key)
    if entry is None:
        entry = groups[key] = (len(groups), [])
    entry[1].append(value)
    return Leaf(entry[0], len(entry[1]) - 1)


def _fill(
    arena: mmap.mmap, layout: list[tuple[str, str, tuple[int, ...], int, int]], groups: _Groups
) -> None:
    """Copies each group's arrays into their place in `arena`, one copy per
    group; no view of it outlives the call (the pool may close the mapping
    later)."""
    base = torch.frombuffer(arena, dtype=torch.uint8)
    for (kind, _, shape, offset, count), (_, members) in zip(layout, groups.values(), strict=True):
        n = _nbytes(members[0]) * count
        if n == 0:
            continue
        if kind == "tensor":
            target = base[offset : offset + n].view(members[0].dtype).view(count, *shape)
            torch.stack(members, out=target)
        else:
            dtype = members[0].dtype
            block = np.frombuffer(arena, dtype=dtype, count=n // dtype.itemsize, offset=offset)
            np.stack(members, out=block.reshape(count, *shape))


class _Mapping:
    """The loader's mapping of one arena of a worker, kept for as long as
    the worker keeps the arena or anything here views it (each message's
    views hold a `_Lease` of it), so that each arena is mapped, and
    registered page-locked, once. `pin` registers it with CUDA
    (``cudaHostRegister``); it is unregistered right before it is unmapped,
    and then `on_unmapped(-arena_id)` tells the worker."""

    __slots__ = ("address", "size", "runtime", "arena_id", "on_unmapped")

    def __init__(
        self, fd: int, size: int, arena_id: int, on_unmapped: Callable[[int], None] | None
    ) -> None:
        self.runtime: Any = None
        self.address = 0
        self.arena_id = arena_id
        self.on_unmapped = on_unmapped
        self.size = size
        # libc's mmap, not Python's: an mmap object keeps a duplicate of the
        # descriptor open for as long as it lives, one per mapped arena here.
        try:
            address = _libc().mmap(
                None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0
            )
        finally:
            os.close(fd)
        if address is None or address == _MAP_FAILED:
            errno = ctypes.get_errno()
            raise OSError(errno, f"cannot map a {size}-byte batch arena: {os.strerror(errno)}")
        self.address = address

    def pin(self, runtime: Any) -> None:
        """Registers the mapping page-locked through `runtime` (torch's CUDA
        runtime binding), once."""
        if self.runtime is not None:
            return
        status = int(runtime.cudaHostRegister(self.address, self.size, 0))
        if status != 0:
            raise RuntimeError(
                f"cudaHostRegister of a {self.size}-byte shared-memory batch arena failed "
                f"with cudaError {status}"
            )
        self.runtime = runtime

    def __del__(self) -> None:
        try:
            self._unmap()
        except KeyboardInterrupt:
            _interrupted_in_release[0] = True  # as in _Lease.__del__

    def _unmap(self) -> None:
        runtime = self.runtime
        if runtime is not None:
            status = int(runtime.cudaHostUnregister(self.address))
            if status != 0:
                warnings.warn(
                    f"cudaHostUnregister of a shared-memory batch arena failed with cudaError "
                    f"{status}",
                    RuntimeWarning,
                    stacklevel=1,
                )
        if self.address:
            _libc().munmap(self.address, self.size)
            if self.on_unmapped is not None:
                self.on_unmapped(-self.arena_id)


_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    """The C library's mmap and munmap, typed."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class _Lease:
    """One message's hold on a mapping: the base object of the numpy array
    that every array and tensor of the message views (numpy does not look
    past an object that is not an array for a view's base), so it dies with
    the message's last view, and tells the worker its arena is free."""

    __slots__ = ("mapping", "arena_id", "on_release")

    def __init__(
        self, mapping: _Mapping, arena_id: int, on_release: Callable[[int], None] | None
    ) -> None:
        self.mapping = mapping
        self.arena_id = arena_id
        self.on_release = on_release

    @property
    def __array_interface__(self) -> dict[str, Any]:
        mapping = self.mapping
        return {
            "version": 3,
            "shape": (mapping.size,),
            "typestr": "|u1",
            "data": (mapping.address, False),
        }

    def __del__(self) -> None:
        try:
            if self.on_release is not None:
                self.on_release(self.arena_id)
        except KeyboardInterrupt:
            # Python prints and drops what __del__ raises: a Ctrl-C taken
            # here is kept for the next unpack to raise (no call in between,
            # where another check could raise it again).
            _interrupted_in_release[0] = True


# A Ctrl-C that arrived while a message's lease was released or an arena
# unmapped (see `_Lease.__del__`), not yet raised.
_interrupted_in_release = [False]


class ArenaMappings:
    """The loader's side of one worker's arenas: a mapping of each, made
    when its descriptor first arrives and kept until the worker retires the
    arena (and nothing here views it any more), so that a message costs no
    mapping, no page table work and no registration.

    `on_release(arena_id)` runs once nothing views the arena of a message
    any more, and `on_release(-arena_id)` once a retired arena is unmapped
    (on whichever thread drops the last view: it must only record the
    id)."""

    def __init__(self, on_release: Callable[[int], None] | None = None) -> None:
        self.on_release = on_release
        self._mappings: dict[int, _Mapping] = {}

    def admit(self, packed: Packed, fds: Sequence[int]) -> None:
        """Takes in what a message says of the arenas (those retired, a new
        one's descriptor in `fds`, which it owns from now on), whether or
        not the message is then unpacked."""
        for arena_id in packed.retired:
            self._mappings.pop(arena_id, None)
        fds = list(fds)
        try:
            if fds:
                if packed.arena_id in self._mappings or not packed.arena_bytes:
                    raise RuntimeError(
                        f"a worker sent a descriptor for arena {packed.arena_id}, which is mapped"
                        " here already or empty"
                    )
                self._mappings[packed.arena_id] = _Mapping(
                    fds.pop(0), packed.arena_bytes, packed.arena_id, self.on_release
                )
            elif packed.arena_bytes and packed.arena_id not in self._mappings:
                raise RuntimeError(
                    f"a worker's message is in arena {packed.arena_id}, unknown here"
                )
        finally:
            for fd in fds:
                os.close(fd)

    def unpack(self, packed: Packed, runtime: Any = None) -> list[Any]:
        """The items of an admitted `packed`, their arrays viewing its arena;
        with `runtime` (torch's CUDA runtime binding), the arena registered
        page-locked first, once."""
        if _interrupted_in_release[0]:
            _interrupted_in_release[0] = False
            raise KeyboardInterrupt
        owner: np.ndarray | None = None
        base: torch.Tensor | None = None
        if packed.arena_bytes:
            mapping = self._mappings[packed.arena_id]
            if runtime is not None:
                mapping.pin(runtime)
            owner = np.asarray(_Lease(mapping, packed.arena_id, self.on_release))
            if any(group[0] == "tensor" for group in packed.groups):
                base = torch.from_numpy(owner)
        rows = [_group_rows(group, owner, base) for group in packed.groups]
        del owner, base
        # Plain functions, not closures over the arena: a closure that calls
        # itself is a reference cycle, which would keep the arena (and from
        # its worker) until the garbage collector next runs.
        return [_rebuild(item, rows) for item in packed.template]

    def release_unread(self, packed: Packed) -> None:
        """`packed`'s arena goes back at once (a message not unpacked)."""
        if packed.arena_bytes and self.on_release is not None:
            self.on_release(packed.arena_id)

    def close(self) -> None:
        """Forgets every mapping; each is unmapped once nothing views it."""
        self._mappings.clear()


def _group_rows(
    group: tuple[str, str, tuple[int, ...], int, int],
    owner: np.ndarray | None,
    base: torch.Tensor | None,
) -> Sequence[Any]:
    """The arrays of one group, each a view of the arena."""
    kind, name, shape, offset, count = group
    if kind == "tensor":
        dtype = _torch_dtype(name)
        n = count * math.prod(shape) * dtype.itemsize
        if n == 0 or base is None:
            return torch.empty((count, *shape), dtype=dtype).unbind(0)
        return base[offset : offset + n].view(dtype).view(count, *shape).unbind(0)
    np_dtype = np.dtype(name)
    n = count * math.prod(shape) * np_dtype.itemsize
    if n == 0 or owner is None:
        block = np.empty((count, *shape), dtype=np_dtype)
    else:
        block = owner[offset : offset + n].view(np_dtype).reshape(count, *shape)
    # Iterating a block of zero-dimensional arrays would give numpy scalars.
    return list(block) if shape else [block[i, ...] for i in range(count)]


def _rebuild(value: Any, rows: list[Sequence[Any]]) -> Any:
    kind = type(value)
    if kind is Leaf:
        return rows[value.group][value.row]
    if kind is tuple or kind is list:
        # Leaves in place here: this runs for every item of every message.
        return kind([rows[v.group][v.row] if type(v) is Leaf else _rebuild(v, rows) for v in value])
    if kind is dict:
        return {k: _rebuild(v, rows) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return kind(*(_rebuild(v, rows) for v in value))
    return value


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
            self.sock.sendall(payload)
        elif len(payload) <= _JOINED_SEND:
            self.sock.sendall(header + payload)  # one system call
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
