"""state_dict()/load_state_dict(): a resumed run yields exactly the batches
the uninterrupted run would have."""

from __future__ import annotations

from itertools import islice
from typing import Any

import chute
import numpy as np
import pytest
import torch


def shuffled_pipeline(urls: list[str]) -> chute.WebDataset:
    return (
        chute.WebDataset(urls, shardshuffle=True, seed=11)
        .shuffle(300, initial=100)
        .decode()
        .to_tuple("__key__", "npy", "cls")
        .batched(48)
    )


def as_keys(batches: list[Any]) -> list[list[str]]:
    return [list(b[0]) for b in batches]


@pytest.mark.parametrize("stop_after", [0, 1, 7, 20])
def test_stream_resume_mid_epoch(tiny_shards: list[str], stop_after: int) -> None:
    full = list(shuffled_pipeline(tiny_shards))
    interrupted = shuffled_pipeline(tiny_shards)
    it = iter(interrupted)
    seen = list(islice(it, stop_after))
    state = interrupted.state_dict()
    del it
    resumed = shuffled_pipeline(tiny_shards)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert as_keys(seen + rest) == as_keys(full)
    np.testing.assert_array_equal(
        np.concatenate([b[1] for b in seen + rest]), np.concatenate([b[1] for b in full])
    )


def test_stream_resume_unbatched_rows(tiny_shards: list[str]) -> None:
    def build() -> chute.WebDataset:
        return (
            chute.WebDataset(tiny_shards, shardshuffle=False, seed=3)
            .shuffle(100)
            .to_tuple("__key__")
        )

    full = [k for (k,) in build()]
    first = build()
    it = iter(first)
    head = [k for (k,) in islice(it, 101)]  # stops inside the engine's second chunk
    state = first.state_dict()
    second = build()
    second.load_state_dict(state)
    assert head + [k for (k,) in second] == full


def test_stream_resume_through_dataloader(tiny_shards: list[str]) -> None:
    def loader() -> chute.DataLoader:
        return chute.DataLoader(shuffled_pipeline(tiny_shards), batch_size=None, num_workers=2)

    full = as_keys(list(loader()))
    a = loader()
    it = iter(a)
    head = as_keys(list(islice(it, 5)))
    state = a.state_dict()
    b = loader()
    b.load_state_dict(state)
    assert head + as_keys(list(b)) == full


def test_stream_state_names_the_next_epoch_between_epochs(tiny_shards: list[str]) -> None:
    ds = shuffled_pipeline(tiny_shards)
    list(ds)
    state = ds.state_dict()
    second_epoch = as_keys(list(ds))
    other = shuffled_pipeline(tiny_shards)
    other.load_state_dict(state)
    assert as_keys(list(other)) == second_epoch


def test_python_batching_cannot_checkpoint_mid_epoch(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .to_tuple("__key__")
        .map(lambda s: s)
        .batched(10)
    )
    it = iter(ds)
    next(it)
    with pytest.raises(ValueError, match="batched"):
        ds.state_dict()


@pytest.mark.parametrize("stop_after", [0, 3, 9])
def test_indexed_resume_matches_torch_order(stop_after: int) -> None:
    values = np.arange(1000, dtype=np.int64)
    ds = chute.ArrayDataset(x=values)

    def loader() -> chute.DataLoader:
        return chute.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(5)
        )

    full = [b["x"].tolist() for b in loader()]
    reference = [
        b["x"].tolist()
        for b in torch.utils.data.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(5)
        )
    ]
    assert full == reference
    a = loader()
    it = iter(a)
    head = [b["x"].tolist() for b in islice(it, stop_after)]
    state = a.state_dict()
    b = loader()
    b.load_state_dict(state)
    assert head + [x["x"].tolist() for x in b] == full


def test_resume_state_kind_mismatch(tiny_shards: list[str]) -> None:
    ds = chute.ArrayDataset(x=np.zeros((4, 2)))
    loader = chute.DataLoader(ds, batch_size=2)
    with pytest.raises(ValueError, match="stream"):
        loader.load_state_dict({"kind": "stream", "dataset": {}})
