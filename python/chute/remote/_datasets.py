"""What datasets share about remote urls: the options as users pass them,
globs listed on buckets, and the engine's source options.

Nothing here creates a session (or imports obstore) until a remote url is
actually read, so local pipelines never need the optional dependency.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chute import _core
from chute.remote._options import RemoteOptions
from chute.remote._session import get_session
from chute.remote._stores import is_remote_url, split_url

_GLOB = re.compile(r"[*?\[]")


def merge_options(
    remote: RemoteOptions | None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit_bytes: int | None = None,
    prefetch_bytes: int | None = None,
) -> RemoteOptions:
    """`remote` (or the defaults) with the settings a dataset takes directly;
    those given (not None) win."""
    base = remote if remote is not None else RemoteOptions()
    changes: dict[str, Any] = {}
    if storage_options is not None:
        changes["storage_options"] = dict(storage_options)
    if cache_dir is not None:
        changes["cache_dir"] = cache_dir
    if cache_limit_bytes is not None:
        changes["cache_limit_bytes"] = int(cache_limit_bytes)
    if prefetch_bytes is not None:
        changes["prefetch_bytes"] = int(prefetch_bytes)
    return dataclasses.replace(base, **changes) if changes else base


def any_remote(urls: Iterable[str]) -> bool:
    return any(is_remote_url(u) for u in urls)


def is_remote_glob(url: str) -> bool:
    """A remote url whose object key holds a glob (``s3://b/train/*.tar``)."""
    if not is_remote_url(url):
        return False
    try:
        _, key = split_url(url)
    except ValueError:
        return False
    return _GLOB.search(key) is not None


def expand_remote_globs(urls: Sequence[str], options: RemoteOptions) -> list[str]:
    """`urls` with every remote glob replaced by the objects it matches on
    the bucket, sorted (webdataset itself takes no globs; http(s) and hf://
    servers have no listing and are refused). A glob that matches nothing
    is an error, as an empty shard list would be."""
    out: list[str] = []
    for url in urls:
        if not is_remote_glob(url):
            out.append(url)
            continue
        found = get_session(options).list_objects(url)
        if not found:
            raise FileNotFoundError(f"no object matches {url!r}")
        out.extend(found)
    return out


def native_source(urls: Iterable[str], options: RemoteOptions) -> _core.SourceOptions | None:
    """The engine's SourceOptions for `urls` when any is remote (this
    process's session for `options`), else None."""
    if not any_remote(urls):
        return None
    return get_session(options).native_source()
