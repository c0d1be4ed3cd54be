"""chute.mix: exact, deterministic, per-epoch weighted mixing of map-style
datasets (per sample, MixedDataset) and of streams (per batch,
MixedStream), resumable mid-epoch and elastic under DDP."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import chute
import numpy as np
import pytest
import torch
from chute import _core
from conftest import tiny_samples, write_shards
from helpers import assert_equal_batch_counts, counts, run_ranks

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

A, B_ROWS = 70, 30  # rows of the two map-style sources


def sources() -> tuple[chute.ArrayDataset, chute.ArrayDataset]:
    return (
        chute.ArrayDataset(y=np.arange(0, A, dtype=np.int64)),
        chute.ArrayDataset(y=np.arange(1000, 1000 + B_ROWS, dtype=np.int64)),
    )


def prefix_deviation(labels: np.ndarray, weights: list[float]) -> float:
    """The largest |count_i(prefix) - len(prefix) * w_i| over every prefix."""
    onehot = np.eye(len(weights))[labels]
    taken = onehot.cumsum(axis=0)
    ideal = np.arange(1, labels.size + 1)[:, None] * np.asarray(weights)[None, :]
    return float(np.abs(taken - ideal).max())


# -- per-sample mixing of map-style datasets -------------------------------------------


def test_map_style_mix_has_exact_counts_and_smooth_prefixes():
    a, b = sources()
    mixed = chute.mix([a, b], weights=[0.7, 0.3], seed=4)
    assert isinstance(mixed, chute.MixedDataset)
    # Default epoch: the most samples with no source repeating one: all 100.
    assert mixed.counts(0) == {0: 70, 1: 30}
    order = mixed.global_order(0)
    from_b = order >= A
    assert int(from_b.sum()) == 30
    assert sorted(order[~from_b].tolist()) == list(range(A))  # each sample once
    assert prefix_deviation(from_b.astype(int), [0.7, 0.3]) <= 0.5 + 1e-9
    # Deterministic from (seed, epoch); another epoch or seed draws anew.
    assert np.array_equal(order, chute.mix([a, b], [0.7, 0.3], seed=4).global_order(0))
    assert not np.array_equal(order, mixed.global_order(1))
    assert not np.array_equal(order, chute.mix([a, b], [0.7, 0.3], seed=5).global_order(0))
    # The sources follow the schedule the engine computes for these counts.
    assert np.array_equal(from_b.astype(np.int32), _core.mix_schedule([70, 30], 0, 100))


def test_map_style_mix_weights_per_epoch_and_oversampling():
    a, b = sources()
    mixed = chute.mix(
        {"a": a, "b": b}, weights=[{"a": 1, "b": 1}, {"a": 1, "b": 3}], num_samples=200, seed=1
    )
    assert mixed.counts(0) == {"a": 100, "b": 100}
    assert mixed.counts(5) == {"a": 50, "b": 150}  # the list's last entry holds on
    order = mixed.global_order(5)
    per_b = collections.Counter(order[order >= A].tolist())
    # b has 30 rows for 150 draws: every row 5 times (whole permutations in turn).
    assert set(per_b.values()) == {5} and len(per_b) == 30
    unshuffled = chute.mix({"a": a, "b": b}, {"a": 1, "b": 3}, num_samples=8, shuffle=False)
    # Without shuffling each source gives its rows in order (indices into
    # the concatenation: b's rows start at 70).
    assert unshuffled.global_order(0).tolist() == [70, 0, 71, 72, 73, 1, 74, 75]
    assert _core.mix_schedule([2, 6], 0, 8).tolist() == [1, 0, 1, 1, 1, 0, 1, 1]
    three = chute.mix([a, b, a], weights=[1, 1, 2], seed=2)
    labels = np.searchsorted(three.cumulative_sizes, three.global_order(0), side="right")
    assert prefix_deviation(labels, [0.25, 0.25, 0.5]) < 1


def test_map_style_mix_in_a_dataloader():
    a, b = sources()
    mixed = chute.mix([a, b], weights=[0.7, 0.3], seed=4)
    loader = chute.DataLoader(mixed, batch_size=8, num_workers=2)
    for epoch in (0, 3):
        loader.set_epoch(epoch)
        got = torch.cat([x["y"] for x in loader]).tolist()
        expected = [i if i < A else 1000 + i - A for i in mixed.global_order(epoch).tolist()]
        assert got == expected
    with pytest.raises(ValueError, match="orders its samples itself"):
        chute.DataLoader(mixed, batch_size=8, shuffle=True)
    # Without weights a MixedDataset is the plain concatenation it always was.
    plain = chute.MixedDataset([a, b])
    assert torch.cat([x["y"] for x in chute.DataLoader(plain, batch_size=50)]).tolist() == (
        list(range(A)) + list(range(1000, 1030))
    )


@pytest.mark.parametrize("world", [2, 3, 6])
def test_map_style_mix_resumes_elastically(monkeypatch, world):
    a, b = sources()
    mixed = chute.mix([a, b], weights=[0.7, 0.3], seed=4)

    def make() -> Any:
        return chute.DataLoader(mixed, batch_size=4, distributed=True)

    ids = lambda x: x["y"].tolist()  # noqa: E731
    first, states = run_ranks(monkeypatch, 4, make, ids, batches=3)
    assert all(s["elastic"] == states[0]["elastic"] for s in states)
    second, _ = run_ranks(monkeypatch, world, make, ids, state=states[0])
    seen = counts(first, second)
    assert len(seen) == 100 and set(seen.values()) == {1}
    assert_equal_batch_counts(second, -(-(100 - 48) // (world * 4)))
    # Over all ranks, each round of batches holds the mix's ratio: the
    # first part is the first 48 positions of the global order.
    order = mixed.global_order(2)
    assert sorted(counts(first)) == sorted(
        (i if i < A else 1000 + i - A) for i in order[:48].tolist()
    )


def mix_loader(sources: Any, weights: Any) -> chute.DataLoader:
    return chute.DataLoader(chute.mix(sources, weights, seed=4, num_samples=100), batch_size=8)


def ys(loader: chute.DataLoader) -> list[int]:
    return [y for batch in loader for y in batch["y"].tolist()]


def state_after(loader: chute.DataLoader, batches: int, epoch: int = 0) -> tuple[Any, list[int]]:
    loader.set_epoch(epoch)
    it = iter(loader)
    head = [y for batch in itertools.islice(it, batches) for y in batch["y"].tolist()]
    return loader.state_dict(), head


def test_a_map_style_mix_resumed_with_other_weights_or_order_is_refused():
    a, b = sources()
    state, head = state_after(mix_loader({"a": a, "b": b}, {"a": 0.7, "b": 0.3}), 3)
    loader = mix_loader({"a": a, "b": b}, {"a": 0.7, "b": 0.3})
    loader.load_state_dict(state)
    assert head + ys(loader) == ys(mix_loader({"a": a, "b": b}, {"a": 0.7, "b": 0.3}))
    # The same sources, names and epoch length: only the epoch's order differs.
    for sources_, weights in (
        ({"a": a, "b": b}, {"a": 0.3, "b": 0.7}),
        ({"b": b, "a": a}, {"a": 0.7, "b": 0.3}),
    ):
        with pytest.raises(ValueError, match=r"another order of its epoch .* the weights changed"):
            mix_loader(sources_, weights).load_state_dict(state)


def test_a_map_style_mix_resumes_in_a_later_epoch_of_its_schedule():
    a, b = sources()
    schedule = [{"a": 1, "b": 1}, {"a": 1, "b": 3}]
    state, head = state_after(mix_loader({"a": a, "b": b}, schedule), 2, epoch=1)
    # A schedule changed for epochs after the state's own is no reason to refuse it.
    later = {0: {"a": 1, "b": 1}, 1: {"a": 1, "b": 3}, 2: {"a": 5, "b": 1}}
    for weights in (schedule, later):
        loader = mix_loader({"a": a, "b": b}, weights)
        loader.load_state_dict(state)
        whole = mix_loader({"a": a, "b": b}, schedule)
        whole.set_epoch(1)
        assert head + ys(loader) == ys(whole)


def test_map_style_mix_errors():
    a, b = sources()
    with pytest.raises(ValueError, match="unknown dataset"):
        chute.mix({"a": a, "b": b}, weights={"a": 1, "c": 1})
    with pytest.raises(ValueError, match="all dataset weights are 0"):
        chute.mix([a, b], weights=[0, 0])
    with pytest.raises(ValueError, match="is -1"):
        chute.mix([a, b], weights=[1, -1])
    with pytest.raises(ValueError, match="3 weights for 2 sources"):
        chute.mix([a, b], weights=[1, 1, 1])


# -- per-batch mixing of streams ---------------------------------------------------------


@pytest.fixture(scope="module")
def stream_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("mix_streams")
    a = tiny_samples(60, dim=4)
    b = tiny_samples(45, seed=1, dim=4)
    for s in b:
        s["__key__"] = "b" + str(s["__key__"])
    return {
        "a": write_shards(root, a, per_shard=10, prefix="a"),
        "b": write_shards(root, b, per_shard=9, prefix="b"),
    }


def web(urls: list[str], seed: int, elastic: bool = True) -> Any:
    return (
        chute.WebDataset(urls, shardshuffle=True, seed=seed, elastic=elastic)
        .to_tuple("__key__")
        .batched(3)
    )


def stream_mix(shards: dict[str, list[str]], weights: Any = None) -> Any:
    return chute.mix(
        {"a": web(shards["a"], 1), "b": web(shards["b"], 2)},
        weights=weights if weights is not None else {"a": 2, "b": 1},
    )


def keys(batch: Any) -> list[str]:
    return list(batch[0])


def source_of(batch_keys: list[str]) -> int:
    return 1 if batch_keys[0].startswith("b") else 0


def test_stream_mix_follows_the_schedule_until_a_source_runs_out(stream_shards):
    mixed = stream_mix(stream_shards)
    assert isinstance(mixed, chute.MixedStream)
    batches = [keys(x) for x in mixed]
    labels = [source_of(k) for k in batches]
    assert labels == _core.mix_schedule([2, 1], 0, len(labels)).tolist()
    # a (20 batches of 3) runs out first: the epoch ends at its 21st turn.
    assert labels.count(0) == 20 and labels.count(1) == 10
    assert len({k for b in batches for k in b}) == 90
    # Per-epoch weights: epoch 1 weighs b three times as much.
    scheduled = stream_mix(stream_shards, weights=[{"a": 2, "b": 1}, {"a": 1, "b": 3}])
    first = [source_of(keys(x)) for x in scheduled]
    second = [source_of(keys(x)) for x in scheduled]
    assert first == labels
    assert second == _core.mix_schedule([1, 3], 0, len(second)).tolist()
    assert second.count(1) == 15  # b ran out


def test_stream_mix_weights_are_rationalised():
    from chute.datasets.mix_stream import rational_counts

    assert rational_counts([0.7, 0.3]) == [7, 3]
    assert rational_counts([1 / 3, 2 / 3]) == [1, 2]
    assert rational_counts([0.1 + 0.2, 0.7]) == [3, 7]
    with pytest.raises(ValueError, match="below 1/10000"):
        rational_counts([0.99999, 0.00001])


def test_stream_mix_resumes_mid_epoch(stream_shards):
    whole = [keys(x) for x in stream_mix(stream_shards)]
    mixed = stream_mix(stream_shards)
    it = iter(mixed)
    first = [keys(x) for x in itertools.islice(it, 7)]
    state = mixed.state_dict()
    assert state["steps"] == 7
    resumed = stream_mix(stream_shards)
    resumed.load_state_dict(state)
    assert first + [keys(x) for x in resumed] == whole
    with pytest.raises(ValueError, match="weighs its sources"):
        stream_mix(stream_shards, weights={"a": 1, "b": 1}).load_state_dict(state)


@pytest.mark.parametrize("world", [1, 3])
def test_stream_mix_resumes_elastically(monkeypatch, stream_shards, world):
    def make() -> Any:
        return stream_mix(stream_shards)

    first, states = run_ranks(monkeypatch, 2, make, keys, batches=4)
    second, _ = run_ranks(monkeypatch, world, make, keys, state=states[0])
    assert_equal_batch_counts(second, len(second[0]))
    seen = counts(first, second)
    assert set(seen.values()) == {1}  # no sample twice, over both parts
    # Every rank took its batches from the sources the schedule names.
    for rank in second:
        labels = [source_of(k) for k in rank]
        assert labels == _core.mix_schedule([2, 1], 4, 4 + len(labels)).tolist()


def test_mix_of_a_tar_dataset_and_a_stream_mixes_per_batch(tmp_path, stream_shards):
    rows = tiny_samples(24, seed=3, dim=4)
    for s in rows:
        s["__key__"] = "t" + str(s["__key__"])
    tar = chute.TarDataset(
        write_shards(tmp_path, rows, per_shard=8, prefix="t"), fields=("__key__",)
    )
    with pytest.raises(ValueError, match="give batch_size"):
        chute.mix([tar, web(stream_shards["a"], 1)], weights=[1, 1])
    mixed = chute.mix([tar, web(stream_shards["a"], 1)], weights=[1, 1], batch_size=3, seed=2)
    assert isinstance(mixed, chute.MixedStream)
    loader = chute.DataLoader(mixed, batch_size=None)
    batches = [list(x[0]) for x in loader]
    labels = [0 if b[0].startswith("t") else 1 for b in batches]
    assert labels[:16] == [0, 1] * 8  # 8 batches of the tar dataset, then it ran out
    assert len(labels) == 16
    assert sorted(k for b in batches if b[0].startswith("t") for k in b) == sorted(
        str(s["__key__"]) for s in rows
    )
    with pytest.raises(ValueError, match="batch_size=None"):
        next(iter(chute.DataLoader(mixed, batch_size=2)))


class _Refusing:
    """A mix source whose epoch cannot start."""

    def set_epoch(self, epoch: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def __iter__(self) -> Any:
        raise ValueError("this source cannot start")


def test_a_stream_mix_whose_source_cannot_start_stops_the_others(stream_shards, monkeypatch):
    # The conformance suite found it: the first source's iteration (its
    # engine threads) outlived the failed start, and the half-made epoch's
    # __del__ raised AttributeError ("Exception ignored in ...").
    import gc
    import sys

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    first = web(stream_shards["a"], 1)
    mixed = chute.mix({"a": first, "b": _Refusing()}, weights={"a": 1, "b": 1})
    with pytest.raises(ValueError, match="cannot start"):
        iter(mixed)
    assert first._live_iterations() == []
    gc.collect()
    assert unraisable == []
