"""The engine's failures as the exceptions Python code expects.

The engine raises two classes (``chute.DataError``, a ``ValueError``, for bad
data; ``chute.ReadError``, an ``OSError``, when the OS or a pipe command
failed). Code written for webdataset and the standard library catches finer
ones: ``FileNotFoundError`` for a missing shard, ``tarfile.ReadError`` for a
truncated or malformed archive, ``webdataset.DecodingError`` for a member
that does not decode. Each class below derives from both chute's class and
the one other code expects, so either ``except`` catches it.

Every message names the data (shard, member, offset); the place in chute's
C++ source that raised it is kept on ``err.where`` (for bug reports), not in
the message. The error of a sample an indexed engine skipped also names the
sample as data (``sample_index``, ``sample_source``, ``sample_offset``; see
`SAMPLE_FIELDS`), which code matches it by, never by the message's words.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import tarfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from chute._core import DataError, ReadError

# " [stream_engine.cc:82]": the engine's source location at the end of a message.
_WHERE = re.compile(r" \[([\w.+-]+\.(?:cc|h|hpp|cpp):\d+)\]\Z")
# An empty field between two separators (a location the engine left blank).
_EMPTY_FIELD = re.compile(r": :(?= )")
_MEMBER = re.compile(r"\Ashard '(?P<url>.*?)', member '(?P<member>[^']*)' at offset \d+: ")
# A Parquet row's column, as chute.wds.ParquetStream's source names it.
_ROW_MEMBER = re.compile(
    r"\Afile '(?P<url>.*?)', row group \d+, row (?P<row>\d+), column '(?P<column>[^']*)': "
)


# What the engine tells of a sample it skipped, as attributes of its error
# (None where not known): the id it was asked for by, which of the dataset's
# sources (shard, row group) holds it, and where it starts there (a byte, a
# row of the row group). `translate` keeps them on the exception it makes.
SAMPLE_FIELDS = ("sample_index", "sample_source", "sample_offset")


class SkippedSamples:
    """The errors of the samples an indexed engine skipped, each handed to
    the batch it was submitted in. The engine decodes batches ahead, so the
    skips taken when one batch comes may include later batches' rows: those
    wait here for their batch. A skip is matched by the id it carries
    (``sample_index``), never by the words of its message."""

    def __init__(self) -> None:
        self._waiting: list[Exception] = []

    def of_batch(
        self, taken: Iterable[Exception], rows: Iterable[int], count: int
    ) -> list[Exception]:
        """The errors of `count` skipped rows among `rows` (the ids a batch
        was submitted as), `taken` (the engine's latest skips) added first to
        those waiting."""
        self._waiting.extend(taken)
        missing = collections.Counter(rows)
        found: list[Exception] = []
        waiting: list[Exception] = []
        for error in self._waiting:
            row = getattr(error, "sample_index", None)
            if len(found) < count and row is not None and missing[row] > 0:
                missing[row] -= 1
                found.append(error)
            else:
                waiting.append(error)
        self._waiting = waiting
        return found


class DecodingError(Exception):
    """webdataset's ``DecodingError``: a member of a sample could not be
    decoded. ``url`` and ``key`` name the sample, ``k`` the member's
    extension, ``sample`` the sample when Python had it (None for samples the
    engine decoded). The exception that caused it is ``__cause__``."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        k: str | None = None,
        sample: Any = None,
        message: str | None = None,
    ) -> None:
        text = message or f"cannot decode member {k!r} of sample {key!r} in {url!r}"
        super().__init__(text)
        self.url = url
        self.key = key
        self.k = k
        self.sample = sample


class _FromEngine(Exception):
    """Marks the classes below: an engine failure, already translated."""

    where: str | None = None
    sample_index: int | None = None
    sample_source: int | None = None
    sample_offset: int | None = None

    def __str__(self) -> str:
        # The message as the engine worded it, also for the OSError kinds
        # (whose errno and filename are set).
        return str(self.args[0]) if self.args else ""


class TarArchiveError(_FromEngine, DataError, tarfile.ReadError):
    """A shard that is not a valid tar archive, is cut short, or is a
    compressed stream that ends early or does not inflate (webdataset reports
    these as ``tarfile.ReadError``)."""


class MemberDecodeError(_FromEngine, DataError, DecodingError):
    """A member the engine could not decode (webdataset: ``DecodingError``)."""

    def __init__(
        self, message: str, url: str | None = None, key: str | None = None, k: str | None = None
    ) -> None:
        DecodingError.__init__(self, url=url, key=key, k=k, message=message)


class ShardNotFoundError(_FromEngine, ReadError, FileNotFoundError):
    """A shard or file that does not exist."""


class ShardIsADirectoryError(_FromEngine, ReadError, IsADirectoryError):
    """A shard path that names a directory."""


class ShardPermissionError(_FromEngine, ReadError, PermissionError):
    """A shard or file this process may not read."""


