"""``chute index``: a sidecar index per file, for the formats that keep one
(tar shards: ``chute.sources.tarindex``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from chute.cli import remote
from chute.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, expand
from chute.cli.kinds import format_at
from chute.common.errors import translate
from chute.kinds import file_formats
from chute.kinds.registry import one_of


def _indexed_plurals() -> str:
    return one_of([f.plural for f in file_formats() if f.index is not None])


def run(args: argparse.Namespace, out: TextIO) -> int:
    from chute import _core

    remote.configure(args)
    paths = expand(args.paths)
    formats = [format_at(p) for p in paths]
    for p, files in zip(paths, formats, strict=True):
        if files.index is None:
            raise UsageError(
                f"{p}: {files.noun}, which keeps no index (index works on {_indexed_plurals()})"
            )
    status = EXIT_OK
    for p, files in zip(paths, formats, strict=True):
        assert files.index is not None
        try:
            print(files.index(remote.target(p), args.force), file=out)
        except (_core.DataError, _core.ReadError, ValueError) as exc:
            print(f"chute index: {p}: {translate(exc)}", file=sys.stderr)
            status = EXIT_PROBLEMS
    return status


def register(sub: Any) -> None:
    """Adds the ``index`` command to the subparsers `sub`."""
    plurals = _indexed_plurals()
    p = sub.add_parser(
        "index", help=f"write a sidecar index (<file>.idx.json) beside each of the {plurals}"
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help=f"{plurals} to index: files or urls (the index goes beside each)",
    )
    p.add_argument("--force", action="store_true", help="rewrite indexes that look current")
    remote.add_arguments(p)
    p.set_defaults(func=run)
