"""Elastic resume of streams: ``WebDataset(..., elastic=True)``.

The epoch's global order depends only on (seed, epoch): the shards in one
order (a permutation drawn from (seed, epoch) with ``shardshuffle``, else the
list's), and within each shard its samples in archive order. Global sample
g is the g-th of that sequence; each shard's format gives its sample count
(``chute.sources.sample_counts``; tar: the sidecar index, local or remote,
built on first use when missing), so every rank knows the sequence without
reading a shard.

A run delivers a *segment*: the samples of the epoch not yet consumed when
it started (all of them for a fresh epoch), dealt to the W ranks in
contiguous spans so that every rank yields T batches of B:

- T = ceil(R / (W·B)) for R remaining samples (``partial``, the default);
  every rank's batches are full but its last, and the last batches share
  the final L = R - (T-1)·W·B samples as evenly as they can (their sizes
  differ by one at most). When L < W, ranks L..W-1 would have an empty last
  batch: each reads one sample of the segment again instead (the segment's
  first ones, as DistributedSampler pads), the only repeats there are.
- ``partial=False`` (``.batched(B, partial=False)``, ``drop_last=True``):
  T = R // (W·B) full batches per rank; the last R - T·W·B samples of the
  segment are not delivered in this epoch.

A rank reads its span as parts of shards (the engine starts a shard at a
sample and stops after one, by count; ``StreamPlan.sample_ranges``).

The state (``state_dict()``) holds the segment (its remaining samples as
intervals of global samples), the world size, the batches every rank
yielded, and the samples still to deliver after them: computed on any rank
from those numbers and the indexes alone, so every rank's state is the same.
Without a shuffle buffer a rank has consumed the first k·B samples of its
span. With one, the rank's buffer is replayed on sample positions (the
engine's own buffer code, seed and byte accounting: ``_core.replay_shuffle``)
to know exactly which samples left it; those still inside it are part of the
remaining samples, so the guarantee stays exact. Loading the state on the
same world size continues the segment (the same batches an uninterrupted run
gives); on another, the remaining samples form a new segment for the new
world size. Over all ranks and resumes, every sample of the epoch is
delivered once, except the pads above (and, with ``partial=False``, the
dropped tail).

What the guarantee assumes: the shards are those the indexes describe
(checked by size and modification time, for a remote shard by size and
ETag, and by the state's fingerprint),
and no sample is dropped before batching (a malformed archive skipped by a
handler, or a sample whose fields do not fit the batch under a skipping
handler, shifts what follows on that rank). Samples whose decoding fails
later are consumed like any other.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from chute import _core
from chute.sources.sample_counts import CountSettings, shard_layouts
from chute.sources.shards import rank_and_world_size, worker_and_num_workers
from chute.stream.compiler import CompiledPipeline
from chute.stream.native import engine_seed
from chute.wds.runnable import RunnableDataset

Intervals = np.ndarray  # int64 (m, 2): [begin, end) of global samples, sorted, disjoint


@dataclass(frozen=True)
class ShardLayout:
    """Sample counts and per-sample encoded sizes of a shard list, from the
    shards' formats (``chute.sources.sample_counts``)."""

    urls: tuple[str, ...]
    counts: np.ndarray  # int64 per shard, in list order
    sizes: tuple[np.ndarray, ...]  # uint64 per sample: bytes as the shuffle buffer counts them

    def digest(self) -> str:
        return hashlib.sha256(self.counts.astype("<i8").tobytes()).hexdigest()[:16]


def shard_layout(urls: list[str], where: CountSettings) -> ShardLayout:
    """The layout of `urls`, from their formats' counters."""
    shards = shard_layouts(urls, where)
    return ShardLayout(
        urls=tuple(urls),
        counts=np.array([s.count for s in shards], dtype=np.int64),
        sizes=tuple(s.encoded_sizes for s in shards),
    )