class EngineDataError(_FromEngine, DataError):
    """Any other bad data the engine found."""


class EngineReadError(_FromEngine, ReadError):
    """Any other failure of the OS or of a pipe command."""


_OS_ERRORS: list[tuple[int, type[_FromEngine]]] = [
    (errno.ENOENT, ShardNotFoundError),
    (errno.EISDIR, ShardIsADirectoryError),
    (errno.EACCES, ShardPermissionError),
    (errno.EPERM, ShardPermissionError),
]


def split_where(message: str) -> tuple[str, str | None]:
    """`message` without the engine's trailing source location, and that location."""
    match = _WHERE.search(message)
    text = message[: match.start()] if match else message
    return _EMPTY_FIELD.sub(":", text), match.group(1) if match else None


# Failures of the OS or of a pipe command, as the engine words them.
_READ_FAILURE = re.compile(
    r"\A(cannot open |read error in |pipe command |cannot start pipe command |pipe source "
    r"|cannot create a pipe)"
)


def failure_scope(message: str) -> str:
    """What an engine failure (`message`, location removed) is about, which
    decides the handler webdataset would have given it: ``"read"`` (opening
    or reading a shard, its tar structure or compression: the dataset's
    handler), ``"member"`` (a member that does not decode: the decode
    stage's), ``"field"`` (a sample lacks the member a field needs: the
    ``to_tuple``/``rename`` stage's), ``"batch"`` (a sample that does not fit
    the batch being formed) or ``"other"``."""
    if (
        _READ_FAILURE.match(message)
        or "tar archive" in message
        or "gzip stream" in message
        or "-compressed stream" in message
    ):
        return "read"
    if "' not found (wanted one of " in message:
        return "field"
    if " but this batch holds " in message:
        return "batch"
    if _MEMBER.match(message) or _ROW_MEMBER.match(message):
        return "member"
    return "other"


def from_message(message: str) -> BaseException:
    """The exception for an engine failure known only by its message."""
    text, _ = split_where(message)
    base = ReadError if _READ_FAILURE.match(text) else DataError
    return translate(base(message))


_KINDS: dict[str, type[Exception]] = {
    "data": DataError,
    "io": ReadError,
    "usage": ValueError,
    "timeout": TimeoutError,
    "memory": MemoryError,
}


def from_engine_failure(kind: str, message: str) -> BaseException:
    """The exception for a failure the engine reports by kind ("data", "io",
    "usage", "timeout", "memory") and message (a sample it skipped)."""
    return translate(_KINDS.get(kind, DataError)(message))


def translate(exc: BaseException) -> BaseException:
    """The exception to raise for `exc`: an engine failure becomes the class
    its kind calls for (see the module docstring), with ``where`` set; any
    other exception is returned as it is."""
    if isinstance(exc, _FromEngine) or not isinstance(exc, DataError | ReadError):
        return exc
    message, where = split_where(str(exc))
    new: _FromEngine
    if isinstance(exc, ReadError):
        cls: type[_FromEngine] = EngineReadError
        code = None
        for number, candidate in _OS_ERRORS:
            if message.endswith(": " + os.strerror(number)):
                cls, code = candidate, number
                break
        new = cls(message)
        if code is not None:
            assert isinstance(new, OSError)
            new.errno = code
            new.strerror = os.strerror(code)
            quoted = re.search(r"'([^']*)'", message)
            new.filename = quoted.group(1) if quoted else None
    elif (scope := failure_scope(message)) == "read":
        new = TarArchiveError(message)
    elif scope == "member" and (member := _MEMBER.match(message)) is not None:
        name = member.group("member")
        base = name.rpartition("/")[2]
        key, _, ext = base.partition(".")
        new = MemberDecodeError(
            message,
            url=member.group("url"),
            key=name[: len(name) - len(base)] + key,
            k=ext.lower(),
        )
    elif scope == "member" and (row := _ROW_MEMBER.match(message)) is not None:
        new = MemberDecodeError(message, url=row.group("url"), k=row.group("column"))
    else:
        new = EngineDataError(message)
    new.where = where
    for field in SAMPLE_FIELDS:
        setattr(new, field, getattr(exc, field, None))
    return new


@contextmanager
def engine_errors() -> Iterator[None]:
    """Re-raises engine failures raised inside the block (calls into the
    engine only) as `translate` maps them. A failure whose message holds
    bytes of a tar name that are not UTF-8 reaches Python as the
    UnicodeDecodeError of converting the message; it is raised as the
    failure, its stray bytes shown as \\xNN."""
    try:
        yield
    except (DataError, ReadError) as exc:
        new = translate(exc)
        if new is exc:
            raise
        raise new.with_traceback(exc.__traceback__) from None
    except UnicodeDecodeError as exc:
        if not isinstance(exc.object, bytes):
            raise
        message = exc.object.decode("utf-8", "backslashreplace")
        raise from_message(message).with_traceback(exc.__traceback__) from None
