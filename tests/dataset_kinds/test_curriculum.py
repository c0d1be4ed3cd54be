"""chute.Curriculum and chute.MixedDataset: schedules take effect at set_epoch,
draws are reproducible from (seed, epoch), ranks split one draw disjointly."""

from __future__ import annotations

import chute
import numpy as np
import pytest
import torch
import torch.utils.data

EASY = np.arange(0, 100)
HARD = np.arange(100, 1000)


def ramp(epoch: int) -> dict[str, float]:
    hard = min(1.0, epoch / 4)
    return {"easy": 1.0 - hard, "hard": hard}


def share_of_easy(indices: list[int]) -> float:
    a = np.asarray(indices)
    return float(np.mean(a < 100))


def test_weights_take_effect_at_set_epoch():
    c = chute.Curriculum({"easy": EASY, "hard": HARD}, ramp, num_samples=20000, seed=3)
    measured = []
    for epoch in range(5):
        c.set_epoch(epoch)
        measured.append(share_of_easy(list(c)))
    # Binomial std of 20000 draws is <= 0.0036: 0.02 is > 5 sigma.
    for epoch, share in enumerate(measured):
        assert share == pytest.approx(1.0 - min(1.0, epoch / 4), abs=0.02), (epoch, measured)
    # Members of a group are drawn uniformly: every easy index shows up at epoch 0.
    c.set_epoch(0)
    counts = np.bincount(np.asarray(list(c)), minlength=1000)
    assert counts[100:].sum() == 0
    assert counts[:100].min() > 100  # expected 200 each


def test_schedule_forms():
    groups = {"a": [0, 1], "b": [2, 3]}
    listed = chute.Curriculum(groups, [{"a": 1}, {"b": 1}], num_samples=50)
    assert set(listed) <= {0, 1}
    listed.set_epoch(7)  # past the end: the last entry holds
    assert set(listed) <= {2, 3}
    piecewise = chute.Curriculum(groups, {0: {"a": 1}, 3: {"a": 1, "b": 1}}, num_samples=50)
    piecewise.set_epoch(2)
    assert set(piecewise) <= {0, 1}
    piecewise.set_epoch(3)
    assert set(piecewise) == {0, 1, 2, 3}
    constant = chute.Curriculum(groups, {"b": 2.0}, num_samples=10)
    assert set(constant) <= {2, 3}
    assert constant.weights() == {"a": 0.0, "b": 1.0}


def test_label_array_groups():
    labels = np.array([2, 0, 2, 1, 0, 2])
    c = chute.Curriculum(labels, {2: 1.0}, num_samples=30, seed=1)
    assert set(c) == {0, 2, 5}
    assert list(c.groups) == [0, 1, 2]
    np.testing.assert_array_equal(c.groups[0], [1, 4])
    c2 = chute.Curriculum(torch.tensor(labels), {0: 1, 1: 1}, num_samples=30)
    assert set(c2) <= {1, 3, 4}


def test_reproducible_from_seed_and_epoch():
    def draw(seed: int, epoch: int) -> list[int]:
        c = chute.Curriculum({"easy": EASY, "hard": HARD}, ramp, num_samples=500, seed=seed)
        c.set_epoch(epoch)
        return list(c)

    assert draw(0, 2) == draw(0, 2)
    assert draw(0, 2) != draw(1, 2)
    assert draw(0, 2) != draw(0, 3)
    # seed and epoch are separate words of the seed: (0, 1) is not (1, 0).
    assert draw(0, 1) != draw(1, 0)
    # Unaffected by torch's and numpy's global generators.
    torch.manual_seed(123)
    np.random.seed(5)
    a = draw(4, 1)
    torch.manual_seed(999)
    np.random.seed(6)
    assert a == draw(4, 1)


