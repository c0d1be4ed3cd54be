"""webdataset's shard sources and splitters (``webdataset.shardlists``' names).

A source yields ``{"url": ...}`` dicts. At the head of a ``DataPipeline``
followed by ``tarfile_to_samples()``, chute reads its urls and hands them to
the native engine (``ResampledShards`` with no shard count becomes the
engine's resampling); iterated on its own, a source yields its dicts as
webdataset's does.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset

from chute.sources.shards import (
    expand_urls,
    rank_and_world_size,
    single_node_only,
    split_by_node,
    split_by_worker,
    worker_and_num_workers,
)
from chute.stream.filters import pipelinefilter


class SimpleShardList(IterableDataset[dict[str, str]]):
    """The shards of `urls` (a list, or a brace pattern), in order; with a
    `seed`, shuffled by ``random.Random(seed)`` on every iteration (True: a
    seed from the clock)."""

    def __init__(self, urls: str | Iterable[str], seed: int | float | bool | None = None) -> None:
        super().__init__()
        self.urls = expand_urls(urls) if isinstance(urls, str) else list(urls)
        if not self.urls or not isinstance(self.urls[0], str):
            raise ValueError(f"SimpleShardList needs url strings, got {self.urls[:1]!r}")
        self.seed: int | float | None = time.time() if seed is True else seed

    def __len__(self) -> int:
        return len(self.urls)

    def ordered_urls(self) -> list[str]:
        """The urls of one iteration, in order."""
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        return urls

    def __iter__(self) -> Iterator[dict[str, str]]:
        for url in self.ordered_urls():
            yield {"url": url}


def _worker_seed() -> int:
    """webdataset's default worker seed: rank and worker combined."""
    rank, _ = rank_and_world_size()
    worker, _ = worker_and_num_workers()
    return rank * 1000 + worker


class ResampledShards(IterableDataset[dict[str, str]]):
    """`nshards` shards drawn with replacement from `urls` (forever by
    default). chute runs an endless draw on the engine (its seed from the
    dataset's); a finite `nshards` is drawn here, with webdataset's seeding
    (`seed`, the epoch, and the worker seed; plus the pid and the clock
    unless `deterministic`)."""

    def __init__(
        self,
        urls: str | Iterable[str],
        nshards: int = sys.maxsize,
        seed: int = 0,
        worker_seed: Callable[[], int] | None = None,
        deterministic: bool = False,
        max_urls: int = int(1e6),
        empty_check: bool = True,
    ) -> None:
        super().__init__()
        self.urls = expand_urls(urls) if isinstance(urls, str) else list(islice(urls, max_urls))
        if empty_check and not self.urls:
            raise ValueError("empty_check=True, but no shards found in ResampledShards")
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = worker_seed if worker_seed is not None else _worker_seed
        self.deterministic = deterministic
        self.epoch = -1

    @property
    def endless(self) -> bool:
        return self.nshards == sys.maxsize

    def __iter__(self) -> Iterator[dict[str, str]]:
        self.epoch += 1
        parts: list[Any] = [self.worker_seed(), self.epoch, self.seed]
        if not self.deterministic:
            parts += [os.getpid(), time.time_ns(), os.urandom(4)]
        rng = random.Random(repr(parts))
        for _ in range(self.nshards):
            yield {"url": self.urls[rng.randint(0, len(self.urls) - 1)]}


ResampledShardList = ResampledShards


def shardspec(spec: str) -> SimpleShardList:
    """The shards of a brace pattern (webdataset also reads ``.yaml`` specs:
    chute does not)."""
    if spec.endswith((".yaml", ".yml")):
        raise ValueError(f"chute does not read shard specs from YAML files ({spec!r})")
    return SimpleShardList(spec)


def non_empty(src: Iterable[Any]) -> Iterator[Any]:
    """`src`, raising ValueError at its end when it yielded nothing."""
    count = 0
    for item in src:
        yield item
        count += 1
    if count == 0:
        raise ValueError("pipeline stage received no data at all and this was declared as an error")


def _resampled(src: Iterable[Any], n: int = sys.maxsize) -> Iterator[Any]:
    items = list(src)
    rng = random.Random(os.urandom(20))
    for _ in range(n):
        yield rng.choice(items)


# ``wds.resampled(n)``: a stage drawing `n` items with replacement from all of its input.
resampled = pipelinefilter(_resampled)


__all__ = [
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "non_empty",
    "resampled",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
]
