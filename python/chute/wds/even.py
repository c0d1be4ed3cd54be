"""Equal batch counts on every DDP rank (``WebDataset(even_batches=...)``),
and the length of a stream from its shards' indexes.

Under DDP the collective ops of a rank that runs out of batches first hang
its peers. Each rank counts its samples (from a shard's sidecar index when a
current one is there, else a header scan, cached per shard), the ranks agree
on the fewest ("cap") or the most ("repeat"), and every rank then yields that
many batches.

A remote shard is counted from its sidecar index (``<shard>.idx.json``
beside it, written by ``chute index``) when there is one for its current
size, else by a scan through the remote reader: with a ``cache_dir`` that
scan leaves the shard in the cache, and the epoch then reads it from there.
"""

from __future__ import annotations

import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from chute import _core
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.shards import Splitter, local_path, rank_and_world_size, split_by_node
from chute.tarindex import FORMAT, INDEX_SUFFIX, indexed_sample_count
from chute.wds.stages import Stage

EVEN_BATCH_MODES = ("cap", "repeat", "off")

_SHARD_SAMPLES: dict[tuple[str, int, int | str], int] = {}


def shard_samples(
    url: str, cache_dir: str, timeout: float, remote: RemoteOptions | None = None
) -> int:
    """Samples in a shard: from its sidecar index when that is current (an
    index is never built here), else scanned once per (url, size, mtime) (a
    remote shard: per (url, size, version), see the module doc)."""
    if is_remote_url(url):
        return _remote_shard_samples(url, remote or RemoteOptions())
    local = local_path(url)
    indexed = indexed_sample_count(local) if local is not None else None
    if indexed is not None:
        return indexed
    stat = os.stat(local) if local is not None and os.path.exists(local) else None
    key = (url, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
    if key not in _SHARD_SAMPLES:
        _SHARD_SAMPLES[key] = int(_core.scan_tar_samples(url, cache_dir, timeout)["samples"])
    return _SHARD_SAMPLES[key]


def _remote_shard_samples(url: str, options: RemoteOptions) -> int:
    session = get_session(options)
    ranges = session.ranges(url)  # its HEAD: size and version
    key = (url, int(ranges.size), str(ranges.version))
    if key not in _SHARD_SAMPLES:
        count = _remote_index_count(session.file, url, int(ranges.size))
        if count is None:
            scan = _core.scan_tar_samples(url, source=session.native_source())
            count = int(scan["samples"])
        _SHARD_SAMPLES[key] = count
    return _SHARD_SAMPLES[key]


def _remote_index_count(open_file: Any, url: str, size: int) -> int | None:
    """The sample count of a remote shard's sidecar index, or None when it
    has none or one written for another version of the shard (size)."""
    try:
        with open_file(url + INDEX_SUFFIX) as f:
            document = json.loads(f.read())
    except _core.ReadError as exc:
        if "HTTP 404" in str(exc):
            return None
        raise
    if (
        not isinstance(document, dict)
        or document.get("format") != FORMAT
        or document.get("shard_size") != size
        or not isinstance(document.get("samples"), list)
    ):
        return None
    return len(document["samples"])


def _count_all(count: Any, urls: list[str]) -> dict[str, int]:
    """count(url) for every url; remote ones several at once (each costs at
    least a round trip: a HEAD, then an index or the shard)."""
    remote = [u for u in dict.fromkeys(urls) if is_remote_url(u)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        counted = dict(zip(remote, pool.map(count, remote), strict=True))
    for url in urls:
        if url not in counted:
            counted[url] = count(url)
    return counted


def even_batch_count(
    mode: str,
    batch_size: int,
    partial: bool,
    urls: list[str],
    all_urls: list[str],
    nodesplitter: Splitter | None,
    cache_dir: str,
    pipe_timeout: float,
    remote: RemoteOptions | None = None,
) -> int | None:
    """The batch count every rank yields this epoch under `mode`, or None
    when ranks need not agree (a single process, or ``"off"``). `urls` are
    this rank's shards, `all_urls` every rank's before the node split.
    Without torch.distributed the ranks can agree only when `nodesplitter`
    is ``split_by_node``, whose split every rank can redo."""
    rank, world_size = rank_and_world_size()
    if world_size <= 1 or mode == "off":
        return None
    one = functools.partial(shard_samples, cache_dir=cache_dir, timeout=pipe_timeout, remote=remote)
    reduce_max = mode == "repeat"
    if dist.is_available() and dist.is_initialized():
        counted = _count_all(one, urls)
        total = torch.tensor([sum(counted[u] for u in urls)], dtype=torch.int64)
        dist.all_reduce(total, op=dist.ReduceOp.MAX if reduce_max else dist.ReduceOp.MIN)
        samples = int(total.item())
    elif nodesplitter is split_by_node:
        counted = _count_all(one, all_urls)
        per_rank = [sum(counted[u] for u in all_urls[r::world_size]) for r in range(world_size)]
        samples = max(per_rank) if reduce_max else min(per_rank)
    else:
        raise ValueError(
            f"rank {rank} of {world_size}: cannot agree on a batch count without "
            "torch.distributed; initialise the process group, use split_by_node, "
            "or pass even_batches='off'"
        )
    if partial:
        return -(-samples // batch_size)
    return samples // batch_size


def indexed_length(urls: list[str], stages: list[Stage]) -> int:
    """The items `stages` make of every sample of `urls`, counted from the
    shards' sidecar indexes (``chute index``). Raises ValueError when a shard
    has no current index or a stage makes the count unknowable."""
    total = 0
    for url in urls:
        local = local_path(url)
        count = indexed_sample_count(local) if local is not None else None
        if count is None:
            raise ValueError(
                f"with_length() without a length needs a current sidecar index for every "
                f"shard; {url} has none (write them with `chute index`, or pass the length)"
            )
        total += count
    for stage in stages:
        counted = stage.items_after(total)
        if counted is None:
            raise ValueError(
                f"with_length(): the items after .{stage.kind}() cannot be counted from the "
                "index; pass the length"
            )
        total = counted
    return total