def test_without_replacement_exact_counts():
    c = chute.Curriculum(
        {"easy": EASY, "hard": HARD},
        {"easy": 0.3, "hard": 0.7},
        num_samples=301,
        replacement=False,
        seed=2,
    )
    order = list(c)
    assert len(order) == 301 and len(set(order)) == 301
    # round(90.3) = 90 easy, 211 hard (largest remainder gives the extra one to hard).
    assert sum(i < 100 for i in order) == 90
    c.set_epoch(1)
    assert list(c) != order
    too_many = chute.Curriculum(
        {"easy": EASY, "hard": HARD}, {"easy": 1}, num_samples=101, replacement=False
    )
    with pytest.raises(ValueError, match=r"group 'easy' for 101 of 101 samples but it has 100"):
        list(too_many)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ddp_ranks_split_one_draw(world, drop_last):
    n = 1001
    kwargs = dict(groups={"easy": EASY, "hard": HARD}, schedule=ramp, num_samples=n, seed=7)
    full = chute.Curriculum(**kwargs)
    full.set_epoch(2)
    order = full.global_order()
    parts = []
    for rank in range(world):
        c = chute.Curriculum(**kwargs, num_replicas=world, rank=rank, drop_last=drop_last)
        c.set_epoch(2)
        parts.append(list(c))
    lengths = {len(p) for p in parts}
    assert len(lengths) == 1 and lengths.pop() == len(parts[0])
    per_rank = n // world if drop_last else -(-n // world)
    assert len(parts[0]) == per_rank
    # Positions of the draw are dealt round-robin: disjoint, and together
    # the draw (truncated, or padded from its start).
    interleaved = [parts[r][i] for i in range(per_rank) for r in range(world)]
    expected = order[: per_rank * world] if drop_last else np.resize(order, per_rank * world)
    assert interleaved == expected.tolist()


def test_ddp_defaults_from_env(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    c = chute.Curriculum({"a": np.arange(10)}, {"a": 1}, num_samples=10)
    assert (c.rank, c.num_replicas, len(c)) == (3, 4, 3)


def test_errors():
    groups = {"a": [0, 1], "b": [2]}
    with pytest.raises(ValueError, match="unknown group"):
        chute.Curriculum(groups, {"c": 1})
    with pytest.raises(ValueError, match="all group weights are 0"):
        chute.Curriculum(groups, {"a": 0})
    with pytest.raises(ValueError, match="weight of group 'a' is -1"):
        chute.Curriculum(groups, {"a": -1, "b": 1})
    with pytest.raises(ValueError, match="no entry at or before epoch 0"):
        chute.Curriculum(groups, {2: {"a": 1}})
    with pytest.raises(ValueError, match="num_samples"):
        chute.Curriculum(groups, {"a": 1}, num_samples=0)
    with pytest.raises(ValueError, match="1-D integer"):
        chute.Curriculum({"a": [0.5]}, {"a": 1})
    with pytest.raises(ValueError, match="rank 2 is not in"):
        chute.Curriculum(groups, {"a": 1}, num_replicas=2, rank=2)
    bad_late = chute.Curriculum(groups, lambda e: {"a": 1} if e == 0 else {"zzz": 1})
    bad_late.set_epoch(1)
    with pytest.raises(ValueError, match="epoch 1 names unknown group"):
        list(bad_late)


def table(n: int, offset: int) -> chute.ArrayDataset:
    return chute.ArrayDataset(
        x=np.arange(offset, offset + n, dtype=np.int64),
        v=np.arange(offset, offset + n, dtype=np.float32)[:, None].repeat(3, 1),
    )


@pytest.mark.parametrize("loader_cls", [chute.DataLoader, torch.utils.data.DataLoader])
def test_curriculum_as_sampler_of_both_loaders(loader_cls):
    ds = table(1000, 0)
    c = chute.Curriculum({"easy": EASY, "hard": HARD}, ramp, num_samples=4000, seed=1)
    loader = loader_cls(ds, batch_size=64, sampler=c)
    assert len(loader) == 63
    for epoch in (0, 4):
        if isinstance(loader, chute.DataLoader):
            loader.set_epoch(epoch)  # reaches loader.sampler
        else:
            c.set_epoch(epoch)
        seen = torch.cat([b["x"] for b in loader]).tolist()
        c.set_epoch(epoch)
        assert seen == list(c)
        assert share_of_easy(seen) == pytest.approx(1.0 - epoch / 4, abs=0.03)


def test_mixed_dataset_concatenation_and_mixing():
    a, b = table(50, 0), table(500, 10000)
    mixed = chute.MixedDataset({"a": a, "b": b})
    assert len(mixed) == 550
    assert mixed.ranges() == {"a": range(0, 50), "b": range(50, 550)}
    assert int(mixed[49]["x"]) == 49 and int(mixed[50]["x"]) == 10000
    assert int(mixed[-1]["x"]) == 10499
    with pytest.raises(IndexError):
        mixed[550]
    sampler = mixed.curriculum([{"a": 1, "b": 1}, {"a": 0, "b": 1}], num_samples=4000, seed=5)
    loader = chute.DataLoader(mixed, batch_size=100, sampler=sampler, num_workers=2)
    batches = list(loader)
    x = torch.cat([bt["x"] for bt in batches])
    # Order is the sampler's, rows mapped through the concatenation.
    expected = [i if i < 50 else 10000 + i - 50 for i in sampler]
    assert x.tolist() == expected
    torch.testing.assert_close(torch.cat([bt["v"] for bt in batches])[:, 0], x.float())
    # Equal mixing although a is 10x smaller.
    assert float((x < 50).float().mean()) == pytest.approx(0.5, abs=0.03)
    loader.set_epoch(1)
    assert int((torch.cat([bt["x"] for bt in loader]) < 50).sum()) == 0
    # torch's loader over the same dataset (its __getitems__) agrees.
    sampler.set_epoch(0)
    ref = torch.utils.data.DataLoader(mixed, batch_size=100, sampler=sampler)
    ref_x = torch.cat([bt["x"] for bt in ref])
    assert ref_x.tolist() == expected


def test_mixed_dataset_errors():
    with pytest.raises(TypeError, match="not a chute map-style dataset"):
        chute.MixedDataset([table(3, 0), [1, 2, 3]])
    other = chute.ArrayDataset(y=np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="has fields"):
        chute.MixedDataset([table(3, 0), other])
    narrow = chute.ArrayDataset(x=np.zeros(3, dtype=np.int64), v=np.zeros((3, 2), np.float32))
    mixed = chute.MixedDataset([table(3, 0), narrow])
    with pytest.raises(ValueError, match="field 'v'"):
        mixed.__getitems__([0, 4])


def test_mixed_dataset_of_array_and_h5(tmp_path):
    import h5py

    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(8, 3), compression="gzip", shuffle=True)
        f.create_dataset("y", data=np.arange(100, 140, dtype=np.int64))
    a = chute.ArrayDataset(x=-x[:10], y=np.arange(10, dtype=np.int64))
    b = chute.H5Dataset(str(tmp_path / "b.h5"), fields=["x", "y"])
    mixed = chute.MixedDataset([a, b])
    sampler = mixed.curriculum({0: 1, 1: 1}, num_samples=200, seed=3)
    ours = list(chute.DataLoader(mixed, batch_size=16, sampler=sampler, num_workers=2))
    ref = torch.utils.data.ConcatDataset([a, b])
    theirs = list(torch.utils.data.DataLoader(ref, batch_size=16, sampler=list(sampler)))
    assert len(ours) == len(theirs) == 13
    for o, t in zip(ours, theirs, strict=True):
        assert torch.equal(o["x"], t["x"]) and torch.equal(o["y"], t["y"])
    assert mixed.stats()["samples_yielded"] == 200


