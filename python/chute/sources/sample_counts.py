"""How many samples a stream's shard holds, asked of its source format.

Even batch counts (``chute.wds.even``), ``with_length()`` from indexes and
elastic resume (``chute.wds.elastic_stream``) need each shard's sample count before
reading it. They ask a ``SampleCounter``: one per source format, kept in a
registry keyed by the format's name. A new stream format registers one
(``register_sample_counter``); nothing else that counts changes.

A counter answers, for a url it claims:

- ``indexed_count(url)``: the count its metadata alone gives (a current
  sidecar index, a footer), never reading the samples; None when none is
  at hand. What ``with_length()`` and the engine's progress use.
- ``count(url, where)``: the count, found as cheaply as the format allows
  (metadata, else one scan, cached per shard version). What ranks agree on
  for even batches.
- ``layouts(urls, where)``: per shard (in the order of `urls`; the format
  may read several at once) the count and, per sample, the bytes the
  engine's shuffle buffer charges for holding it
  (``EncodedSample::encoded_bytes``), bound to the version of the shard
  there is now: what elastic resume deals and replays shuffle buffers on. A
  count that may no longer describe the shard must be rebuilt or refused
  here, never returned.

Formats registered later are asked first; tar, registered here, claims
every url that no other format claims (as the engine's source table,
``csrc/compose/catalog.cc``, lets tar read every url no entry before it
claims).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from chute import _core
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.remote_urls import remote_tar_index
from chute.sources.shards import local_path
from chute.sources.tarindex import ShardColumns, indexed_sample_count, load_indexes


@dataclass(frozen=True)
class CountSettings:
    """Where and how a counter may read a shard: the dataset's remote
    options (their ``cache_dir`` is the node cache), and for other urls the
    local cache directory and ``pipe:`` timeout."""

    remote: RemoteOptions
    cache_dir: str = ""
    pipe_timeout: float = 0.0


@dataclass(frozen=True)
class ShardSamples:
    """One shard's samples as elastic resume sees them."""

    count: int
    encoded_sizes: np.ndarray  # uint64 per sample, in reading order


class SampleCounter(Protocol):
    """Sample counting for one source format (module doc)."""

    def claims(self, url: str) -> bool: ...

    def indexed_count(self, url: str) -> int | None: ...

    def count(self, url: str, where: CountSettings) -> int: ...

    def layouts(self, urls: list[str], where: CountSettings) -> list[ShardSamples]: ...


_COUNTERS: dict[str, SampleCounter] = {}


def register_sample_counter(name: str, counter: SampleCounter) -> None:
    """Makes `counter` count the shards of format `name` (replacing any
    counter registered under that name)."""
    _COUNTERS.pop(name, None)
    _COUNTERS[name] = counter


def registered_sample_counters() -> dict[str, SampleCounter]:
    """The counters by format name, in the order registered (a stream
    kind's entry in ``chute.kinds`` names its counter here)."""
    return dict(_COUNTERS)


def sample_counter(url: str) -> SampleCounter:
    """The counter of the format that reads `url`."""
    for counter in reversed(_COUNTERS.values()):
        if counter.claims(url):
            return counter
    raise ValueError(f"no registered stream format reads {url!r}")


def shard_layouts(urls: list[str], where: CountSettings) -> list[ShardSamples]:
    """Every shard's layout, in order, each asked of its format's counter
    (one call per format, with all of that format's urls)."""
    groups: dict[int, tuple[SampleCounter, list[str]]] = {}
    for url in dict.fromkeys(urls):
        counter = sample_counter(url)
        groups.setdefault(id(counter), (counter, []))[1].append(url)
    found: dict[str, ShardSamples] = {}
    for counter, members in groups.values():
        found.update(zip(members, counter.layouts(members, where), strict=True))
    return [found[url] for url in urls]


# -- tar ---------------------------------------------------------------------------


def remote_index_dir(options: RemoteOptions) -> str | None:
    """Where indexes built from remote shards are kept: the node cache's
    ``indexes`` folder (the cache neither counts nor evicts folders), or
    nowhere without a cache."""
    return os.path.join(options.cache_dir, "indexes") if options.cache_dir else None


def encoded_sizes(columns: ShardColumns) -> np.ndarray:
    """Per sample, what the engine's shuffle buffer charges for holding it
    (``EncodedSample::encoded_bytes``: payloads, key, 64 per member)."""
    counts = columns.member_counts
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    payload = (
        np.add.reduceat(columns.member_sizes, starts)
        if columns.member_sizes.size
        else np.zeros(0, np.int64)
    )
    keys = np.array(
        [len(k.encode("utf-8", "surrogateescape")) for k in columns.keys], dtype=np.int64
    )
    sizes: np.ndarray = (payload + keys + 64 * counts).astype(np.uint64)
    return sizes


