"""Weighted mixing of chute datasets and streams: ``chute.mix``.

``chute.mix([a, b], weights=[0.7, 0.3], seed=0)``:

- map-style datasets whose batches are tensor dicts (``ArrayDataset``,
  ``H5Dataset``, ``MixedDataset``) mix per sample: a `MixedDataset` with
  weights, whose epoch order takes exactly the apportioned count from each
  source, interleaved so that every prefix is within one sample of its
  share (``MixedDataset.global_order``). Under DDP the order is dealt to the
  ranks as DistributedSampler deals its own, and resumes elastically.
- anything else (``WebDataset`` pipelines, ``TarDataset``) mixes per batch:
  a `MixedStream` (chute.datasets.mix_stream) takes each batch from the source the
  same schedule names, so every prefix of an epoch's batches is within one
  batch of each source's share.

Weights are a schedule, as ``Curriculum`` takes them: per-source weights
(a list in source order, or ``{name: weight}``), a list of those per epoch,
``{epoch: weights}``, or a callable ``epoch -> weights``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from chute import _core
from chute.datasets.curriculum import Curriculum, GroupKey, Schedule, apportion, normalized_weights
from chute.datasets.indexed import Batch, BatchReader, IndexedDataset, submitted_ahead
from chute.datasets.mix_stream import MixedStream
from chute.datasets.tardataset import TarDataset
from chute.loader.elastic_sampler import deal, per_rank_count
from chute.loader.engine import default_threads
from chute.sources.shards import rank_and_world_size


class MixedDataset(IndexedDataset):
    """Map-style concatenation of chute datasets with the same fields, and
    their weighted mix.

    `MixedDataset({"web": a, "books": b})` (or a list, named 0, 1, ...):
    index i < len(a) is a[i], then b[i - len(a)], as torch's ConcatDataset.
    `mixed.curriculum(schedule, ...)` gives a `Curriculum` over the
    per-dataset index ranges, so the schedule's weights are mixing weights:
    `{"web": 0.7, "books": 0.3}` draws 70% of each epoch from `web` whatever
    the sizes.

    With `weights` (a schedule, as `Curriculum` takes: `{name: weight}`, a
    list of them per epoch, `{epoch: weights}` or a callable) the dataset
    has an order of its own, exact rather than drawn (see `global_order`),
    and `chute.DataLoader` uses it: `DataLoader(mixed, batch_size=B)` or,
    under DDP, `distributed=True` (the order dealt to the ranks as
    DistributedSampler deals its own, elastic on resume).

    Reads stay native: each index batch is split by dataset (one vectorised
    searchsorted), each part goes to that dataset's own engine, and the parts
    are gathered back into batch order — one extra copy of the batch, made by
    torch's indexing, not per-sample Python.
    """

    def __init__(
        self,
        datasets: Mapping[GroupKey, IndexedDataset] | Sequence[IndexedDataset],
        weights: Schedule | None = None,
        *,
        num_samples: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if isinstance(datasets, Mapping):
            names = list(datasets)
            parts = [datasets[n] for n in names]
        else:
            parts = list(datasets)
            names = list(range(len(parts)))
        if not parts:
            raise ValueError("MixedDataset needs at least one dataset")
        for name, d in zip(names, parts, strict=True):
            if not isinstance(d, IndexedDataset):
                raise TypeError(
                    f"MixedDataset: dataset {name!r} is a {type(d).__name__}, not a chute "
                    "map-style dataset; for other datasets use torch's ConcatDataset with "
                    "chute.Curriculum(groups=...)"
                )
        fields = parts[0].field_names()
        for name, d in zip(names, parts, strict=True):
            if d.field_names() != fields:
                raise ValueError(
                    f"MixedDataset: dataset {name!r} has fields {d.field_names()}, "
                    f"dataset {names[0]!r} has {fields}"
                )
        self.names = names
        self.datasets = parts
        sizes = np.array([len(d) for d in parts], dtype=np.int64)
        self.cumulative_sizes = np.cumsum(sizes)
        self._starts = self.cumulative_sizes - sizes
        self.weights = weights
        if num_samples is not None and (
            isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0
        ):
            raise ValueError(f"num_samples should be a positive integer, got {num_samples!r}")
        self.num_samples = num_samples
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._init_indexed(None)
        if weights is not None:
            self.counts(0)  # a bad schedule fails here, not at the first epoch

    # -- the weighted mix ---------------------------------------------------------------

    def counts(self, epoch: int) -> dict[GroupKey, int]:
        """Samples of each dataset in `epoch`'s order: `num_samples` (default:
        the most for which no dataset repeats a sample) apportioned by the
        epoch's weights, largest remainders first."""
        if self.weights is None:
            raise ValueError("this MixedDataset has no weights: it is a plain concatenation")
        shares = np.array(
            list(normalized_weights(self.weights, self.names, epoch, "dataset").values())
        )
        sizes = np.diff(self.cumulative_sizes, prepend=0)
        n = self.num_samples
        if n is None:
            used = shares > 0
            n = int(np.floor(np.min(sizes[used] / shares[used])))
            while n > 0 and np.any(apportion(n, shares) > sizes):
                n -= 1
            if n == 0:
                raise ValueError(f"epoch {epoch}: a weighted dataset is empty")
        return dict(zip(self.names, apportion(n, shares).tolist(), strict=True))

    def global_order(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s indices (into the concatenation), before any split
        by rank. Exact ratios: dataset i gives exactly counts(epoch)[i] of
        them, and they are interleaved by Tijdeman's chairman assignment
        (``_core.mix_schedule``), so every prefix of m indices holds within
        one index of m * count_i / n from each dataset (within 1/2 for two
        datasets). Which samples a dataset gives: with `shuffle`, a
        permutation drawn from (seed, epoch, dataset), taken in turn (a new
        one when a dataset is asked for more samples than it has); without,
        its samples in order, cycling."""
        counts = np.array(list(self.counts(epoch).values()), dtype=np.int64)
        n = int(counts.sum())
        sources = _core.mix_schedule(counts.tolist(), 0, n)
        order = np.empty(n, dtype=np.int64)
        sizes = np.diff(self.cumulative_sizes, prepend=0)
        for d, (count, size) in enumerate(zip(counts.tolist(), sizes.tolist(), strict=True)):
            if not count:
                continue
            if self.shuffle:
                rng = np.random.default_rng([self.seed & (2**64 - 1), epoch & (2**64 - 1), d])
                rounds = -(-count // size)
                picks = np.concatenate([rng.permutation(size) for _ in range(rounds)])[:count]
            else:
                picks = np.arange(count, dtype=np.int64) % size
            order[sources == d] = self._starts[d] + picks
        return order

    def order_sampler(
        self,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> MixSampler | None:
        """The sampler of the weighted mix (None without weights): what
        ``chute.DataLoader`` uses when given no sampler."""
        if self.weights is None:
            return None
        return MixSampler(self, num_replicas=num_replicas, rank=rank, drop_last=drop_last)

    def reads_remote(self) -> bool:
        return any(d.reads_remote() for d in self.datasets)

    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1])

    def field_names(self) -> list[str]:
        return self.datasets[0].field_names()

    def ranges(self) -> dict[GroupKey, range]:
        """Dataset name → its index range in the concatenation."""
        return {
            n: range(int(s), int(e))
            for n, s, e in zip(self.names, self._starts, self.cumulative_sizes, strict=True)
        }

    def curriculum(
        self,
        schedule: Schedule,
        num_samples: int | None = None,
        replacement: bool = True,
        seed: int = 0,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> Curriculum:
        """A `Curriculum` whose groups are the datasets (by name)."""
        groups = {n: np.arange(r.start, r.stop, dtype=np.int64) for n, r in self.ranges().items()}
        return Curriculum(
            groups,
            schedule,
            num_samples=num_samples,
            replacement=replacement,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            drop_last=drop_last,
        )

    def _split(self, idx: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(dataset, positions in the batch, local indices) for each dataset touched."""
        n = len(self)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            i = int(np.argmax(bad))
            raise IndexError(f"index {int(idx[i])} is out of range for a dataset of length {n}")
        which = np.searchsorted(self.cumulative_sizes, idx, side="right")
        out: list[tuple[int, np.ndarray, np.ndarray]] = []
        for d in np.unique(which):
            pos = np.flatnonzero(which == d)
            out.append((int(d), pos, idx[pos] - self._starts[d]))
        return out

    def _gather(self, n: int, parts: list[tuple[np.ndarray, Batch]]) -> Batch:
        if len(parts) == 1 and parts[0][0].size == n:
            return parts[0][1]  # one dataset and positions 0..n-1 in order: no copy
        out: Batch = {}
        for name in self.field_names():
            first = parts[0][1][name]
            for _, batch in parts[1:]:
                t = batch[name]
                if t.dtype != first.dtype or t.shape[1:] != first.shape[1:]:
                    raise ValueError(
                        f"MixedDataset: field {name!r} is {first.dtype}{list(first.shape[1:])} "
                        f"in one dataset and {t.dtype}{list(t.shape[1:])} in another"
                    )
            column = torch.empty((n, *first.shape[1:]), dtype=first.dtype)
            for pos, batch in parts:
                column[torch.from_numpy(pos)] = batch[name]
            out[name] = column
        return out

    def read_batch(self, idx: np.ndarray) -> Batch:
        parts = [(pos, self.datasets[d].read_batch(local)) for d, pos, local in self._split(idx)]
        return self._gather(int(idx.size), parts)

    def iter_batches(
        self,
        index_batches: Any,
        num_threads: int,
        prefetch: int,
        timeout: float = 0,
        pin_memory: bool = False,
    ) -> Iterator[Batch]:
        """As `IndexedDataset.iter_batches`; one engine per dataset, each fed
        the parts of the batches that touch it, in order. The parts are
        gathered into a new batch, which is pinned by a copy when asked."""
        prefetch = max(1, int(prefetch))
        readers: dict[int, BatchReader] = {}
        Split = tuple[int, list[tuple[int, np.ndarray, np.ndarray]]]

        def submit(indices: Sequence[int]) -> Split:
            idx = self._as_indices(indices)
            split = self._split(idx)
            for d, _, local in split:
                if d not in readers:
                    readers[d] = self.datasets[d].open_reader(num_threads, prefetch)
                readers[d].submit(local)
            return int(idx.size), split

        def collect(submitted: Split) -> Batch:
            n, split = submitted
            parts = [(pos, readers[d].collect(local, float(timeout))) for d, pos, local in split]
            self._totals["batches"] += 1
            self._totals["samples_yielded"] += n
            batch = self._gather(n, parts)
            if pin_memory and torch.cuda.is_available():
                batch = {k: v.pin_memory() for k, v in batch.items()}
            return batch

        try:
            yield from submitted_ahead(index_batches, prefetch, submit, collect)
        finally:
            for reader in readers.values():
                self._totals["bytes_yielded"] += reader.bytes_delivered()
                reader.close()

    def state_identity(self) -> dict[str, Any]:
        """What a loader state over this mix is bound to: each dataset's own
        identity by name, and the settings of the weighted order (its seed,
        shuffle and epoch size; the weights themselves are checked through
        the order's length and the schedule's counts)."""
        return {
            "type": "MixedDataset",
            "datasets": {
                str(name): _identity_of(d)
                for name, d in zip(self.names, self.datasets, strict=True)
            },
            "weighted": self.weights is not None,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
        }

    def release_idle_engines(self) -> None:
        for d in self.datasets:
            d.release_idle_engines()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._totals)
        out["datasets"] = {n: d.stats() for n, d in zip(self.names, self.datasets, strict=True)}
        return out

    def __repr__(self) -> str:
        sizes = dict(zip(self.names, map(len, self.datasets), strict=True))
        if self.weights is None:
            return f"MixedDataset({sizes})"
        return f"MixedDataset({sizes}, weights={self.weights!r}, seed={self.seed})"


