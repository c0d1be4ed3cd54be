"""The array fast path for torch's own samplers gives torch's batches and
leaves the RNGs exactly where torch's iterator leaves them."""

from __future__ import annotations

import itertools

import pytest
import torch
from chute.loader.index_batches import array_index_batches
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler


def _same_as_torch(make: object) -> None:
    assert callable(make)
    torch.manual_seed(123)
    expected = [list(b) for b in make()]
    after_torch = torch.get_rng_state()
    torch.manual_seed(123)
    batches = array_index_batches(make())
    assert batches is not None
    got = [b.tolist() for b in batches]
    assert got == expected
    assert torch.equal(torch.get_rng_state(), after_torch)


@pytest.mark.parametrize(
    ("n", "batch_size", "drop_last"),
    [(10, 3, False), (10, 3, True), (12, 4, False), (12, 4, True), (1, 5, False), (5, 5, True)],
)
def test_sequential_and_random_batches_equal_torch(
    n: int, batch_size: int, drop_last: bool
) -> None:
    data = range(n)
    _same_as_torch(lambda: BatchSampler(SequentialSampler(data), batch_size, drop_last))
    _same_as_torch(lambda: BatchSampler(RandomSampler(data), batch_size, drop_last))


@pytest.mark.parametrize(("n", "num_samples"), [(7, 20), (7, 21), (7, 3), (8, 16)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_num_samples_beyond_one_pass_with_a_generator(
    n: int, num_samples: int, drop_last: bool
) -> None:
    # Several permutations, batches spanning them, the generator's state
    # after the epoch (which decides the next epoch) equal to torch's.
    g_torch = torch.Generator().manual_seed(5)
    g_ours = torch.Generator().manual_seed(5)
    for _epoch in range(2):
        expected = list(
            BatchSampler(
                RandomSampler(range(n), num_samples=num_samples, generator=g_torch), 3, drop_last
            )
        )
        batches = array_index_batches(
            BatchSampler(
                RandomSampler(range(n), num_samples=num_samples, generator=g_ours), 3, drop_last
            )
        )
        assert batches is not None
        assert [b.tolist() for b in batches] == expected
        assert torch.equal(g_ours.get_state(), g_torch.get_state())


def test_draws_happen_when_torch_draws_them() -> None:
    # The permutation is drawn at the first batch, not when iter() is called.
    g = torch.Generator().manual_seed(0)
    batches = array_index_batches(BatchSampler(RandomSampler(range(6), generator=g), 4, False))
    assert batches is not None
    state = g.get_state()
    first = next(batches)
    assert not torch.equal(g.get_state(), state)
    assert len(first) == 4
    assert len(list(itertools.chain([first], batches))) == 2


def test_other_samplers_are_left_to_torch() -> None:
    class MySampler(RandomSampler):
        pass

    assert array_index_batches(BatchSampler(MySampler(range(4)), 2, False)) is None
    assert (
        array_index_batches(BatchSampler(RandomSampler(range(4), replacement=True), 2, False))
        is None
    )
    assert array_index_batches([[0, 1], [2, 3]]) is None