class TarCounter:
    """Tar shards, counted through their sidecar indexes (``chute.tarindex``).

    Local shards: ``count`` reads a current index beside the shard (never
    building one) and otherwise scans the shard once per (url, size,
    modification time); ``layout`` builds and saves a missing or stale index.
    Remote shards: an index bound to the object as it is now (url, size,
    ETag; ``remote_tar_index(bound=True)``) from the node cache's index
    folder or beside the shard, else built by reading the shard once (into
    the node cache when there is one, where the epoch then reads it) and
    kept in the node cache's index folder; cached in this process per (url,
    size, ETag). ``count`` scans a remote shard that no index can describe
    (gzip-compressed, say) as the engine reads it.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int, int | str], int] = {}
        self._layouts: dict[tuple[str, int, int | str], ShardSamples] = {}

    def claims(self, url: str) -> bool:
        return True

    def indexed_count(self, url: str) -> int | None:
        path = local_path(url)
        return indexed_sample_count(path) if path is not None else None

    def count(self, url: str, where: CountSettings) -> int:
        if is_remote_url(url):
            key = _remote_key(url, where.remote)
            if key not in self._counts:
                try:
                    self._counts[key] = self._remote_layout(url, where.remote, key).count
                except (_core.DataError, ValueError):
                    # A shard no index can describe (gzip-compressed, a
                    # sparse member, a repeated extension) is counted as
                    # the engine reads it.
                    source = get_session(where.remote).native_source()
                    scan = _core.scan_tar_samples(url, source=source)
                    self._counts[key] = int(scan["samples"])
            return self._counts[key]
        indexed = self.indexed_count(url)
        if indexed is not None:
            return indexed
        local = local_path(url)
        stat = os.stat(local) if local is not None and os.path.exists(local) else None
        key = (url, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
        if key not in self._counts:
            scan = _core.scan_tar_samples(url, where.cache_dir, where.pipe_timeout)
            self._counts[key] = int(scan["samples"])
        return self._counts[key]

    def layouts(self, urls: list[str], where: CountSettings) -> list[ShardSamples]:
        remote = [u for u in urls if is_remote_url(u)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            # Each costs round trips: a HEAD, then an index or the shard.
            found = dict(
                zip(
                    remote,
                    pool.map(lambda u: self._remote_layout(u, where.remote), remote),
                    strict=True,
                )
            )
        local: dict[str, tuple[str, tuple[str, int, int | str]]] = {}
        for url in urls:
            if url in found:
                continue
            path = local_path(url)
            if path is None:
                raise ValueError(
                    f"{url!r} is neither a local file nor a remote url: its samples cannot "
                    "be counted before it is read"
                )
            st = os.stat(path)
            local[url] = (path, (path, st.st_size, st.st_mtime_ns))
        missing = [url for url, (_, key) in local.items() if key not in self._layouts]
        loaded = load_indexes([local[url][0] for url in missing])
        for url, columns in zip(missing, loaded, strict=True):
            self._layouts[local[url][1]] = _samples(columns)
        found.update((url, self._layouts[key]) for url, (_, key) in local.items())
        return [found[url] for url in urls]

    def _remote_layout(
        self, url: str, options: RemoteOptions, key: tuple[str, int, int | str] | None = None
    ) -> ShardSamples:
        key = key or _remote_key(url, options)
        if key not in self._layouts:
            document = remote_tar_index(url, options, remote_index_dir(options), bound=True)
            # Under the version the index was bound to (a shard replaced
            # since `key`'s HEAD is counted as it is now).
            found = (url, int(document["shard_size"]), str(document["shard_version"]))
            self._layouts[found] = _samples(ShardColumns.from_document(document))
            return self._layouts[found]
        return self._layouts[key]


def _remote_key(url: str, options: RemoteOptions) -> tuple[str, int, int | str]:
    """A remote shard as its HEAD finds it now: url, size and version."""
    ranges = get_session(options).ranges(url)
    return (url, int(ranges.size), str(ranges.version))


def _samples(columns: ShardColumns) -> ShardSamples:
    return ShardSamples(columns.num_samples, encoded_sizes(columns))


register_sample_counter("tar", TarCounter())
