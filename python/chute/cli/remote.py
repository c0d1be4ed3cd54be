"""Remote urls on the command line (``chute inspect s3://bucket/shard.tar``):
the options the commands take for them, and each path as the data kinds
read it (``chute.kinds.Target``: local paths and remote objects alike).

Credentials, region and endpoint come from the standard environment
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), as for the datasets;
``--storage-option KEY=VALUE`` adds the store's own settings.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from chute.cli.common import UsageError
from chute.kinds import Target

_options: Any = None  # the RemoteOptions of this run, set by configure()


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


def target(path: str) -> Target:
    """`path` as the data kinds read it, with this run's remote options."""
    return Target(path, options())
