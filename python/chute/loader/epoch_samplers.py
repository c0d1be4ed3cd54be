"""Samplers whose ``set_epoch`` frameworks reach.

PyTorch Lightning tells a loader the epoch only through
``loader.sampler.set_epoch`` and ``loader.batch_sampler.sampler.set_epoch``
(``lightning.fabric.utilities.data._set_sampler_epoch``), and after a
resume from an end-of-epoch checkpoint it loads no loader state: the epoch
number is all the loader learns. Two of chute's loaders need more than
torch gives them there:

- a stream: torch gives an ``IterableDataset`` loader its
  ``_InfiniteConstantSampler``, which has no ``set_epoch``; chute's stream
  loaders get `StreamEpochSampler`, which hands the epoch to the dataset
  (shard shuffle and shuffle buffers are seeded from it).
- ``shuffle=True`` with a ``generator``: each epoch's order is drawn from
  the generator where the previous epoch left it, so a fresh loader told
  epoch e would draw epoch 0's order. chute's loader then gets
  `EpochRandomSampler` (torch's ``RandomSampler``, same draws), which
  records the epoch; `align_generator` brings the generator to where an
  uninterrupted loader's would be at the start of that epoch, by replaying
  the earlier epochs' draws from the generator's state at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any

import torch
from torch.utils.data import RandomSampler
from torch.utils.data.dataloader import _InfiniteConstantSampler


class StreamEpochSampler(_InfiniteConstantSampler):
    """The sampler of a chute stream loader: torch's infinite ``None``
    sampler, with a ``set_epoch`` that reaches the dataset."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.dataset = dataset
        self.epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        fn = getattr(self.dataset, "set_epoch", None)
        if callable(fn):
            fn(epoch)


class EpochRandomSampler(RandomSampler):
    """``RandomSampler(data_source, generator=generator)``, the same draws,
    and a ``set_epoch``: the epoch whose order the next iteration draws
    (None until told: then each iteration continues from the last, as
    torch's). Keeps the generator's state at construction, where epoch 0
    starts."""

    def __init__(self, data_source: Sized, generator: torch.Generator) -> None:
        super().__init__(data_source, generator=generator)
        self.epoch: int | None = None
        self.origin = generator.get_state()
        # The epoch whose start the generator holds when the next iteration
        # begins, were it not told another.
        self.generator_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def align_generator(
    sampler: Any, replay_epoch: Callable[[], None], resumed_epoch: int | None = None
) -> None:
    """Before an iteration of a loader whose sampler is `sampler`: when it
    is an `EpochRandomSampler` told an epoch other than the one the
    generator stands at, puts the generator back at its origin and calls
    `replay_epoch` (one epoch's draws, as the loader makes them) once per
    earlier epoch. `resumed_epoch`: the iteration resumes a state of that
    epoch, whose generator state the loader set itself."""
    if not isinstance(sampler, EpochRandomSampler):
        return
    if resumed_epoch is not None:
        sampler.generator_epoch = resumed_epoch + 1
        return
    wanted = sampler.epoch
    if wanted is not None and wanted != sampler.generator_epoch:
        generator = sampler.generator
        assert generator is not None
        generator.set_state(sampler.origin)
        for _ in range(wanted):
            replay_epoch()
    sampler.generator_epoch = (sampler.generator_epoch if wanted is None else wanted) + 1


def resume_for_told_epoch(
    state: dict[str, Any],
    told: int | None,
    told_at_load: int | None,
    epoch_batches: Callable[[int | None], int | None],
) -> dict[str, Any] | None:
    """The loaded loader `state` an iteration resumes, when ``set_epoch``
    may have been called since the load: `told` is the sampler's epoch now,
    `told_at_load` when the state was loaded; `epoch_batches(epoch)` counts
    an indexed epoch's batches (None: unknown).

    A training loop that saves the state after an epoch and loads it on
    restart tells the loader the next epoch before iterating. A state at
    the start of its epoch, or at its end, then gives way to the epoch told:
    None for an indexed state (the sampler's epoch decides the order), the
    start of that epoch for a stream's. A state in the middle of another
    epoch than the one told is refused: resuming it would deliver that
    epoch's rest, not the epoch asked for."""
    if told is None or told == told_at_load:
        return state
    indexed = state.get("kind") == "indexed"
    position = state if indexed else state.get("dataset", {})
    epoch = position.get("sampler_epoch" if indexed else "epoch")
    if not isinstance(epoch, int) or told == epoch:
        return state
    elastic = position.get("elastic")
    consumed = elastic.get("consumed", 0) if isinstance(elastic, dict) else None
    if indexed:
        batches = int(state.get("batches", 0))
        at_start = batches == 0 and not consumed
        total = elastic.get("num_samples") if isinstance(elastic, dict) else None
        at_end = (consumed is not None and consumed == total) or (
            consumed is None and batches == epoch_batches(epoch)
        )
    else:
        at_start = not any(position.get(k, 0) for k in ("pass", "batches", "rows", "items"))
        at_end = False  # a stream's position does not say where its epoch ends
    if not (at_start or at_end):
        where = f"{state.get('batches', position.get('batches'))} batches into epoch {epoch}"
        raise ValueError(
            f"the loaded loader state is {where}, but set_epoch({told}) was called after "
            "loading it: resuming would deliver the rest of that epoch, not epoch "
            f"{told}. Call set_epoch({epoch}) (the epoch the state was taken in), or load "
            "the state after set_epoch"
        )
    if indexed:
        return None
    start = {k: v for k, v in position.items() if k != "elastic"}
    start.update(epoch=told, **{"pass": 0, "batches": 0, "rows": 0, "items": 0})
    return {**state, "dataset": start}
