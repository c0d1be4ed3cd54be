"""Index batches as int64 arrays for torch's own samplers, in torch's order.

torch's ``BatchSampler`` builds each batch from a Python iterator of ints:
for batches of small rows that loop costs more than the engine's whole read
(benchmarks/README.md, "Measurements behind code choices"). For the
samplers a ``DataLoader`` creates itself — ``BatchSampler`` over
``SequentialSampler`` or over ``RandomSampler`` without replacement — the
same indices come from slicing one array per pass. The RNG is used exactly
as ``RandomSampler.__iter__`` uses it (a seed from the global RNG when it has no generator, one
``randperm(n)`` per pass including the one whose slice is empty, each drawn
only when the previous pass runs out), so the order and the generator's
state afterwards are torch's; tests compare them batch for batch.
chute's ``EpochRandomSampler`` draws as ``RandomSampler`` does; any other
sampler, or a subclass, goes through torch's own iterator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from chute.loader.epoch_samplers import EpochRandomSampler

# RandomSampler and the subclass of chute's that draws exactly as it does.
_RANDOM = (RandomSampler, EpochRandomSampler)


def array_index_batches(batch_sampler: Any) -> Iterator[np.ndarray] | None:
    """An iterator of index arrays equal to ``iter(batch_sampler)``, or
    None when the sampler is not one this module reproduces."""
    if type(batch_sampler) is not BatchSampler:
        return None
    sampler = batch_sampler.sampler
    if type(sampler) is SequentialSampler:
        passes = _sequential_passes(sampler)
    elif isinstance(sampler, _RANDOM) and type(sampler) in _RANDOM and not sampler.replacement:
        passes = _random_passes(sampler)
    else:
        return None
    return _rebatch(passes, int(batch_sampler.batch_size), bool(batch_sampler.drop_last))


def _sequential_passes(sampler: SequentialSampler) -> Iterator[np.ndarray]:
    yield np.arange(len(sampler.data_source), dtype=np.int64)


def _random_passes(sampler: RandomSampler) -> Iterator[np.ndarray]:
    n = len(sampler.data_source)
    if sampler.generator is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    else:
        generator = sampler.generator
    num_samples = sampler.num_samples
    for _ in range(num_samples // n):
        yield torch.randperm(n, generator=generator).numpy()
    yield torch.randperm(n, generator=generator).numpy()[: num_samples % n]


def _rebatch(
    passes: Iterator[np.ndarray], batch_size: int, drop_last: bool
) -> Iterator[np.ndarray]:
    # A pass is asked for only when a batch needs more indices, as torch's
    # islice/zip over the sampler does.
    current = np.empty(0, dtype=np.int64)
    pos = 0
    while True:
        if pos + batch_size <= current.size:
            yield current[pos : pos + batch_size]
            pos += batch_size
            continue
        parts = [current[pos:]] if pos < current.size else []
        have = current.size - pos
        current, pos = np.empty(0, dtype=np.int64), 0
        ended = False
        while have < batch_size:
            nxt = next(passes, None)
            if nxt is None:
                ended = True
                break
            take = min(batch_size - have, nxt.size)
            parts.append(nxt[:take])
            have += take
            if take < nxt.size:
                current, pos = nxt, take
                break
        if have == batch_size or (have > 0 and not drop_last):
            yield parts[0] if len(parts) == 1 else np.concatenate(parts)
        if ended:
            return
