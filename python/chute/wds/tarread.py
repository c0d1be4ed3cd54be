"""Tar shards read in Python, member by member: the slow path of
``select_files=`` and ``rename_files=``.

Both are arbitrary functions of every member's full name, and ``rename_files``
may change how members group into samples, so they must see each member
before the samples are formed. The engine's reader runs on native threads
and calls no Python; rather than call back into Python once per member from
there, a dataset given either function reads its shards here, with Python's
``tarfile``, and runs all its stages in Python (counted in
``stats()["python_items"]``, one per sample). Samples are webdataset's:
``rename_files`` first, then ``select_files`` on the new name; metadata
members (``__*__``) and names without an extension are dropped; members
group by key (the name up to the first dot of its base name) into
``{"__key__", "__url__", ext: bytes}``, ``__local_path__`` for local files.
"""

from __future__ import annotations

import re
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from chute.common.handlers import Handler
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.shards import local_path

# webdataset's rules: metadata members, and a name's key and extension.
_META = re.compile(r"__[^/]*__($|/)")
_KEY_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")

NameFilter = Callable[[str], bool]
NameMap = Callable[[str], str]


class _StopAll(Exception):
    """A handler asked to end the iteration."""


class _PipeReader:
    """The standard output of a ``pipe:`` command. Closing it after the end
    waits for the command and raises when it failed; closing it before
    ends the command."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.process = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        self.stdout: IO[bytes] = self.process.stdout
        self.ended = False

    def read(self, size: int = -1) -> bytes:
        data = self.stdout.read(size)
        self.ended = self.ended or not data
        return data

    def close(self) -> None:
        if not self.ended:
            self.process.kill()
        self.stdout.close()
        status = self.process.wait()
        if self.ended and status != 0:
            raise OSError(f"pipe command {self.command!r} exited with status {status}")


def open_shard(url: str, remote: RemoteOptions) -> Any:
    """A binary stream of the shard at `url`."""
    if url.startswith("pipe:"):
        return _PipeReader(url[len("pipe:") :])
    if is_remote_url(url):
        return get_session(remote).file(url)
    path = local_path(url)
    if path is None:
        raise ValueError(f"cannot read {url!r}: not a local file, pipe: command or remote url")
    return open(path, "rb")


class _Shard:
    """One shard's members as they are read; `stopped` when a handler asked
    to end the iteration."""

    def __init__(self, stream: Any, handler: Handler) -> None:
        self.stream = stream
        self.handler = handler
        self.stopped = False

    def members(
        self, select_files: NameFilter | None, rename_files: NameMap | None
    ) -> Iterator[tuple[str, bytes]]:
        """(name, bytes) of the regular members `select_files` keeps, under
        their `rename_files` names. A member that fails goes to the handler,
        which skips it or ends the shard; a shard that cannot be read on
        ends it, or the iteration. Either way the members read so far still
        form their sample, as webdataset's reader leaves them."""
        try:
            with tarfile.open(fileobj=self.stream, mode="r|*") as archive:
                for info in archive:
                    try:
                        if not info.isreg():
                            continue
                        name = info.name
                        if "/" not in name and name.startswith("__") and name.endswith("__"):
                            continue
                        if _META.match(name):
                            continue
                        if rename_files is not None:
                            name = rename_files(name)
                        if select_files is not None and not select_files(name):
                            continue
                        member = archive.extractfile(info)
                        assert member is not None
                        data = member.read()
                    except Exception as exn:
                        if self.handler(exn):
                            continue
                        return
                    yield name, data
                    # A stream keeps no list of what it has read.
                    archive.members = []  # type: ignore[attr-defined]
        except Exception as exn:
            self.stopped = not self.handler(exn)


def _group(
    url: str, members: Iterator[tuple[str, bytes]], handler: Handler
) -> Iterator[dict[str, Any]]:
    """Consecutive members of one key as one sample. A repeated extension
    goes to `handler`, which leaves the member out or ends the iteration."""
    path = local_path(url)
    current: dict[str, Any] | None = None
    for name, data in members:
        match = _KEY_EXTENSION.match(name)
        if match is None:
            continue
        key, extension = match.group(1), match.group(2).lower()
        if current is None or key != current["__key__"]:
            if current is not None:
                yield current
            current = {"__key__": key, "__url__": url}
            if path is not None:
                current["__local_path__"] = path
        if extension in current:
            duplicate = ValueError(
                f"{name}: duplicate file name in tar file {extension} {current.keys()}"
            )
            if handler(duplicate):
                continue
            raise _StopAll
        current[extension] = data
    if current is not None:
        yield current


def tar_samples(
    urls: list[str],
    handler: Handler,
    select_files: NameFilter | None,
    rename_files: NameMap | None,
    remote: RemoteOptions,
) -> Iterator[dict[str, Any]]:
    """The samples of `urls`, in order. A shard that fails to open or to
    read goes to `handler`, which skips it or ends the iteration."""
    for url in urls:
        try:
            stream = open_shard(url, remote)
            try:
                shard = _Shard(stream, handler)
                yield from _group(url, shard.members(select_files, rename_files), handler)
            finally:
                stream.close()
        except _StopAll:
            return
        except Exception as exn:
            if not handler(exn):
                return
        else:
            if shard.stopped:
                return