def test_a_curriculum_resumed_with_another_schedule_or_seed_is_refused():
    mixed = chute.MixedDataset({"a": table(70, 0), "b": table(30, 1000)})

    def loader(schedule: object, seed: int = 1) -> chute.DataLoader:
        sampler = mixed.curriculum(schedule, num_samples=60, seed=seed)
        return chute.DataLoader(mixed, batch_size=4, sampler=sampler)

    def rows(batches: object) -> list[int]:
        return [int(x) for b in batches for x in b["x"]]

    first = loader([{"a": 0.7, "b": 0.3}, {"a": 0.5, "b": 0.5}])
    it = iter(first)
    head = rows([next(it) for _ in range(3)])
    state = first.state_dict()
    whole = rows(loader({"a": 0.7, "b": 0.3}))
    # The same draw (a schedule changed for later epochs only): the rest of it.
    for schedule in ({"a": 0.7, "b": 0.3}, {0: {"a": 0.7, "b": 0.3}, 1: {"a": 1, "b": 0}}):
        again = loader(schedule)
        again.load_state_dict(state)
        assert head + rows(again) == whole
    for other, seed in (({"a": 0.2, "b": 0.8}, 1), ({"a": 0.7, "b": 0.3}, 2)):
        with pytest.raises(ValueError, match=r"another order of its epoch .* the weights changed"):
            loader(other, seed).load_state_dict(state)
