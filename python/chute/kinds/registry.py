"""The data kinds chute reads, one entry each, and the file formats they read.

A **data kind** (`DataKind`) is one way of reading data with chute: a
dataset class (``TarDataset``, ``H5Dataset``, ...), a stream
(``WebDataset``, ``ParquetStream``) or a composition of others (``mix``,
``Curriculum``). Its entry says, for everything that treats kinds alike:

- ``name``: the registry key; the public name (``"TarDataset"``).
- ``summary``: one line for the docs' list of kinds.
- ``files``: the `FileFormat` it reads (None: it is built in memory or from
  other datasets, and has no paths to claim); kinds reading the same files
  share one `FileFormat` object.
- ``index_driven``: how its samples are counted for DDP and elastic
  resume. True: map-style, the loader's ``DistributedSampler`` (chute's
  ``ElasticSampler``) partitions ``len(dataset)``; False: a stream, whose
  shards are split by rank and counted before reading by the counter of
  ``sample_counter``.
- ``sample_counter``: a stream's source format, the name its counter is
  registered under in ``chute.sources.sample_counts`` (None for map-style
  kinds): counts come from there, never from a second copy here.
- ``takes``: which of `OpenSpec`'s kind-specific options it uses
  (``"fields"``, ``"columns"``); the CLI refuses the others for it.
- ``open(spec)``: the dataset over the paths of `spec` (a `OpenSpec`:
  decode options, fields, remote settings); ``bench_loader(spec)`` the
  ``chute.DataLoader`` that ``chute bench`` and ``chute doctor`` read, with
  its label; ``reference_loader(spec)`` the loader another library offers
  over the same data (``--compare``, labelled ``reference_label``), or
  None, and ``reference_problem(spec)`` why it cannot read `spec`. A kind without paths
  (``files`` None) is opened by its conformance factory only.

A **file format** (`FileFormat`) is what a path holds: ``claims(target)``
says, by content where possible, whether a `Target` (one path or url, and
how to read it) is one of its files, ``claims_directory(target)`` whether a
directory (local, or a remote prefix that is no object) is one of its data
sets (``directory_noun`` names one: formats whose data is a directory set
both); ``inspect`` and ``print_report`` are
``chute inspect``'s report; ``index`` is ``chute index`` (None: nothing to
index); ``indexed_count`` the samples its metadata gives before reading
(progress totals); ``images`` encoded images for ``bench --decode-limit``.
Formats are asked in order of their ``priority`` (highest first), then of
registration; the first that claims a path has it.

Registering: a kind's module (``chute/kinds/<kind>.py``) defines its
`DataKind` subclass (and `FileFormat`, when it reads files no other kind
reads) and calls ``register_kind(Kind())`` at import; ``chute/kinds/__init__.py``
imports it. Nothing else names a kind: the command line, the sample
counters and the tests (``tests/conformance/``: a factory per kind name,
required for every registered kind) read this registry. Heavy
dependencies (pyarrow, h5py, webdataset) are imported inside the methods
that need them, so that importing the registry stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, TextIO

from chute.remote import RemoteOptions, get_session, is_remote_url


class PathError(ValueError):
    """A path no kind can read: missing, unreadable, or of no known format."""


class Target:
    """One path or url that a format is asked about, and how to read it:
    local files directly, remote objects through the session of `remote`."""

    def __init__(self, path: str, remote: RemoteOptions | None = None) -> None:
        self.path = path
        self.remote = remote if remote is not None else RemoteOptions()
        self.is_remote = is_remote_url(path)
        self._head: bytes | None = None
        self._head_is_all = False  # the head kept is the whole file

    def _ranges(self) -> Any:
        from chute import _core

        try:
            return get_session(self.remote).ranges(self.path)
        except _core.ReadError as exc:
            raise PathError(str(exc)) from None

    def exists(self) -> bool:
        """Whether the file (a local path, a directory too) or the remote
        object (its HEAD answers) is there."""
        if not self.is_remote:
            return os.path.exists(self.path)
        try:
            self._ranges()
        except PathError:
            return False
        return True

    def is_dir(self) -> bool:
        return not self.is_remote and os.path.isdir(self.path)

    def size(self) -> int:
        return int(self._ranges().size) if self.is_remote else os.path.getsize(self.path)

    def version(self) -> str:
        """A remote object's version (ETag); a local file's modification time."""
        if self.is_remote:
            return str(self._ranges().version)
        return str(os.stat(self.path).st_mtime_ns)

    def head(self, n: int = 512) -> bytes:
        """The first `n` bytes (fewer for a shorter file); the longest head
        read is kept, so formats asked in turn read the file once."""
        if self._head is not None and (len(self._head) >= n or self._head_is_all):
            return self._head[:n]
        if self.is_remote:
            ranges = self._ranges()
            data = bytes(ranges.read(0, min(n, int(ranges.size)))) if n else b""
        else:
            with open(self.path, "rb") as f:
                data = f.read(n)
        self._head, self._head_is_all = data, len(data) < n
        return data

    @contextmanager
    def reader(self) -> Iterator[Callable[[int, int], bytes]]:
        """``read(offset, size)`` over the file: pread, or a ranged request."""
        if self.is_remote:
            ranges = self._ranges()
            yield lambda offset, size: bytes(ranges.read(offset, size))
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            yield lambda offset, size: os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def stand_in(self, local: str, head: int | None, chunk: int = 8 << 20) -> int:
        """Writes at `local` a file as long as the remote object: its first
        `head` bytes (all of them when None), read by ranges, and after them
        a hole (zeros that take no disk and were never fetched). Returns the
        object's size."""
        ranges = self._ranges()
        size = int(ranges.size)
        wanted = size if head is None else min(head, size)
        with open(local, "wb") as f:
            for offset in range(0, wanted, chunk):
                f.write(bytes(ranges.read(offset, min(chunk, wanted - offset))))
            f.truncate(size)
        return size

    def child(self, name: str) -> Target:
        """The file `name` in the directory at this path (a remote prefix)."""
        if self.is_remote:
            return Target(f"{self.path.rstrip('/')}/{name}", self.remote)
        return Target(os.path.join(self.path, name), self.remote)

    def sibling(self, path: str) -> Target:
        """Another path read with the same remote settings."""
        return Target(path, self.remote)

    def native_source(self) -> Any:
        """The engine's SourceOptions for a remote url (None for a local path)."""
        return get_session(self.remote).native_source() if self.is_remote else None


