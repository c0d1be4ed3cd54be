"""What datasets share about remote urls: the options as users pass them,
globs listed on buckets, and the engine's source options.

Nothing here creates a session (or imports obstore) until a remote url is
actually read, so local pipelines never need the optional dependency.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from chute import _core
from chute.remote._options import RemoteOptions
from chute.remote._session import RemoteSession, get_session
from chute.remote._stores import is_remote_url, split_url
from chute.sources.shards import expand_urls, local_path

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


def dataset_remote_options(
    remote: RemoteOptions | None,
    storage_options: Mapping[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit_bytes: int | None,
) -> RemoteOptions:
    """The remote options of a dataset that takes the node cache's settings
    as its own arguments: `merge_options`, with ``~`` in `cache_dir` expanded."""
    return merge_options(
        remote,
        storage_options=storage_options,
        cache_dir=os.path.expanduser(os.fspath(cache_dir)) if cache_dir is not None else None,
        cache_limit_bytes=cache_limit_bytes,
    )


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


def expand_file_patterns(
    urls: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    options: RemoteOptions,
    what: str,
) -> list[str]:
    """Brace ranges and ``::`` groups (as for tar shards), then globs: remote
    ones listed on their bucket, local ones matched on disk, each sorted; a
    local glob that matches nothing raises naming `what` ("Parquet file")."""
    items = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    out: list[str] = []
    for url in expand_remote_globs(expand_urls([os.fspath(u) for u in items]), options):
        path = local_path(url)
        if path is not None and set("*?[") & set(path) and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise FileNotFoundError(2, f"no {what} matches the pattern", path)
            out.extend(matches)
        else:
            out.append(url)
    return out


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


def build_remote_index(url: str, session: RemoteSession, version: str) -> dict[str, Any]:
    """The sidecar index document of a remote tar shard (chute.tarindex's
    format) of `version` (its ETag, as a HEAD gave it), made by reading the
    shard once: into the session's cache when it has a ``cache_dir`` (where
    the epoch then finds it), else into a temporary file that is removed."""
    from chute.sources.tarindex import build_index

    cache_dir = session.options.cache_dir
    with tempfile.TemporaryDirectory(prefix="chute-index-") as tmp:
        copy = os.path.join(tmp, "shard.tar")
        with session.open(url) as f:
            if cache_dir:
                f.drain()
                copy = os.path.join(cache_dir, _core.tar_cache_file_name(url))
            else:
                with open(copy, "wb") as out:
                    while chunk := f.read(8 << 20):
                        out.write(chunk)
        if not os.path.exists(copy):
            raise ValueError(f"cannot index {url!r}: it does not fit in the cache {cache_dir!r}")
        document = build_index(copy, identity=url, version=version)
    # A remote object has no modification time a reader could compare: its
    # size and version (ETag) stand for it.
    document.update(shard_mtime_ns=0)
    return document


def _headers_match(
    document: dict[str, Any], url: str, session: RemoteSession, version: str
) -> bool:
    """Whether the tar headers of the remote shard `url`, read where the
    index `document` says its members' headers lie, hash to the index's
    ``headers_digest`` (what tells another shard of the same size)."""
    members = [m for s in document["samples"] for m in s["members"]]
    try:
        digest = _core.tar_headers_digest(
            url,
            np.array([m[3] for m in members], dtype=np.int64),
            np.array([m[1] for m in members], dtype=np.int64),
            int(document["shard_size"]),
            version,
            remote=session.queue,
        )
    except (_core.DataError, _core.ReadError):
        return False  # headers where the index says they are cannot be read: another shard
    return bool(digest == document["headers_digest"])


def remote_tar_index(
    url: str, options: RemoteOptions, index_dir: str | None = None, *, bound: bool = False
) -> dict[str, Any]:
    """The index of a remote tar shard: from `index_dir` (a local directory)
    when given, else from ``<url>.idx.json`` beside the shard, when there is
    one for the shard as it is now (its url, size, and ETag where the index
    recorded one: one uploaded beside the object after a local ``chute
    index`` records none); else built by reading the shard once (and saved
    in `index_dir` when given). The document returned holds the version the
    shard has now, which its reads then require.

    With `bound` (sample counts for streams, ``chute.sources.sample_counts``),
    `index_dir` is looked in first and the sidecar beside the shard after
    it, and an index counts only when it is bound to the shard as it is now:
    it names the version (ETag) the shard has, or, when it names none or
    another (one built locally and uploaded), the shard's tar headers, read
    at the offsets it records in one batch of ranged requests, hash to its
    ``headers_digest``. A stream reads members without checking them
    against an index, as indexed reads do, so an index whose size alone
    matches (a replaced shard can keep its size) is rebuilt, never trusted.
    An index accepted by its headers is saved in `index_dir`, bound to the
    version the shard has now.
    """
    from chute.sources.tarindex import (
        INDEX_SUFFIX,
        _problem,
        _write_document,
        index_path,
        shard_identity,
    )

    session = get_session(options)
    ranges = session.ranges(url)
    size = int(ranges.size)
    version = str(ranges.version)
    local = index_path(url, index_dir) if index_dir is not None else None

    def usable(document: Any, exact: bool) -> bool:
        if (
            document is None
            or _problem(document, url, None, exact=exact) is not None
            or document["shard_size"] != size
        ):
            return False
        recorded = document["shard_version"]
        if not bound:
            return recorded in ("", version)
        return recorded == version != "" or _headers_match(document, url, session, version)

    def read(where: str) -> Any:
        try:
            if where == "local" and local is not None:
                return json.loads(local.read_text(encoding="utf-8"))
            return json.loads(session.read_bytes(url + INDEX_SUFFIX))
        except (OSError, ValueError):
            return None  # none there (a ReadError is an OSError), or not JSON

    places = ["local"] if local is not None else []
    if local is None or bound:
        places.append("beside")
    document: Any = None
    for place in places:
        document = read(place)
        if usable(document, exact=place == "local"):
            if bound and local is not None and document["shard_version"] != version:
                # Accepted by its headers: kept bound to the version there is
                # now, the next open needs no read of the headers (which can
                # cost as much as the shard when its members are small).
                kept = dict(document, shard=shard_identity(url), shard_version=version)
                _write_document(kept, local)
            break
    else:
        document = build_remote_index(url, session, version)
        if local is not None:
            _write_document(document, local)
    result: dict[str, Any] = dict(document, shard_version=version)
    return result


def cached_copy(session: Any, url: str, cache_dir: str, held: list[Any]) -> dict[str, Any] | None:
    """Downloads `url` into the node's cache (once per node: another
    process's download is followed) and returns the layout fields that point
    the engine at the local copy; None when the object cannot be cached
    (larger than the cache, a full disk), and is then read with ranges. The
    open reader appended to `held` keeps the copy from eviction."""
    reader = session.open(url)
    if not reader.in_place:
        reader.drain()
        reader.close()
        reader = session.open(url)  # now a cache hit, unless it could not be cached
        if not reader.in_place:
            reader.close()
            return None
    held.append(reader)
    path = os.path.join(cache_dir, _core.tar_cache_file_name(url))
    st = os.stat(path)
    return {
        "path": path,
        "mtime_ns": int(st.st_mtime_ns),
        "inode": int(st.st_ino),
        "version": "",
    }