class MixSampler(Sampler[int]):
    """A weighted `MixedDataset`'s order (``global_order``), dealt to ranks as
    DistributedSampler deals its own (padded by repeating its first indices,
    or cut with `drop_last`, to a multiple of `num_replicas`; rank r takes
    positions r::num_replicas). ``set_epoch`` switches the epoch."""

    def __init__(
        self,
        mixed: MixedDataset,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        default_rank, default_world = rank_and_world_size()
        self.mixed = mixed
        self.num_replicas = default_world if num_replicas is None else int(num_replicas)
        self.rank = default_rank if rank is None else int(rank)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, {self.num_replicas})")
        self.drop_last = bool(drop_last)
        self.seed = mixed.seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        return self.mixed.global_order(self.epoch if epoch is None else int(epoch))

    def fingerprint(self) -> dict[str, Any]:
        return {"sampler": "mix", "seed": self.seed, "shuffle": self.mixed.shuffle}

    def epoch_identity(self, epoch: int | None = None) -> dict[str, Any]:
        """What decides `epoch`'s order besides the sources and the seed: the
        sources' order and the samples each gives (its weights' counts).
        A loader state records it, so that resuming with the sources
        reordered or reweighted is refused rather than read as another order."""
        counts = self.mixed.counts(self.epoch if epoch is None else int(epoch))
        return {"sources": [str(n) for n in counts], "counts": list(counts.values())}

    def __iter__(self) -> Iterator[int]:
        part = deal(self.global_order(), self.num_replicas, self.rank, self.drop_last)
        return iter(part.tolist())

    def __len__(self) -> int:
        n = sum(self.mixed.counts(self.epoch).values())
        return per_rank_count(n, self.num_replicas, self.drop_last)