@dataclass
class OpenSpec:
    """What ``chute bench`` and ``chute doctor`` open: paths of one format
    and how to read them (JSON round-trips it to a fresh interpreter).

    ``decode``: an image spec (``"torchrgb8"``), ``""`` for the default
    decoders without images, ``"raw"`` for no decoding at all.
    ``image_options``: ``decode()``'s image options. ``fields``: tar kinds'
    ``to_tuple`` fields (``["jpg;png", "cls"]``; empty: dict samples).
    ``columns``: columnar kinds' columns (empty: all). ``workers``: the
    loader's num_workers (``"auto"`` for ``chute doctor``'s default)."""

    paths: list[str]
    batch_size: int = 64
    workers: int | str = 0
    decode: str = ""
    image_options: dict[str, Any] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    storage_options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OpenSpec:
        return cls(**data)

    def remote(self) -> RemoteOptions:
        return RemoteOptions(
            storage_options=dict(self.storage_options), cache_dir=self.cache_dir or None
        )


class FileFormat:
    """What a path holds (module doc): one object per format, shared by the
    kinds that read it."""

    name: ClassVar[str]  # the inspect report's "kind": "tar", "parquet", ...
    noun: ClassVar[str]  # one file, with its article: "a tar shard"
    plural: ClassVar[str]  # "tar shards"
    # Formats told by name (token files) are asked before those that read
    # the content; the highest priority first.
    priority: ClassVar[int] = 0

    # A data set of this format that is a directory, with its article ("an
    # MDS directory"); "" for a format whose data is files only.
    directory_noun: ClassVar[str] = ""

    def claims(self, target: Target) -> bool:
        """Whether the file at `target` is one of this format's."""
        raise NotImplementedError

    def claims_directory(self, target: Target) -> bool:
        """Whether the directory at `target` is one of this format's data
        sets (told by the file it holds: ``target.child(name).exists()``)."""
        return False

    def add_inspect_arguments(self, parser: Any) -> None:
        """``chute inspect``'s options of this format (an argparse parser)."""

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        """``chute inspect``'s report (JSON-ready; "path", "kind" and
        "problems" at least). `options`: the parsed arguments (``first``
        and this format's own)."""
        raise NotImplementedError

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        raise NotImplementedError

    # ``chute index``: a method (target, force) -> the line to print, or
    # None for a format that has nothing to index. Failures: ValueError,
    # chute.DataError or chute.ReadError.
    index: Callable[[Target, bool], str] | None = None

    def indexed_count(self, targets: Sequence[Target]) -> int | None:
        """The samples of the files, from their metadata alone (an index,
        a footer), or None when that is not at hand."""
        return None

    def images(self, paths: Sequence[str], columns: Sequence[str], count: int) -> list[bytes]:
        """Up to `count` of the files' encoded images (local paths)."""
        return []


