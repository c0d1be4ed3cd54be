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
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import socket
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

_HEADER = struct.Struct("<QI4x")  # payload bytes, descriptors
_MAX_FDS = 4
_ALIGN = 64
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

    def __init__(self, template: list[Any], arena_bytes: int) -> None:
        self.template = template
        self.arena_bytes = arena_bytes


def pack(items: list[Any]) -> tuple[Packed, mmap.mmap | None, int]:
    """`items` with their tensors and numpy arrays copied into a new arena:
    the packed form, the arena's mapping and its descriptor (-1 when there
    is nothing to put in one). The caller sends the descriptor with the
    message, then closes both."""
    groups: dict[tuple[Any, ...], list[tuple[Leaf, Any]]] = {}

    def walk(value: Any, path: tuple[Any, ...]) -> Any:
        kind = type(value)
        if kind is tuple or kind is list:
            return kind(walk(v, (*path, i)) for i, v in enumerate(value))
        if kind is dict:
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return kind(*(walk(v, (*path, i)) for i, v in enumerate(value)))
        if _packable_tensor(value):
            nbytes = value.numel() * value.element_size()
            leaf = Leaf("tensor", str(value.dtype), tuple(value.shape), nbytes)
        elif _packable_array(value):
            leaf = Leaf("numpy", value.dtype.str, tuple(value.shape), value.nbytes)
        else:
            return value
        groups.setdefault((path, leaf.kind, leaf.dtype, leaf.shape), []).append((leaf, value))
        return leaf

    template = [walk(item, ()) for item in items]
    size = 0
    for members in groups.values():
        size = -(-size // _ALIGN) * _ALIGN
        for leaf, _ in members:
            leaf.offset = size
            size += leaf.nbytes
    if size == 0:
        return Packed(template, 0), None, -1
    fd = os.memfd_create("chute-batch")
    try:
        os.ftruncate(fd, size)
        arena = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
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
    del base
    return Packed(template, size), arena, fd


def unpack(packed: Packed, fd: int, pin: bool = False) -> list[Any]:
    """The items of `packed`, their arrays viewing the arena `fd` (which is
    mapped, then closed: the views keep the mapping alive); with `pin`, the
    tensors copied to page-locked memory instead (``pin_memory=True``)."""
    arena: mmap.mmap | None = None
    base: torch.Tensor | None = None
    if packed.arena_bytes:
        try:
            arena = mmap.mmap(fd, packed.arena_bytes)
        finally:
            os.close(fd)
        base = torch.frombuffer(arena, dtype=torch.uint8)

    def leaf_value(leaf: Leaf) -> Any:
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
        return np.frombuffer(arena, dtype=np_dtype, count=count, offset=leaf.offset).reshape(
            leaf.shape
        )

    def walk(value: Any) -> Any:
        kind = type(value)
        if kind is Leaf:
            return leaf_value(value)
        if kind is tuple or kind is list:
            return kind(walk(v) for v in value)
        if kind is dict:
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return kind(*(walk(v) for v in value))
        return value

    return [walk(item) for item in packed.template]


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
        payload = pickle.dumps(message, protocol=5)
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