class EpochOrder:
    """The global sample sequence of one epoch: shards in order, each shard's
    samples in archive order."""

    def __init__(self, layout: ShardLayout, seed: int, epoch: int, shuffle: bool) -> None:
        n = len(layout.urls)
        if shuffle:
            rng = np.random.default_rng([seed & (2**64 - 1), epoch & (2**64 - 1), 0x5348])
            self.shards = rng.permutation(n).astype(np.int64)
        else:
            self.shards = np.arange(n, dtype=np.int64)
        self.layout = layout
        self.starts = np.concatenate(([0], np.cumsum(layout.counts[self.shards]))).astype(np.int64)

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def locate(self, ordinals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in the shard order, sample within the shard) of global samples."""
        j = np.searchsorted(self.starts, ordinals, side="right") - 1
        return j, ordinals - self.starts[j]

    def pieces(self, intervals: Intervals) -> tuple[list[str], list[list[int]]]:
        """The urls to read, in order, and per url the sample ranges (begin,
        end pairs) that cover `intervals`."""
        urls: list[str] = []
        ranges: list[list[int]] = []
        last = -1
        for begin, end in intervals.tolist():
            g = begin
            while g < end:
                j = int(np.searchsorted(self.starts, g, side="right") - 1)
                stop = min(end, int(self.starts[j + 1]))
                local = [g - int(self.starts[j]), stop - int(self.starts[j])]
                if j == last and ranges[-1][-1] == local[0]:
                    ranges[-1][-1] = local[1]
                elif j == last:
                    ranges[-1].extend(local)
                else:
                    urls.append(self.layout.urls[int(self.shards[j])])
                    ranges.append(local)
                    last = j
                g = stop
        return urls, ranges

    def encoded_sizes(self, ordinals: np.ndarray) -> np.ndarray:
        j, local = self.locate(ordinals)
        out = np.empty(ordinals.size, dtype=np.uint64)
        for position in np.unique(j):
            where = j == position
            out[where] = self.layout.sizes[int(self.shards[position])][local[where]]
        return out


def ordinals(intervals: Intervals) -> np.ndarray:
    """The global samples of `intervals`, in order."""
    if intervals.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(b, e, dtype=np.int64) for b, e in intervals.tolist()])


def as_intervals(samples: np.ndarray) -> Intervals:
    """Sorted unique global samples as intervals."""
    s = np.unique(samples.astype(np.int64))
    if s.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    breaks = np.flatnonzero(np.diff(s) != 1) + 1
    begins = s[np.concatenate(([0], breaks))]
    ends = s[np.concatenate((breaks - 1, [s.size - 1]))] + 1
    return np.stack([begins, ends], axis=1)


def span(intervals: Intervals, offset: int, length: int) -> Intervals:
    """Samples [offset, offset + length) of the sequence `intervals` make."""
    out: list[tuple[int, int]] = []
    position = 0
    for begin, end in intervals.tolist():
        size = end - begin
        lo, hi = max(offset, position), min(offset + length, position + size)
        if lo < hi:
            out.append((begin + lo - position, begin + hi - position))
        position += size
    return np.array(out, dtype=np.int64).reshape(-1, 2)


@dataclass(frozen=True)
class BufferSpec:
    """A rank's shuffle buffer (capacity 0: none) and how its seed derives."""

    capacity: int
    initial: int
    max_bytes: int


@dataclass(frozen=True)
class RankShare:
    """What one rank reads in a segment: its span, and the sample it reads
    again to pad its last batch (-1: none)."""

    intervals: Intervals
    pad: int

    def inputs(self) -> np.ndarray:
        """The global samples the rank reads, in reading order."""
        own = ordinals(self.intervals)
        return own if self.pad < 0 else np.append(own, self.pad)