def _identity_of(dataset: IndexedDataset) -> dict[str, Any]:
    """`dataset`'s state identity; its type and length when it has none."""
    own = getattr(dataset, "state_identity", None)
    if callable(own):
        return dict(own())
    return {"type": type(dataset).__name__, "rows": len(dataset)}


def _is_sample_mixable(source: Any) -> bool:
    """Map-style sources whose batches are tensor dicts mix per sample."""
    return isinstance(source, IndexedDataset) and not isinstance(source, TarDataset)


def _as_schedule(weights: Any, names: list[GroupKey]) -> Schedule:
    """`weights` with per-source lists of numbers turned into {name: weight}."""

    def one(w: Any) -> Any:
        if (
            isinstance(w, Sequence)
            and not isinstance(w, str)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in w)
        ):
            if len(w) != len(names):
                raise ValueError(f"{len(w)} weights for {len(names)} sources")
            return dict(zip(names, w, strict=True))
        return w

    if callable(weights):
        return lambda epoch: one(weights(epoch))
    if isinstance(weights, Sequence) and not isinstance(weights, str):
        numbers = one(weights)
        if isinstance(numbers, dict):
            return numbers
        return [one(w) for w in weights]
    if (
        isinstance(weights, Mapping)
        and weights
        and all(isinstance(v, Sequence) and not isinstance(v, str) for v in weights.values())
    ):
        return {epoch: one(w) for epoch, w in weights.items()}
    return weights  # type: ignore[no-any-return]


