"""Per-epoch sampling schedules over groups of samples, and dataset mixing.

`Curriculum` is a torch `Sampler[int]`: groups of sample indices (by
difficulty, by source, ...) and a schedule that gives each epoch's weight per
group. `set_epoch(e)` switches to epoch e's weights. `MixedDataset`
(chute.mix) concatenates map-style chute datasets;
`MixedDataset.curriculum(schedule)` is a `Curriculum` over their index
ranges, i.e. per-epoch mixing weights drawn at random; its `weights` mix
them with exact counts instead.

Randomness: epoch e's order is a pure function of (seed, epoch). Both go into
numpy's `SeedSequence` as separate words, so (seed=0, epoch=1) and (seed=1,
epoch=0) are unrelated streams (torch's `seed + epoch` convention makes them
identical). Nothing depends on torch's global RNG, the number of threads or
the rank.

DDP: every rank draws the same global order of `num_samples` indices, then
takes `order[rank::num_replicas]` after padding (repeating from the start) or
truncating (`drop_last=True`) to a multiple of `num_replicas` — the rule of
`torch.utils.data.DistributedSampler` — so ranks get disjoint positions of
one draw and equal lengths, and DDP never waits on a short rank.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from chute.sources.shards import rank_and_world_size

GroupKey = Any  # str for named groups, or any hashable label of a label array
Weights = Mapping[GroupKey, float]
Schedule = Callable[[int], Weights] | Sequence[Weights] | Mapping[int, Weights] | Weights


class Curriculum(Sampler[int]):
    """Draws sample indices from groups with per-epoch group weights.

    Args:
        groups: `{name: indices}` (each a 1-D integer array, tensor or
            sequence; groups may overlap, an index in two groups can be
            drawn through either), or one label per sample (a 1-D array:
            sample i belongs to group `labels[i]`; groups are the distinct
            labels in sorted order).
        schedule: the weights of an epoch, `{group: weight}`. A weight is the
            share of the epoch's draws that come from that group (it is
            normalised; groups left out weigh 0), not a per-sample weight.
            One of:
              - a callable `epoch -> {group: weight}`;
              - a list of per-epoch weights; epochs past its end keep the last;
              - `{epoch: weights}`: piecewise constant, each entry holding
                from its epoch until the next one (it must have an entry for
                epoch 0 or below);
              - a single `{group: weight}`: the same every epoch.
        num_samples: indices drawn per epoch over all ranks (default: the
            number of distinct indices in all groups).
        replacement: True draws each index independently: a group by weight,
            then a member uniformly. False draws exactly
            round(num_samples * share) distinct members of each group
            (largest-remainder rounding), then shuffles them together; a
            group asked for more members than it has is an error.
        seed: the base of every epoch's draw.
        num_replicas, rank: the DDP partition (default: from
            torch.distributed when initialised, else WORLD_SIZE/RANK).
        drop_last: drop the tail of the draw instead of padding it to a
            multiple of num_replicas, as DistributedSampler.

    `len(sampler)` is this rank's count. Use it as `sampler=` of
    torch's or chute's DataLoader; `loader.set_epoch(e)` reaches it (with
    torch's loader, call `sampler.set_epoch(e)`). It splits by rank itself:
    do not also pass `distributed=True` or wrap it in a DistributedSampler.
    """

    def __init__(
        self,
        groups: Mapping[GroupKey, Any] | np.ndarray | torch.Tensor | Sequence[Any],
        schedule: Schedule,
        num_samples: int | None = None,
        replacement: bool = True,
        seed: int = 0,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self._names, self._members = _parse_groups(groups)
        self._schedule = schedule
        if num_samples is None:
            num_samples = int(np.unique(np.concatenate(self._members)).size)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer, got {num_samples!r}")
        self.num_samples = num_samples
        self.replacement = bool(replacement)
        self.seed = int(seed)
        default_rank, default_world = rank_and_world_size()
        self.num_replicas = default_world if num_replicas is None else int(num_replicas)
        self.rank = default_rank if rank is None else int(rank)
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas should be at least 1, got {self.num_replicas}")
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, {self.num_replicas})")
        self.drop_last = bool(drop_last)
        if self.drop_last:
            self._per_rank = num_samples // self.num_replicas
        else:
            self._per_rank = math.ceil(num_samples / self.num_replicas)
        if self._per_rank == 0:
            raise ValueError(
                f"drop_last=True leaves no samples: {num_samples} draws over "
                f"{self.num_replicas} replicas"
            )
        self.epoch = 0
        self._members_digest: str | None = None
        self.weights(0)  # a bad schedule fails here, not at the first iteration

    @property
    def groups(self) -> dict[GroupKey, np.ndarray]:
        """Group name → member indices (int64 copies)."""
        return {n: m.copy() for n, m in zip(self._names, self._members, strict=True)}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def weights(self, epoch: int | None = None) -> dict[GroupKey, float]:
        """The normalised group shares of `epoch` (default: the current one)."""
        e = self.epoch if epoch is None else int(epoch)
        shares = normalized_weights(self._schedule, self._names, e)
        values = np.array(list(shares.values()))
        empty = [
            n
            for n, v, m in zip(self._names, values, self._members, strict=True)
            if v > 0 and m.size == 0
        ]
        if empty:
            raise ValueError(
                f"schedule for epoch {e}: group {empty[0]!r} has weight but no members"
            )
        return shares

    def epoch_identity(self, epoch: int | None = None) -> dict[str, Any]:
        """What decides `epoch`'s draw: the groups (in order, a digest of
        their members), that epoch's shares, the seed, `num_samples` and
        `replacement`. A loader state records it, so that resuming with
        another schedule or other groups is refused rather than drawn anew."""
        e = self.epoch if epoch is None else int(epoch)
        if self._members_digest is None:
            digest = hashlib.sha256()
            for members in self._members:
                digest.update(np.int64(members.size).tobytes() + members.tobytes())
            self._members_digest = digest.hexdigest()[:16]
        return {
            "sampler": "curriculum",
            "groups": [str(n) for n in self._names],
            "members": self._members_digest,
            "weights": [float(w) for w in self.weights(e).values()],
            "seed": self.seed,
            "num_samples": self.num_samples,
            "replacement": self.replacement,
        }

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """The `num_samples` indices every rank draws for `epoch`, before the split."""
        e = self.epoch if epoch is None else int(epoch)
        shares = np.array(list(self.weights(e).values()))
        rng = np.random.default_rng([self.seed, e])
        n = self.num_samples
        if self.replacement:
            group = rng.choice(len(shares), size=n, p=shares)
            sizes = np.array([m.size for m in self._members], dtype=np.int64)
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            flat = np.concatenate(self._members)
            # A uniform member of each drawn group, in one vectorised step.
            pick = (rng.random(n) * sizes[group]).astype(np.int64)
            drawn: np.ndarray = flat[starts[group] + np.minimum(pick, sizes[group] - 1)]
            return drawn
        counts = apportion(n, shares)
        parts: list[np.ndarray] = []
        for name, members, count in zip(self._names, self._members, counts, strict=True):
            if count > members.size:
                raise ValueError(
                    f"epoch {e}: replacement=False asks group {name!r} for {count} of "
                    f"{n} samples but it has {members.size}; lower num_samples "
                    "or use replacement=True"
                )
            if count:
                parts.append(rng.choice(members, size=count, replace=False))
        return rng.permutation(np.concatenate(parts))

    def __iter__(self) -> Iterator[int]:
        order = self.global_order()
        if self.drop_last:
            order = order[: self._per_rank * self.num_replicas]
        else:
            total = self._per_rank * self.num_replicas
            if total > order.size:  # pad by wrapping around, as DistributedSampler
                order = np.resize(order, total)
        return iter(order[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        return self._per_rank

    def __repr__(self) -> str:
        return (
            f"Curriculum(groups={len(self._names)}, num_samples={self.num_samples}, "
            f"replacement={self.replacement}, seed={self.seed}, epoch={self.epoch}, "
            f"rank={self.rank}/{self.num_replicas})"
        )


def _parse_groups(
    groups: Mapping[GroupKey, Any] | np.ndarray | torch.Tensor | Sequence[Any],
) -> tuple[list[GroupKey], list[np.ndarray]]:
    if isinstance(groups, Mapping):
        if not groups:
            raise ValueError("Curriculum needs at least one group")
        names = list(groups)
        members = [_as_index_array(name, groups[name]) for name in names]
        return names, members
    labels = groups.numpy() if isinstance(groups, torch.Tensor) else np.asarray(groups)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError("Curriculum group labels must be a non-empty 1-D array, one per sample")
    uniq, inverse = np.unique(labels, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=uniq.size))[:-1]
    members = [m.astype(np.int64) for m in np.split(order, bounds)]
    return [u.item() for u in uniq], members


def _as_index_array(name: GroupKey, value: Any) -> np.ndarray:
    a = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(
            f"group {name!r}: indices must be a 1-D integer array, got {a.dtype}{a.shape}"
        )
    if a.min() < 0:
        raise ValueError(f"group {name!r}: negative index {int(a.min())}")
    return a.astype(np.int64)


def _weights_at(schedule: Schedule, epoch: int) -> Mapping[GroupKey, float]:
    out: Any
    if callable(schedule):
        out = schedule(epoch)
    elif isinstance(schedule, Mapping):
        values = list(schedule.values())
        if values and all(isinstance(v, Mapping) for v in values):
            starts = sorted(k for k in schedule if k <= epoch)
            if not starts:
                raise ValueError(f"schedule has no entry at or before epoch {epoch}")
            out = schedule[starts[-1]]
        else:
            out = schedule
    elif isinstance(schedule, Sequence) and not isinstance(schedule, str):
        if not schedule:
            raise ValueError("schedule list is empty")
        out = schedule[min(max(epoch, 0), len(schedule) - 1)]
    else:
        raise TypeError(f"schedule must be a callable, a list or a dict, got {type(schedule)}")
    if not isinstance(out, Mapping):
        raise TypeError(f"schedule for epoch {epoch} is {out!r}, not a {{group: weight}} dict")
    return out


def normalized_weights(
    schedule: Schedule, names: Sequence[GroupKey], epoch: int, what: str = "group"
) -> dict[GroupKey, float]:
    """The shares `schedule` gives `names` at `epoch` (summing to 1; names
    left out weigh 0). ValueError for unknown names and weights that are
    negative, not finite or all 0."""
    raw = _weights_at(schedule, epoch)
    unknown = [k for k in raw if k not in names]
    if unknown:
        raise ValueError(
            f"schedule for epoch {epoch} names unknown {what}(s) {unknown!r}; "
            f"{what}s are {list(names)!r}"
        )
    values = np.array([float(raw.get(n, 0.0)) for n in names])
    bad = [n for n, v in zip(names, values, strict=True) if not (v >= 0 and v < np.inf)]
    if bad:
        raise ValueError(
            f"schedule for epoch {epoch}: weight of {what} {bad[0]!r} is {raw[bad[0]]}"
        )
    total = values.sum()
    if total <= 0:
        raise ValueError(f"schedule for epoch {epoch}: all {what} weights are 0")
    return {n: float(v / total) for n, v in zip(names, values, strict=True)}


def apportion(n: int, shares: np.ndarray) -> np.ndarray:
    """Integer counts summing to n, proportional to shares (largest remainders)."""
    exact = shares * n
    counts: np.ndarray = np.floor(exact).astype(np.int64)
    short = n - int(counts.sum())
    if short > 0:
        # Ties go to the earlier group (stable sort) so counts are deterministic.
        order = np.argsort(-(exact - counts), kind="stable")
        counts[order[:short]] += 1
    return counts
