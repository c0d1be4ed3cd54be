"""What the commands share: exit codes, usage errors, path expansion."""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad path or argument: reported as ``chute: error: ...`` with exit 2."""


def expand(paths: Sequence[str]) -> list[str]:
    """The paths with brace patterns expanded; UsageError when there are none."""
    from chute.sources.shards import expand_urls

    out = expand_urls(list(paths))
    if not out:
        raise UsageError("no paths given")
    return out
