"""``chute index``: a sidecar index per tar shard (see ``chute.sources.tarindex``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from chute.cli import remote
from chute.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, expand
from chute.cli.kinds import kind_of
from chute.common.errors import translate


def run(args: argparse.Namespace, out: TextIO) -> int:
    from chute import _core
    from chute.sources.tarindex import index_path, write_index

    remote.configure(args)
    paths = expand(args.shards)
    for p in paths:
        if kind_of(p) != "tar":
            raise UsageError(f"{p}: not a tar shard (index works on tar shards)")
    status = EXIT_OK
    for p in paths:
        if remote.is_remote(p):
            try:
                print(_index_remote(p, args.force), file=out)
            except (_core.DataError, _core.ReadError, ValueError) as exc:
                print(f"chute index: {p}: {exc}", file=sys.stderr)
                status = EXIT_PROBLEMS
            continue
        target = index_path(p)
        if (
            target.exists()
            and not args.force
            and target.stat().st_mtime_ns >= os.stat(p).st_mtime_ns
        ):
            print(f"{target}: up to date", file=out)
            continue
        try:
            written = write_index(p)
        except (_core.DataError, _core.ReadError, ValueError) as exc:
            print(f"chute index: {p}: {translate(exc)}", file=sys.stderr)
            status = EXIT_PROBLEMS
            continue
        doc = json.loads(written.read_text(encoding="utf-8"))
        print(f"{written}: {len(doc['samples'])} samples", file=out)
    return status


def _index_remote(url: str, force: bool) -> str:
    """Indexes a remote shard and puts the index beside it (``<url>.idx.json``,
    where datasets look for it). The shard is read once, through the cache
    (``--cache-dir``; else a temporary copy)."""
    from chute import _core
    from chute.remote import get_session
    from chute.sources.remote_urls import build_remote_index
    from chute.sources.tarindex import INDEX_SUFFIX, _problem

    target = url + INDEX_SUFFIX
    session = get_session(remote.options())
    ranges = session.ranges(url)
    size, version = int(ranges.size), str(ranges.version)
    if not force:
        try:
            current = json.loads(session.read_bytes(target))
            if (
                _problem(current, url, None, exact=True) is None
                and current["shard_size"] == size
                and current["shard_version"] == version
            ):
                return f"{target}: up to date"
        except (_core.ReadError, ValueError):
            pass  # none yet, or not one of ours: write it
    document = build_remote_index(url, session, version)
    session.put(target, json.dumps(document, separators=(",", ":")).encode())
    return f"{target}: {len(document['samples'])} samples"


def register(sub: Any) -> None:
    """Adds the ``index`` command to the subparsers `sub`."""
    p = sub.add_parser("index", help="write a sidecar index (<shard>.idx.json) per tar shard")
    p.add_argument(
        "shards",
        nargs="+",
        metavar="SHARD",
        help="tar shards to index: files or urls (the index goes beside each)",
    )
    p.add_argument("--force", action="store_true", help="rewrite indexes that look current")
    remote.add_arguments(p)
    p.set_defaults(func=run)
