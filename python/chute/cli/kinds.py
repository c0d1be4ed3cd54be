"""The data kinds (``chute.kinds``) as the commands ask for them: the format
of a path, the kind that opens a set of paths, and the words that list
them in help and messages. Nothing here names a kind or a format."""

from __future__ import annotations

import argparse
from pathlib import Path

from chute.cli import remote
from chute.cli.common import UsageError
from chute.kinds import DataKind, FileFormat, OpenSpec, PathError, file_formats, format_of
from chute.kinds.registry import kind_named, kinds_reading, one_of, registered_kinds


def format_at(path: str) -> FileFormat:
    """The format of the file at `path`, by content; UsageError when it is
    missing or of no known format."""
    try:
        return format_of(remote.target(path))
    except PathError as exc:
        raise UsageError(str(exc)) from None


def openable_kinds() -> list[DataKind]:
    """The kinds that open files (``chute bench``, ``chute doctor``)."""
    return [k for k in registered_kinds() if k.files is not None and k.opens_paths]


def openable_plurals() -> str:
    """``tar shards or Parquet files``: what bench and doctor read."""
    found: list[str] = []
    for kind in openable_kinds():
        assert kind.files is not None
        if kind.files.plural not in found:
            found.append(kind.files.plural)
    return one_of(found)


def all_plurals() -> str:
    """Every format's files, for help texts: ``tar shards, HDF5 files or ...``."""
    return one_of([f.plural for f in file_formats()])


def kind_for(paths: list[str], name: str | None, command: str) -> DataKind:
    """The kind `command` opens `paths` with: `name` when given (it must
    read their format), else the first kind registered for their format.
    UsageError when the paths are of several formats or of one no kind
    opens."""
    first = format_at(paths[0])
    for p in paths:
        files = format_at(p)
        readers = [k for k in kinds_reading(files) if k.opens_paths]
        if files is not first or not readers:
            raise UsageError(
                f"{p}: {command} reads {openable_plurals()}, all of one kind "
                f"(the first is {first.name}); this is not one"
            )
    readers = [k for k in kinds_reading(first) if k.opens_paths]
    if name is None:
        return readers[0]
    try:
        kind = kind_named(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if kind not in readers:
        raise UsageError(
            f"--kind {name}: does not read {first.plural}; those are read by "
            + one_of([k.name for k in readers])
        )
    return kind


def check_options(kind: DataKind, spec: OpenSpec) -> None:
    """UsageError for an option of `spec` that `kind` does not take."""
    flags = {"fields": "--to-tuple", "columns": "--columns"}
    for option, flag in flags.items():
        if getattr(spec, option) and option not in kind.takes:
            takers = [k.name for k in openable_kinds() if option in k.takes]
            raise UsageError(f"{flag} goes with {one_of(takers)}; {kind.name} does not take it")


def add_kind_argument(p: argparse.ArgumentParser) -> None:
    names = [k.name for k in openable_kinds()]
    p.add_argument(
        "--kind",
        choices=names,
        metavar="KIND",
        help="the data kind that reads the files (default: the first that reads their "
        f"format): {', '.join(names)}",
    )


def resolved(paths: list[str]) -> list[str]:
    """Local paths made absolute (a fresh interpreter may run elsewhere)."""
    return [p if remote.is_remote(p) else str(Path(p).resolve()) for p in paths]