class StreamSegment:
    """The samples of an epoch left when a run started (`remaining`), dealt
    to `world_size` ranks in spans of equal batch counts (module doc)."""

    def __init__(
        self,
        order: EpochOrder,
        remaining: Intervals,
        world_size: int,
        batch_size: int,
        partial: bool,
    ) -> None:
        self.order = order
        self.remaining = remaining
        self.world_size = world_size
        self.batch_size = batch_size
        self.partial = partial
        r = int((remaining[:, 1] - remaining[:, 0]).sum()) if remaining.size else 0
        w, b = world_size, batch_size
        last = 0  # samples of the last round, shared by the ranks' last batches
        if partial:
            self.num_batches = math.ceil(r / (w * b))
            last = r - max(0, self.num_batches - 1) * w * b
            counts = [
                max(0, self.num_batches - 1) * b + last // w + (1 if rank < last % w else 0)
                for rank in range(w)
            ]
        else:
            self.num_batches = r // (w * b)
            counts = [self.num_batches * b] * w
        self.shares: list[RankShare] = []
        offset = 0
        for rank, count in enumerate(counts):
            pad = -1
            if partial and self.num_batches and rank >= last:
                # Its last batch would be empty: it reads one of the
                # segment's first samples again (another rank's).
                pad = int(ordinals(span(remaining, (rank - last) % r, 1))[0])
            self.shares.append(RankShare(span(remaining, offset, count), pad))
            offset += count

    def rank_plan(self, rank: int) -> tuple[list[str], list[list[int]]]:
        """Urls and sample ranges rank `rank` reads."""
        share = self.shares[rank]
        urls, ranges = self.order.pieces(share.intervals)
        if share.pad >= 0:
            pad_urls, pad_ranges = self.order.pieces(np.array([[share.pad, share.pad + 1]]))
            urls += pad_urls
            ranges += pad_ranges
        return urls, ranges

    def remaining_after(
        self, batches: int, buffer: BufferSpec, plan_seeds: list[int], epoch: int
    ) -> Intervals:
        """The samples still to deliver once every rank yielded `batches`
        batches: for each rank, what it read but had not handed out (its
        shuffle buffer replayed when it has one), and what it had not read."""
        left: list[np.ndarray] = []
        outputs = max(0, batches) * self.batch_size
        for rank, share in enumerate(self.shares):
            inputs = share.inputs()
            kept = np.ones(inputs.size, dtype=bool)
            if buffer.capacity > 0 and inputs.size:
                emitted = _core.replay_shuffle(
                    buffer.capacity,
                    buffer.initial,
                    buffer.max_bytes,
                    plan_seeds[rank],
                    epoch,
                    0,
                    self.order.encoded_sizes(inputs),
                    outputs,
                )
                kept[emitted] = False
            else:
                kept[:outputs] = False
            if share.pad >= 0:
                # A pad is owed by the rank whose span holds it, never by the
                # rank that reads it again.
                kept[-1] = False
            left.append(inputs[kept])
        return as_intervals(np.concatenate(left) if left else np.zeros(0, np.int64))


def flat(intervals: Intervals) -> list[int]:
    return [int(v) for v in intervals.reshape(-1).tolist()]


def unflat(values: Any, what: str) -> Intervals:
    """Intervals from a state's flat list, checked."""
    if (
        not isinstance(values, list)
        or len(values) % 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
    ):
        raise ValueError(f"WebDataset state: elastic {what!r} must be a flat list of [begin, end)")
    out = np.array(values, dtype=np.int64).reshape(-1, 2)
    if out.size and (np.any(out[:, 0] >= out[:, 1]) or np.any(out[1:, 0] < out[:-1, 1])):
        raise ValueError(f"WebDataset state: elastic {what!r} are not sorted, disjoint intervals")
    return out


