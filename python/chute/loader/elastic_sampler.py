"""Elastic resume of map-style data: a position that survives a change of
world size.

The epoch's global order depends only on (seed, epoch): a sampler that can
resume elastically has ``global_order(epoch)`` (``ElasticSampler``, the
sampler of ``chute.DataLoader(distributed=True)``, is torch's
``DistributedSampler`` plus that method; ``Curriculum`` and a weighted
``chute.mix`` have it too) and deals that order to the ranks.

A run of a loader delivers a *segment* of the epoch: positions
``[start, n)`` of the global order dealt to ``world_size`` ranks in rounds;
round t is a contiguous stretch of the order and rank r takes its positions
r, r + W, r + 2W, ... as its batch t. Every rank has the same number of
batches, and after k batches on every rank the ranks together have consumed
a prefix of the order: the global position.

- A segment that starts the epoch (start 0) is exactly DistributedSampler's
  partition: rounds of W·B positions, the last padded as DistributedSampler
  pads (repeating the first indices) or, with ``drop_last``, the tail cut.
- A resumed segment (start > 0, after a resume on another world size) deals
  the R = n - start remaining positions without repeating any: every rank
  gets T = ceil(R / (W·B)) batches, all rounds but the last hold W·B
  positions and the last the rest; when the last would have fewer positions
  than ranks, the round before gives it what it lacks (so the last two
  batches of a rank may be one short). Only when that cannot help (fewer
  positions left than ranks, or B = 1) is the last round padded by repeating
  the segment's first positions, as DistributedSampler pads, so no rank has
  an empty batch. With ``drop_last`` the segment has R // (W·B) full rounds
  and the rest of the epoch is dropped.

The state (``chute.DataLoader.state_dict()``) holds the segment (start,
world size), the batches each rank consumed in it, and the global position
they add up to; every rank computes the same state, so rank 0 can save it
alone. Loading it on the same world size continues the segment (the batches
an uninterrupted run would have given); on another world size a new segment
starts at the global position.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DistributedSampler


@runtime_checkable
class GlobalOrderSampler(Protocol):
    """A sampler whose epoch order is one global order dealt to ranks as
    DistributedSampler deals it (padding or cutting its tail to a multiple
    of `num_replicas`, then positions r::num_replicas to rank r)."""

    num_replicas: int
    rank: int
    drop_last: bool
    epoch: int

    def global_order(self, epoch: int | None = None) -> np.ndarray: ...

    def set_epoch(self, epoch: int) -> None: ...


class ElasticSampler(DistributedSampler[Any]):
    """torch's ``DistributedSampler`` (same order, same partition, same
    length) that also names the epoch's global order, so that a loader's
    position survives a change of world size."""

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """All indices of `epoch` (default: the current one) in the order the
        ranks share, before padding: ``randperm`` seeded with seed + epoch
        when shuffling, as DistributedSampler draws it."""
        e = self.epoch if epoch is None else int(epoch)
        n = len(self.dataset)  # type: ignore[arg-type]
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        g = torch.Generator()
        g.manual_seed(self.seed + e)
        return torch.randperm(n, generator=g).numpy().astype(np.int64, copy=False)

    def fingerprint(self) -> dict[str, Any]:
        return {"sampler": "distributed", "seed": self.seed, "shuffle": self.shuffle}


def sampler_fingerprint(sampler: GlobalOrderSampler) -> dict[str, Any]:
    """What a state's order must match: the sampler's kind and seed."""
    own = getattr(sampler, "fingerprint", None)
    if callable(own):
        return dict(own())
    return {"sampler": type(sampler).__name__, "seed": getattr(sampler, "seed", None)}


@dataclass(frozen=True)
class Segment:
    """Positions [start, num_samples) of an epoch's global order dealt to
    `world_size` ranks in batches of `batch_size` (see the module's doc)."""

    num_samples: int
    start: int
    world_size: int
    batch_size: int
    drop_last: bool

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.num_samples:
            raise ValueError(
                f"a position of {self.start} samples is outside an epoch of {self.num_samples}"
            )
        if self.world_size < 1 or self.batch_size < 1:
            raise ValueError("world size and batch size must be at least 1")

    @property
    def fresh(self) -> bool:
        """DistributedSampler's partition of the whole epoch."""
        return self.start == 0

    def round_sizes(self) -> tuple[list[int], int]:
        """Positions of the order in each round (the batches of every rank),
        and how many repeated positions pad the last round."""
        n, w, b = self.num_samples, self.world_size, self.batch_size
        if self.fresh:
            per_rank = n // w if self.drop_last else math.ceil(n / w)
            batches = per_rank // b if self.drop_last else math.ceil(per_rank / b)
            sizes = [min(w * b, n - w * b * t) for t in range(batches)]
            padded = 0 if self.drop_last else per_rank * w - n
            return sizes, padded
        remaining = n - self.start
        if self.drop_last:
            return [w * b] * (remaining // (w * b)), 0
        if remaining == 0:
            return [], 0
        batches = math.ceil(remaining / (w * b))
        sizes = [w * b] * (batches - 1) + [remaining - (batches - 1) * w * b]
        short = w - sizes[-1]
        if short > 0 and batches >= 2 and b >= 2:
            sizes[-2] -= short  # b >= 2 keeps that round at w or more
            sizes[-1] = w
            short = 0
        return sizes, max(0, short)

    def num_batches(self) -> int:
        """Batches every rank yields in this segment."""
        return len(self.round_sizes()[0])

    def consumed(self, batches: int) -> int:
        """The global position after every rank yielded `batches` batches of
        this segment: how many positions of the order they consumed (padding
        excluded)."""
        sizes, _ = self.round_sizes()
        return min(self.num_samples, self.start + sum(sizes[: max(0, batches)]))

    def rank_batches(self, order: np.ndarray, rank: int) -> Iterator[np.ndarray]:
        """Rank `rank`'s index batches of this segment (a resumed one; a
        fresh one is DistributedSampler's own)."""
        if order.size != self.num_samples:
            raise ValueError(f"an order of {order.size} indices for {self.num_samples} samples")
        sizes, padded = self.round_sizes()
        remaining = order[self.start :]
        position = self.start
        for t, size in enumerate(sizes):
            stretch = order[position : position + size]
            if t == len(sizes) - 1 and padded:
                stretch = np.concatenate([stretch, np.resize(remaining, padded)])
            position += size
            yield stretch[rank :: self.world_size]


def segment_after(
    state: dict[str, Any] | None,
    num_samples: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
) -> tuple[Segment, int]:
    """The segment a loader at `world_size` runs after loading `state` (the
    ``"elastic"`` part of a loader state; None: a fresh epoch), and how many
    of its batches were already delivered."""
    if state is None:
        return Segment(num_samples, 0, world_size, batch_size, drop_last), 0
    recorded = Segment(
        num_samples, int(state["start"]), int(state["world_size"]), batch_size, drop_last
    )
    batches = int(state["batches"])
    if recorded.world_size == world_size:
        return recorded, batches
    return Segment(num_samples, recorded.consumed(batches), world_size, batch_size, drop_last), 0


def elastic_state(segment: Segment, batches: int, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The ``"elastic"`` part of a loader state."""
    return {
        "num_samples": segment.num_samples,
        "start": segment.start,
        "world_size": segment.world_size,
        "batches": batches,
        "consumed": segment.consumed(batches),
        "order": fingerprint,
    }


def check_elastic_state(
    state: Any,
    num_samples: int,
    fingerprint: dict[str, Any],
    *,
    batch_size: int,
    drop_last: bool,
) -> None:
    """ValueError unless `state` is an elastic position of an epoch of
    `num_samples` samples ordered by a sampler with `fingerprint`, cut in
    batches of `batch_size` (`drop_last`): its batches within its segment."""
    if not isinstance(state, dict):
        raise ValueError(f"loader state: 'elastic' must be a dict, not {state!r}")
    for key in ("num_samples", "start", "world_size", "batches"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"loader state: elastic {key!r} must be an int >= 0, not {value!r}")
    if state["world_size"] < 1:
        raise ValueError("loader state: elastic 'world_size' must be at least 1")
    if state["num_samples"] != num_samples:
        raise ValueError(
            f"loader state is from an epoch of {state['num_samples']} samples; this loader's "
            f"sampler draws {num_samples}"
        )
    if state["start"] > num_samples:
        raise ValueError(f"loader state: elastic 'start' {state['start']} is past the epoch")
    if state.get("order") != fingerprint:
        raise ValueError(
            f"loader state was taken with another order ({state.get('order')!r}); this loader's "
            f"sampler is {fingerprint!r}"
        )
    segment = Segment(num_samples, state["start"], state["world_size"], batch_size, drop_last)
    if state["batches"] > segment.num_batches():
        raise ValueError(
            f"loader state is {state['batches']} batches into its epoch, but each rank's part of "
            f"that epoch here has {segment.num_batches()} batches (of {batch_size}, "
            f"{state['world_size']} ranks, from sample {state['start']} of {num_samples})"
        )


def per_rank_count(num_samples: int, num_replicas: int, drop_last: bool) -> int:
    """Indices each rank gets of an order of `num_samples`, as DistributedSampler counts."""
    if drop_last:
        return num_samples // num_replicas
    return math.ceil(num_samples / num_replicas)


def deal(order: np.ndarray, num_replicas: int, rank: int, drop_last: bool) -> np.ndarray:
    """Rank `rank`'s part of `order`, as DistributedSampler deals it: padded
    by repeating from the start (or cut, with `drop_last`) to a multiple of
    `num_replicas`, then positions rank::num_replicas."""
    total = per_rank_count(order.size, num_replicas, drop_last) * num_replicas
    padded = np.resize(order, total) if total > order.size else order[:total]
    return padded[rank::num_replicas]
