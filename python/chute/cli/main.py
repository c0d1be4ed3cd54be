"""The ``chute`` command line: ``inspect``, ``index``, ``bench`` and
``sample-data``.

Exit codes: 0 success; 1 the command ran but found problems (a corrupt shard,
an incomplete sample, a file it could not index or stream); 2 bad usage (an
unknown option, a path that does not exist or is of no format the data kinds
read, ``chute.kinds``), as argparse reports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from chute.cli import bench, doctor, index, inspect, sample_data
from chute.cli.common import EXIT_USAGE, UsageError
from chute.cli.kinds import all_plurals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chute",
        description=f"Inspect, index and benchmark {all_plurals().replace(' or ', ' and ')}.",
        epilog="Exit status: 0 ok, 1 problems found, 2 bad usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (inspect, index, bench, doctor, sample_data):
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace, TextIO], int] = args.func
    try:
        return func(args, sys.stdout)
    except UsageError as exc:
        parser.exit(EXIT_USAGE, f"chute {args.command}: error: {exc}\n")
    except KeyboardInterrupt:
        return 130
