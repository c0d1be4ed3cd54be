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
the message. What a failure is about and where it lies come as data too,
set by the engine where it raised the failure (`SCOPE_FIELDS`: its scope,
url, member and sample key), and so does the sample an indexed engine
skipped (`SAMPLE_FIELDS`) and the OS error of a failed system call
(`OS_FIELDS`): code routes and matches failures by these, never by the
message's words.
"""

from __future__ import annotations

import collections
import errno
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


# What the engine tells of a sample it skipped, as attributes of its error
# (None where not known): the id it was asked for by, which of the dataset's
# sources (shard, row group) holds it, and where it starts there (a byte, a
# row of the row group). `translate` keeps them on the exception it makes.
SAMPLE_FIELDS = ("sample_index", "sample_source", "sample_offset")

# What an engine failure is about and where it lies, as attributes the
# engine sets where it raised it (None where not known): ``failure_scope``
# (see `failure_scope`), ``url`` (the shard or file), ``member`` (the
# member's full name, or a row's column) and ``sample_key``. `translate`
# keeps them, and they survive pickling (worker processes).
SCOPE_FIELDS = ("failure_scope", "url", "member", "sample_key")

# The OS error a ReadError comes from, set by the engine where a system call
# failed (None for other failures, such as a pipe command that exited with
# a status): OSError's own ``errno``, ``strerror`` and ``filename`` (the
# file the call was about; None where it was about none). `translate` picks
# the class by ``errno`` and keeps them, and they survive pickling.
OS_FIELDS = ("errno", "strerror", "filename")


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
    failure_scope: str = "other"
    url: str | None = None
    member: str | None = None
    sample_key: str | None = None
    sample_index: int | None = None
    sample_source: int | None = None
    sample_offset: int | None = None

    def __str__(self) -> str:
        # The message as the engine worded it, also for the OSError kinds
        # (whose errno and filename are set).
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError pickles its errno, strerror and filename only when it was
        # made from them; these were set afterwards, so they go with the
        # attributes, which unpickling sets again.
        state = dict(self.__dict__)
        if isinstance(self, OSError):
            state.update((field, getattr(self, field)) for field in OS_FIELDS)
        return (type(self), self.args, state)


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


class ShardNotADirectoryError(_FromEngine, ReadError, NotADirectoryError):
    """A shard path through a file, as if it were a directory."""


class ShardPermissionError(_FromEngine, ReadError, PermissionError):
    """A shard or file this process may not read."""


class EngineDataError(_FromEngine, DataError):
    """Any other bad data the engine found."""


class EngineReadError(_FromEngine, ReadError):
    """Any other failure of the OS (``errno`` set: ``EIO``, ``EMFILE``, ...)
    or of a pipe command (``errno`` None)."""


_OS_ERRORS: dict[int | None, type[_FromEngine]] = {
    errno.ENOENT: ShardNotFoundError,
    errno.EISDIR: ShardIsADirectoryError,
    errno.ENOTDIR: ShardNotADirectoryError,
    errno.EACCES: ShardPermissionError,
    errno.EPERM: ShardPermissionError,
}


def split_where(message: str) -> tuple[str, str | None]:
    """`message` without the engine's trailing source location, and that location."""
    match = _WHERE.search(message)
    text = message[: match.start()] if match else message
    return _EMPTY_FIELD.sub(":", text), match.group(1) if match else None


def failure_scope(error: BaseException) -> str:
    """What an engine failure is about, as the engine set it where it raised
    it, which decides the handler webdataset would have given it: ``"read"``
    (opening or reading a shard, its tar structure or compression: the
    dataset's handler), ``"member"`` (a member that does not decode: the
    decode stage's), ``"field"`` (a sample lacks the member a field needs:
    the ``to_tuple``/``rename`` stage's), ``"batch"`` (a sample that does not
    fit the batch being formed) or ``"other"`` (also any exception that is
    not the engine's)."""
    scope = getattr(error, "failure_scope", None)
    return scope if isinstance(scope, str) else "other"


def member_extension(member: str, key: str | None) -> str:
    """webdataset's ``k`` of `member`: what follows the sample's key in a tar
    member's name (``KEY.EXT``), lowercased as webdataset lowercases it; a
    row's column (no key in front) as it is."""
    if key is not None and member.startswith(key + "."):
        return member[len(key) + 1 :].lower()
    return member


def translate(exc: BaseException) -> BaseException:
    """The exception to raise for `exc`: an engine failure becomes the class
    its kind calls for (see the module docstring), with ``where`` set; any
    other exception is returned as it is."""
    if isinstance(exc, _FromEngine) or not isinstance(exc, DataError | ReadError):
        return exc
    message, where = split_where(str(exc))
    scope = failure_scope(exc)
    url = getattr(exc, "url", None)
    new: _FromEngine
    if isinstance(exc, ReadError):
        new = _OS_ERRORS.get(exc.errno, EngineReadError)(message)
        for field in OS_FIELDS:
            setattr(new, field, getattr(exc, field))
    elif scope == "read":
        new = TarArchiveError(message)
    elif scope == "member":
        member = getattr(exc, "member", None)
        key = getattr(exc, "sample_key", None)
        k = None if member is None else member_extension(member, key)
        new = MemberDecodeError(message, url=url, key=key, k=k)
    else:
        new = EngineDataError(message)
    new.where = where
    new.failure_scope = scope
    for field in SCOPE_FIELDS[1:] + SAMPLE_FIELDS:
        setattr(new, field, getattr(exc, field, None))
    return new


@contextmanager
def engine_errors() -> Iterator[None]:
    """Re-raises engine failures raised inside the block (calls into the
    engine only) as `translate` maps them."""
    try:
        yield
    except (DataError, ReadError) as exc:
        new = translate(exc)
        if new is exc:
            raise
        raise new.with_traceback(exc.__traceback__) from None