def mix(
    sources: Sequence[Any] | Mapping[GroupKey, Any],
    weights: Any,
    seed: int = 0,
    *,
    num_samples: int | None = None,
    shuffle: bool = True,
    batch_size: int | None = None,
    drop_last: bool = False,
    num_workers: int | None = None,
) -> MixedDataset | MixedStream:
    """Mixes chute datasets or streams by per-epoch weights (module doc).

    Args:
        sources: a list (named 0, 1, ...) or ``{name: source}``.
        weights: per-source weights (``[0.7, 0.3]`` or ``{name: w}``) or a
            schedule of them per epoch.
        seed: the per-sample mix's sample choice (streams keep their own
            seeds), and the shuffle of map-style sources mixed per batch.
        num_samples: samples per epoch of a per-sample mix (default: the
            most for which no source repeats a sample).
        shuffle: draw each map-style source's samples in a random order.
        batch_size, drop_last, num_workers: how map-style sources mixed per
            batch (TarDataset, or any map-style source mixed with a stream)
            are batched: each runs in a ``chute.DataLoader(source,
            batch_size, distributed=True, shuffle, seed, drop_last)``.

    Returns a `MixedDataset` (every source map-style with tensor-dict
    batches: mixed per sample) or a `MixedStream` (mixed per batch).
    """
    if isinstance(sources, Mapping):
        names = list(sources)
        parts = [sources[n] for n in names]
    else:
        parts = list(sources)
        names = list(range(len(parts)))
    schedule = _as_schedule(weights, names)
    if parts and all(_is_sample_mixable(p) for p in parts):
        return MixedDataset(
            dict(zip(names, parts, strict=True)),
            weights=schedule,
            num_samples=num_samples,
            seed=seed,
            shuffle=shuffle,
        )
    if num_samples is not None:
        raise ValueError("num_samples applies to a per-sample mix of map-style datasets only")
    wrapped: list[Any] = []
    for name, part in zip(names, parts, strict=True):
        if isinstance(part, IndexedDataset):
            if batch_size is None:
                raise ValueError(
                    f"mix source {name!r} is map-style and is mixed per batch: give batch_size"
                )
            from chute.loader.dataloader import DataLoader

            part = DataLoader(
                part,
                batch_size=batch_size,
                shuffle=shuffle,
                drop_last=drop_last,
                num_workers=default_threads() if num_workers is None else num_workers,
                distributed=True,
                seed=seed,
            )
        wrapped.append(part)
    return MixedStream(dict(zip(names, wrapped, strict=True)), schedule)
