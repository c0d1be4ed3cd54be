"""Remote urls on the command line (``chute inspect s3://bucket/shard.tar``):
the options the commands take for them, and the few ways a command touches
a file (its size, its bytes at an offset, the engine's source options,
h5py's view), for local paths and remote objects alike.

Credentials, region and endpoint come from the standard environment
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), as for the datasets;
``--storage-option KEY=VALUE`` adds the store's own settings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from chute.cli.common import UsageError

_options: Any = None  # the RemoteOptions of this run, set by configure()
STAND_IN_RANGE_BYTES = 8 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="object-store setting for remote urls (e.g. endpoint=http://host:9000)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="node-shared cache for remote objects (and pipe: urls)",
    )


def configure(args: argparse.Namespace) -> None:
    """Takes this run's remote options from the parsed arguments."""
    global _options
    from chute.remote import RemoteOptions

    storage: dict[str, str] = {}
    for item in getattr(args, "storage_option", []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {item!r}: expected KEY=VALUE")
        storage[key] = value
    cache_dir = getattr(args, "cache_dir", None)
    _options = RemoteOptions(
        storage_options=storage,
        cache_dir=os.path.expanduser(cache_dir) if cache_dir else None,
    )


def options() -> Any:
    from chute.remote import RemoteOptions

    return _options if _options is not None else RemoteOptions()


def is_remote(path: str) -> bool:
    from chute.remote import is_remote_url

    return is_remote_url(path)


def _session() -> Any:
    from chute.remote import get_session

    return get_session(options())


def _ranges(path: str) -> Any:
    from chute import _core

    try:
        return _session().ranges(path)
    except _core.ReadError as exc:
        raise UsageError(str(exc)) from None


def size_of(path: str) -> int:
    return int(_ranges(path).size) if is_remote(path) else os.path.getsize(path)


def head_bytes(path: str, n: int) -> bytes:
    """The first `n` bytes (fewer for a shorter file)."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read(n)
    ranges = _ranges(path)
    data: bytes = ranges.read(0, min(n, int(ranges.size)))
    return data


def exists(path: str) -> bool:
    """Whether the remote object answers its HEAD (False for any read error)."""
    from chute import _core

    try:
        _session().ranges(path)
    except _core.ReadError:
        return False
    return True


def stand_in(path: str, local: str, head: int | None) -> int:
    """Writes at `local` a file as long as the remote object `path`: its
    first `head` bytes (all of them when None), read by ranges, and after
    them a hole (zeros that take no disk and were never fetched). Returns
    the object's size."""
    ranges = _ranges(path)
    size = int(ranges.size)
    wanted = size if head is None else min(head, size)
    with open(local, "wb") as f:
        for offset in range(0, wanted, STAND_IN_RANGE_BYTES):
            f.write(bytes(ranges.read(offset, min(STAND_IN_RANGE_BYTES, wanted - offset))))
        f.truncate(size)
    return size


def source_for(path: str) -> Any:
    """The engine's SourceOptions for a remote url (None for a local path)."""
    return _session().native_source() if is_remote(path) else None


@contextmanager
def reader(path: str) -> Iterator[Callable[[int, int], bytes]]:
    """``read(offset, size)`` over the file: pread, or a ranged request."""
    if is_remote(path):
        ranges = _ranges(path)
        yield lambda offset, size: bytes(ranges.read(offset, size))
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        yield lambda offset, size: os.pread(fd, size, offset)
    finally:
        os.close(fd)


def h5_target(path: str) -> Any:
    """What h5py.File opens: the path, or a file object over the remote object."""
    return _session().file(path) if is_remote(path) else path


def h5_stat(path: str) -> Any:
    """os.stat of a local file; a remote object's size and version."""
    if not is_remote(path):
        return os.stat(path)
    from chute.sources.h5layout import RemoteStat

    ranges = _ranges(path)
    return RemoteStat(int(ranges.size), str(ranges.version))
