"""``chute inspect``: what is inside each file, and what is wrong with it,
as its format (``chute.kinds``) reports it."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from chute.cli import remote
from chute.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, expand
from chute.cli.kinds import all_plurals, format_at
from chute.kinds import PathError, file_formats
from chute.kinds.report import print_problems


def run(args: argparse.Namespace, out: TextIO) -> int:
    remote.configure(args)
    paths = expand(args.paths)
    reports: list[dict[str, Any]] = []
    status = EXIT_OK
    for path in paths:
        # A path that is missing or of no known format is a finding about
        # that path: the others are still reported.
        try:
            files = format_at(path)
            report = files.inspect(remote.target(path), args)
        except (UsageError, PathError) as exc:
            reports.append({"path": path, "kind": None, "problems": [str(exc)]})
            if not args.json:
                print(f"{path}:", file=out)
                print_problems(reports[-1]["problems"], out)
            status = EXIT_PROBLEMS
            continue
        reports.append(report)
        if not args.json:
            files.print_report(report, out)
        if report["problems"]:
            status = EXIT_PROBLEMS
    if args.json:
        json.dump(reports, out, indent=2)
        out.write("\n")
    return status


def register(sub: Any) -> None:
    """Adds the ``inspect`` command to the subparsers `sub`."""
    plurals = all_plurals()
    p = sub.add_parser("inspect", help=f"what is inside {plurals}")
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help=f"{plurals} (brace patterns ok): paths or urls (s3://, https://, ...)",
    )
    p.add_argument(
        "--first", type=int, default=3, help="samples (Parquet: images) to probe and show per file"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    for files in file_formats():
        files.add_inspect_arguments(p)
    remote.add_arguments(p)
    p.set_defaults(func=run)