class DataKind:
    """One kind of data chute reads (module doc)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    files: ClassVar[FileFormat | None] = None
    index_driven: ClassVar[bool] = True
    sample_counter: ClassVar[str | None] = None
    takes: ClassVar[frozenset[str]] = frozenset()
    # The reference loader's label ("" where the kind has none), and why
    # --compare has nothing to run where it has none.
    reference_label: ClassVar[str] = ""
    compare_hint: ClassVar[str] = ""
    # How ``chute bench`` labels its loader (default: "chute (<name>)").
    bench_label: ClassVar[str] = ""

    def open(self, spec: OpenSpec) -> Any:
        """The dataset over `spec`'s paths."""
        raise NotImplementedError(f"{self.name} is not opened from paths")

    @property
    def opens_paths(self) -> bool:
        return type(self).open is not DataKind.open

    def bench_loader(self, spec: OpenSpec) -> tuple[str, Iterable[Any]]:
        """The loader ``chute bench`` and ``chute doctor`` read, and its label."""
        from chute.loader.dataloader import DataLoader

        loader: DataLoader[Any] = DataLoader(
            self.open(spec), batch_size=spec.batch_size, num_workers=spec.workers
        )
        return self.bench_label or f"chute ({self.name})", loader

    def reference_loader(self, spec: OpenSpec) -> tuple[str, Iterable[Any]] | None:
        """Another library's loader over the same data (``--compare``), or None."""
        return None

    def reference_problem(self, spec: OpenSpec) -> str | None:
        """Why the reference loader cannot read `spec` (None: it can)."""
        if not self.reference_label:
            return self.compare_hint or f"--compare: {self.name} has no reference loader"
        return None

    def __repr__(self) -> str:
        return f"<data kind {self.name}>"


_KINDS: dict[str, DataKind] = {}


def register_kind(kind: DataKind) -> DataKind:
    """Adds `kind` to the registry (a name registered twice is an error:
    two modules claiming one kind)."""
    if kind.name in _KINDS:
        raise ValueError(f"data kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind
    return kind


def registered_kinds() -> list[DataKind]:
    """Every kind, in the order registered."""
    return list(_KINDS.values())


def kind_named(name: str) -> DataKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise ValueError(f"no data kind {name!r}; the kinds are: {', '.join(_KINDS)}") from None


def file_formats() -> list[FileFormat]:
    """The formats the kinds read, each once, in the order registered."""
    found: list[FileFormat] = []
    for kind in _KINDS.values():
        if kind.files is not None and all(kind.files is not f for f in found):
            found.append(kind.files)
    return found


def kinds_reading(files: FileFormat) -> list[DataKind]:
    """The kinds that read `files`, in the order registered (the first is
    the command line's default for them)."""
    return [k for k in _KINDS.values() if k.files is files]


def one_of(nouns: Sequence[str], conjunction: str = "or") -> str:
    """``a, b or c`` (``nor`` after "neither")."""
    if len(nouns) <= 1:
        return "".join(nouns)
    return f"{', '.join(nouns[:-1])} {conjunction} {nouns[-1]}"


def format_of(target: Target) -> FileFormat:
    """The format of the file at `target`, by content where the format
    allows (extensions lie); PathError when it is missing or of none."""
    formats = sorted(file_formats(), key=lambda f: -f.priority)
    if not target.is_remote and not target.exists():
        raise PathError(f"{target.path}: no such file")
    # A local directory, or a remote prefix (no object answers there).
    if target.is_dir() or (target.is_remote and not target.exists()):
        for files in formats:
            if files.claims_directory(target):
                return files
        if target.is_dir():
            plurals = [f.plural for f in file_formats()]
            nouns = [f.directory_noun for f in file_formats() if f.directory_noun]
            kinds = f"neither {one_of(nouns, 'nor')}; " if nouns else ""
            raise PathError(
                f"{target.path}: is a directory ({kinds}pass the {one_of(plurals)} in it)"
            )
    for files in formats:
        if files.claims(target):
            return files
    nouns = [f.noun for f in file_formats()]
    raise PathError(f"{target.path}: neither {one_of(nouns, 'nor')}")