class ElasticRun:
    """One iteration of an elastic WebDataset: its segment, this rank's share
    of it, and the state it is at."""

    def __init__(
        self,
        dataset: RunnableDataset,
        compiled: CompiledPipeline,
        epoch: int,
        recorded: dict[str, Any] | None,
        batches: int,
    ) -> None:
        _check_pipeline(dataset, compiled)
        assert compiled.batch_size is not None
        self.rank, self.world_size = rank_and_world_size()
        self.epoch = epoch
        self.layout = shard_layout(
            dataset.urls,
            CountSettings(dataset.remote, dataset.cache_dir or "", dataset.pipe_timeout),
        )
        self.order_key = {"seed": dataset.seed, "shardshuffle": dataset.shardshuffle}
        self.order = EpochOrder(self.layout, dataset.seed, epoch, dataset.shardshuffle)
        shuffle = compiled.shuffle
        self.buffer = (
            BufferSpec(shuffle[0], shuffle[1], dataset.shuffle_max_bytes)
            if shuffle is not None
            else BufferSpec(0, 0, 0)
        )
        self.base_seed = shuffle[2] if shuffle is not None else dataset.seed
        batch_size, partial = int(compiled.batch_size), bool(compiled.partial)
        everything = np.array([[0, self.order.total]], dtype=np.int64).reshape(-1, 2)
        if not self.order.total:
            everything = everything[:0]
        if recorded is None:
            if batches:
                raise ValueError(
                    "WebDataset state holds no global position (it was taken without "
                    "elastic=True); resume it with elastic=False on the same world size"
                )
            self.segment = StreamSegment(
                self.order, everything, self.world_size, batch_size, partial
            )
            self.skip = 0  # batches of the segment already delivered
        else:
            self.segment, self.skip = self._resumed(recorded, batches, batch_size, partial)
        self.urls, self.ranges = self.segment.rank_plan(self.rank)

    def _resumed(
        self, recorded: dict[str, Any], batches: int, batch_size: int, partial: bool
    ) -> tuple[StreamSegment, int]:
        """The segment to run after `recorded` (at `batches`), and the
        batches of it already delivered."""
        self._check_recorded(recorded)
        world = int(recorded["world_size"])
        segment = StreamSegment(
            self.order, unflat(recorded["segment"], "segment"), world, batch_size, partial
        )
        remaining = segment.remaining_after(
            batches, self.buffer, self.plan_seeds(world), self.epoch
        )
        if flat(remaining) != recorded.get("remaining"):
            raise ValueError(
                "WebDataset state does not match this pipeline: the samples it says remain "
                "differ from the ones its segment and batch count leave (another shuffle "
                "buffer, shard order or index)"
            )
        if world == self.world_size:
            return segment, batches
        return StreamSegment(self.order, remaining, self.world_size, batch_size, partial), 0

    def _check_recorded(self, recorded: dict[str, Any]) -> None:
        world = recorded.get("world_size")
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"WebDataset state: elastic 'world_size' must be >= 1, not {world!r}")
        expected = {
            "samples": self.order.total,
            "counts": self.layout.digest(),
            "order": self.order_key,
            "buffer": [self.buffer.capacity, self.buffer.initial, self.buffer.max_bytes],
        }
        for key, value in expected.items():
            if recorded.get(key) != value:
                raise ValueError(
                    f"WebDataset state was taken with another {key} ({recorded.get(key)!r}; "
                    f"this pipeline has {value!r}): its global position does not apply here"
                )

    def plan_seeds(self, world_size: int) -> list[int]:
        return [engine_seed(self.base_seed, rank, 0) for rank in range(world_size)]

    def configure(self, plan: Any) -> None:
        """Makes `plan` read this rank's share of the segment."""
        plan.sample_ranges = self.ranges
        plan.shuffle_shards = False
        plan.repeat = False
        plan.resampled = False
        plan.num_streams = 1
        plan.max_batches = self.segment.num_batches
        plan.seed = self.plan_seeds(self.world_size)[self.rank]

    def state(self, batches: int) -> dict[str, Any]:
        """The elastic part of the state after every rank yielded `batches`."""
        segment = self.segment
        remaining = segment.remaining_after(
            batches, self.buffer, self.plan_seeds(segment.world_size), self.epoch
        )
        return {
            "world_size": segment.world_size,
            "segment": flat(segment.remaining),
            "remaining": flat(remaining),
            "samples": self.order.total,
            "counts": self.layout.digest(),
            "order": self.order_key,
            "buffer": [self.buffer.capacity, self.buffer.initial, self.buffer.max_bytes],
        }


def _check_pipeline(dataset: RunnableDataset, compiled: CompiledPipeline) -> None:
    """ValueError when `dataset` cannot run elastically."""
    problems = []
    if compiled.batch_size is None:
        problems.append(
            "the engine must batch (.batched(n) before any Python stage, or a DataLoader "
            "batch_size with the default collation)"
        )
    if dataset.resampled or dataset.repeat_shards or dataset.repetitions != 1:
        problems.append(
            "an epoch must be one pass over the shards (no resampled/repeat/with_epoch)"
        )
    if dataset.streams != 1:
        problems.append("streams must be 1")
    if worker_and_num_workers()[1] > 1:
        problems.append("run it in chute.DataLoader (threads), not in torch worker processes")
    if problems:
        raise ValueError("WebDataset(elastic=True): " + "; ".join(problems))
