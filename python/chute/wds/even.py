"""Equal batch counts on every DDP rank (``WebDataset(even_batches=...)``),
and the length of a stream from its shards' indexes.

Under DDP the collective ops of a rank that runs out of batches first hang
its peers. Each rank counts its samples (asking each shard's format,
``chute.sources.sample_counts``: for tar a current sidecar index, else one
scan, cached per shard), the ranks agree on the fewest ("cap") or the most
("repeat"), and every rank's engine is held to the count that makes
(``StreamPlan.max_batches`` when the engine batches, ``max_samples`` when
Python does): it stops there, and a rank whose pass ends before it reads its
shards again, once the pass is batched whole (``StreamPlan.repeat_to_limit``;
docs/epochs.md gives the exact counts).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from chute.remote import RemoteOptions, is_remote_url
from chute.sources.sample_counts import CountSettings, sample_counter
from chute.sources.shards import (
    Splitter,
    rank_and_world_size,
    split_by_node,
    split_by_worker,
    worker_and_num_workers,
)
from chute.stream.stages import Stage

EVEN_BATCH_MODES = ("cap", "repeat", "off")


def shard_samples(
    url: str, cache_dir: str, timeout: float, remote: RemoteOptions | None = None
) -> int:
    """Samples in a shard, as its format's counter finds them."""
    where = CountSettings(remote or RemoteOptions(), cache_dir, timeout)
    return sample_counter(url).count(url, where)


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


def even_samples(
    mode: str,
    urls: list[str],
    all_urls: list[str],
    nodesplitter: Splitter | None,
    cache_dir: str,
    pipe_timeout: float,
    remote: RemoteOptions | None = None,
    workersplitter: Splitter | None = split_by_worker,
) -> int | None:
    """The samples every rank's count is taken from this epoch under `mode`:
    the fewest a rank reads (``"cap"``) or the most (``"repeat"``); None when
    ranks need not agree (a single process, or ``"off"``). `urls` are this
    rank's shards, `all_urls` every rank's before the node split. Without
    torch.distributed the ranks can agree only when `nodesplitter` is
    ``split_by_node``, whose split every rank can redo.

    In a torch DataLoader worker process each worker yields its own batches:
    worker w of every rank then takes the fewest (most) samples worker w of
    any rank reads (so the ranks' totals agree), found by redoing the node
    and worker splits (``split_by_node``, ``split_by_worker``); the process
    group, which the worker's parent holds, is not used from a worker."""
    rank, world_size = rank_and_world_size()
    if not needs_even_counts(mode):
        return None
    one = functools.partial(shard_samples, cache_dir=cache_dir, timeout=pipe_timeout, remote=remote)
    reduce_max = mode == "repeat"
    if torch.utils.data.get_worker_info() is not None:
        worker, num_workers = worker_and_num_workers()
        if nodesplitter is not split_by_node or workersplitter is not split_by_worker:
            raise ValueError(
                f"rank {rank} of {world_size}, worker {worker} of {num_workers}: the workers "
                "of every rank can agree on a batch count only with split_by_node and "
                "split_by_worker; pass even_batches='off' (or read in chute.DataLoader's threads)"
            )
        counted = _count_all(one, all_urls)
        per_rank = [
            sum(counted[u] for u in all_urls[r::world_size][worker::num_workers])
            for r in range(world_size)
        ]
        return max(per_rank) if reduce_max else min(per_rank)
    if dist.is_available() and dist.is_initialized():
        counted = _count_all(one, urls)
        total = torch.tensor([sum(counted[u] for u in urls)], dtype=torch.int64)
        dist.all_reduce(total, op=dist.ReduceOp.MAX if reduce_max else dist.ReduceOp.MIN)
        return int(total.item())
    if nodesplitter is split_by_node:
        counted = _count_all(one, all_urls)
        per_rank = [sum(counted[u] for u in all_urls[r::world_size]) for r in range(world_size)]
        return max(per_rank) if reduce_max else min(per_rank)
    raise ValueError(
        f"rank {rank} of {world_size}: cannot agree on a batch count without "
        "torch.distributed; initialise the process group, use split_by_node, "
        "or pass even_batches='off'"
    )


def batches_of(samples: int, batch_size: int, partial: bool) -> int:
    """The batches of `batch_size` one pass of `samples` samples forms."""
    return -(-samples // batch_size) if partial else samples // batch_size


def needs_even_counts(mode: str) -> bool:
    """Whether the ranks must agree on their counts: several ranks, and a
    mode other than ``"off"``."""
    return mode != "off" and rank_and_world_size()[1] > 1


def check_countable(mode: str, stages: list[Stage]) -> None:
    """ValueError when the ranks must agree on their counts (`mode`) but a
    Python stage of `stages`, run after the engine, makes the items it
    yields unknowable from the items it gets (``.select``, ``.compose``,
    ...): equal counts from the engines would not make equal counts out of
    the pipeline, and the rank that ends first would hang its peers."""
    uncounted = [s for s in stages if s.items_after(1) is None]
    if uncounted and needs_even_counts(mode):
        rank, world_size = rank_and_world_size()
        raise ValueError(
            f"rank {rank} of {world_size}: even_batches={mode!r} gives every rank the same "
            f"count, but .{uncounted[0].kind}() runs in Python after the engine and its items "
            "cannot be counted, so the ranks' counts could still differ (and a rank that "
            "ends first hangs its peers' collectives); give the epoch a length every rank "
            "reaches with .with_epoch(n), or pass even_batches='off' and make the counts "
            "equal yourself"
        )


def indexed_length(urls: list[str], stages: list[Stage]) -> int:
    """The items `stages` make of every sample of `urls`, counted from the
    shards' sidecar indexes (``chute index``). Raises ValueError when a shard
    has no current index or a stage makes the count unknowable."""
    total = 0
    for url in urls:
        count = sample_counter(url).indexed_count(url)
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
