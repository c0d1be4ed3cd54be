"""Elastic resume: a state taken on 4 ranks resumes on 2, 3 and 6 (ranks
simulated through RANK/WORLD_SIZE, run in turn in this process), and over
both parts every sample of the epoch is delivered once, with the same
batch count on every rank; for map-style data (chute.loader.elastic_sampler) and streams
(WebDataset(elastic=True), chute.wds.elastic_stream)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chute
import h5py
import numpy as np
import pytest
from chute.loader.elastic_sampler import Segment
from conftest import tiny_samples, write_shards
from helpers import assert_equal_batch_counts, counts, keys, run_ranks

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

N = 103  # rows of the map-style datasets
B = 5


# -- map-style ---------------------------------------------------------------------


def write_h5(path: Path) -> str:
    with h5py.File(path, "w") as f:
        f.create_dataset("y", data=np.arange(N, dtype=np.int64), chunks=(8,), compression="gzip")
    return str(path)


@pytest.fixture(scope="module")
def map_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("elastic_map")
    samples = tiny_samples(N, dim=4)
    urls = write_shards(root / "tar", samples, per_shard=20)
    return {
        "array": (chute.ArrayDataset(y=np.arange(N, dtype=np.int64)), lambda b: b["y"].tolist()),
        "h5": (
            chute.H5Dataset(write_h5(root / "rows.h5"), fields=["y"]),
            lambda b: b["y"].tolist(),
        ),
        "tar": (chute.TarDataset(urls, fields=("__key__", "cls")), lambda b: list(b[0])),
    }


def map_loader(dataset: Any, shuffle: bool = True, drop_last: bool = False, seed: int = 3):
    return lambda: chute.DataLoader(
        dataset, batch_size=B, distributed=True, shuffle=shuffle, seed=seed, drop_last=drop_last
    )


@pytest.mark.parametrize("kind", ["array", "h5", "tar"])
@pytest.mark.parametrize("world", [2, 3, 6])
def test_map_style_resumes_on_another_world_size(monkeypatch, map_datasets, kind, world):
    dataset, ids = map_datasets[kind]
    make = map_loader(dataset)
    first, states = run_ranks(monkeypatch, 4, make, ids, batches=3)
    # Every rank computes the same global position: 3 batches of 5 on 4 ranks.
    assert all(s["elastic"] == states[0]["elastic"] for s in states)
    assert states[0]["elastic"]["consumed"] == 60
    second, _ = run_ranks(monkeypatch, world, make, ids, state=states[0])
    seen = counts(first, second)
    assert len(seen) == N and set(seen.values()) == {1}  # each sample exactly once
    remaining = N - 60
    assert_equal_batch_counts(second, -(-remaining // (world * B)))
    assert all(0 < len(b) <= B for rank in second for b in rank)
    # The first part is DistributedSampler's prefix: 60 distinct samples.
    assert sum(counts(first).values()) == len(counts(first)) == 60


def test_map_style_same_world_size_continues_the_run(monkeypatch):
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    ids = lambda b: b["y"].tolist()  # noqa: E731
    make = map_loader(ds)
    whole, _ = run_ranks(monkeypatch, 4, make, ids)
    first, states = run_ranks(monkeypatch, 4, make, ids, batches=3)
    rest, _ = run_ranks(monkeypatch, 4, make, ids, state=states[0])
    assert [a + b for a, b in zip(first, rest, strict=True)] == whole
    # A resumed segment continues on its own world size the same way.
    moved, moved_states = run_ranks(monkeypatch, 3, make, ids, state=states[0], batches=2)
    uninterrupted, _ = run_ranks(monkeypatch, 3, make, ids, state=states[0])
    after, _ = run_ranks(monkeypatch, 3, make, ids, state=moved_states[0])
    assert [a + b for a, b in zip(moved, after, strict=True)] == uninterrupted


def test_map_style_chained_resumes(monkeypatch):
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    ids = lambda b: b["y"].tolist()  # noqa: E731
    make = map_loader(ds)
    a, s1 = run_ranks(monkeypatch, 4, make, ids, batches=2)
    b, s2 = run_ranks(monkeypatch, 3, make, ids, state=s1[0], batches=2)
    assert s2[0]["elastic"]["consumed"] == 40 + 30
    c, _ = run_ranks(monkeypatch, 6, make, ids, state=s2[0])
    seen = counts(a, b, c)
    assert len(seen) == N and set(seen.values()) == {1}


def test_map_style_last_round_with_fewer_samples_than_ranks(monkeypatch):
    # 23 remain for 6 ranks of batch 2: rounds of 12 and 11 — the last
    # round has samples for every rank, shorter batches only at the end.
    assert Segment(103, 80, 6, 2, False).round_sizes() == ([12, 11], 0)
    # 13 remain for 6 ranks of batch 2: 12 + 1 would leave five ranks
    # without a last batch; the round before gives it what it lacks.
    assert Segment(103, 90, 6, 2, False).round_sizes() == ([7, 6], 0)
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    ids = lambda b: b["y"].tolist()  # noqa: E731
    make = lambda: chute.DataLoader(ds, batch_size=2, distributed=True, seed=1)  # noqa: E731
    first, states = run_ranks(monkeypatch, 5, make, ids, batches=9)
    assert states[0]["elastic"]["consumed"] == 90
    second, _ = run_ranks(monkeypatch, 6, make, ids, state=states[0])
    assert_equal_batch_counts(second, 2)
    assert [len(b) for rank in second for b in rank] == [2, 1] + [1, 1] * 5
    seen = counts(first, second)
    assert len(seen) == N and set(seen.values()) == {1}


def test_map_style_pads_only_when_fewer_samples_remain_than_ranks(monkeypatch):
    # 3 samples left for 6 ranks: ranks 3..5 repeat the segment's first three,
    # as DistributedSampler pads; nothing else repeats.
    assert Segment(103, 100, 6, 4, False).round_sizes() == ([3], 3)
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    ids = lambda b: b["y"].tolist()  # noqa: E731
    make = lambda: chute.DataLoader(ds, batch_size=4, distributed=True, seed=1)  # noqa: E731
    first, states = run_ranks(monkeypatch, 5, make, ids, batches=5)
    second, _ = run_ranks(monkeypatch, 6, make, ids, state=states[0])
    assert_equal_batch_counts(second, 1)
    seen = counts(first, second)
    assert len(seen) == N
    assert sorted(seen.values()) == [1] * (N - 3) + [2] * 3
    assert [b for rank in second[3:] for b in rank] == [b for rank in second[:3] for b in rank]


def test_map_style_drop_last_drops_the_tail_and_repeats_nothing(monkeypatch):
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    ids = lambda b: b["y"].tolist()  # noqa: E731
    make = map_loader(ds, drop_last=True)
    first, states = run_ranks(monkeypatch, 4, make, ids, batches=2)
    for world in (3, 6):
        second, _ = run_ranks(monkeypatch, world, make, ids, state=states[0])
        full_rounds = (N - 40) // (world * B)
        assert_equal_batch_counts(second, full_rounds)
        assert all(len(b) == B for rank in second for b in rank)
        seen = counts(first, second)
        assert set(seen.values()) == {1} and len(seen) == 40 + full_rounds * world * B


def test_curriculum_resumes_elastically(monkeypatch):
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    ids = lambda b: b["y"].tolist()  # noqa: E731

    def make() -> Any:
        groups = {"low": np.arange(40), "high": np.arange(40, N)}
        sampler = chute.Curriculum(groups, {"low": 1, "high": 3}, 80, replacement=False, seed=2)
        return chute.DataLoader(ds, batch_size=4, sampler=sampler)

    first, states = run_ranks(monkeypatch, 4, make, ids, batches=2)
    second, _ = run_ranks(monkeypatch, 3, make, ids, state=states[0])
    seen = counts(first, second)
    assert len(seen) == 80 and set(seen.values()) == {1}
    assert sum(i >= 40 for i in seen) == 60
    assert_equal_batch_counts(second, -(-(80 - 32) // 12))


def test_map_style_state_refusals(monkeypatch):
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    loader = map_loader(ds)()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="another order"):
        map_loader(ds, seed=4)().load_state_dict(state)
    with pytest.raises(ValueError, match="another order"):
        map_loader(ds, shuffle=False)().load_state_dict(state)
    with pytest.raises(ValueError, match="another batch size"):
        chute.DataLoader(ds, batch_size=B + 1, distributed=True, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="deals no global order"):
        chute.DataLoader(ds, batch_size=B).load_state_dict(state)
    with pytest.raises(ValueError, match="another dataset"):
        other = chute.ArrayDataset(y=np.arange(N + 1, dtype=np.int64))
        map_loader(other)().load_state_dict(state)
    broken = dict(state, elastic=dict(state["elastic"], world_size=0))
    with pytest.raises(ValueError, match="world_size"):
        map_loader(ds)().load_state_dict(broken)


# -- streams -----------------------------------------------------------------------

SAMPLES = 203  # in shards of 17: 12 shards, the last one of 16


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("elastic_stream"), tiny_samples(SAMPLES, dim=4), 17)


def stream(
    urls: list[str],
    buffer: int = 0,
    shardshuffle: bool = True,
    batch: int = B,
    partial: bool = True,
    **kwargs: Any,
) -> Callable[[], Any]:
    def make() -> Any:
        ds = chute.WebDataset(urls, shardshuffle=shardshuffle, seed=5, elastic=True, **kwargs)
        if buffer:
            ds = ds.shuffle(buffer, initial=buffer // 2)
        return ds.to_tuple("__key__").batched(batch, partial=partial)

    return make


STREAM_CASES = {
    "in_order": dict(shardshuffle=False),
    "shard_shuffle": dict(),
    "shuffle_buffer": dict(buffer=20),
    # A byte budget of a few samples: the buffer lets samples out early.
    "buffer_byte_budget": dict(buffer=20, shuffle_max_bytes=1500),
}


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
@pytest.mark.parametrize("world", [2, 3, 6])
def test_stream_resumes_on_another_world_size(monkeypatch, shards, case, world):
    make = stream(shards, **STREAM_CASES[case])
    first, states = run_ranks(monkeypatch, 4, make, keys, batches=3)
    assert all(s["elastic"] == states[0]["elastic"] for s in states)
    assert_equal_batch_counts(first, 3)
    second, _ = run_ranks(monkeypatch, world, make, keys, state=states[0])
    seen = counts(first, second)
    # 143 samples remain; for 2, 3 and 6 ranks of batch 5 every rank's last
    # batch has a sample of its own, so nothing repeats.
    assert len(seen) == SAMPLES and set(seen.values()) == {1}
    assert_equal_batch_counts(second, -(-(SAMPLES - 60) // (world * B)))


@pytest.mark.parametrize("case", ["in_order", "shuffle_buffer", "buffer_byte_budget"])
def test_stream_same_world_size_continues_the_run(monkeypatch, shards, case):
    make = stream(shards, **STREAM_CASES[case])
    whole, _ = run_ranks(monkeypatch, 4, make, keys)
    first, states = run_ranks(monkeypatch, 4, make, keys, batches=3)
    rest, _ = run_ranks(monkeypatch, 4, make, keys, state=states[0])
    assert [a + b for a, b in zip(first, rest, strict=True)] == whole


def test_stream_chained_resumes_with_a_shuffle_buffer(monkeypatch, shards):
    make = stream(shards, buffer=30, shuffle_max_bytes=2000)
    a, s1 = run_ranks(monkeypatch, 4, make, keys, batches=3)
    b, s2 = run_ranks(monkeypatch, 3, make, keys, state=s1[0], batches=2)
    # The buffers still held samples: the remaining samples are not one span.
    assert len(s2[0]["elastic"]["remaining"]) > 2
    c, _ = run_ranks(monkeypatch, 5, make, keys, state=s2[0])
    seen = counts(a, b, c)
    assert len(seen) == SAMPLES and set(seen.values()) == {1}
    assert_equal_batch_counts(c, len(c[0]))


def test_stream_fresh_epoch_pads_a_rank_only_when_its_last_batch_would_be_empty(
    monkeypatch, shards
):
    # 203 samples, 4 ranks of batch 10: 5 full rounds leave 3 samples, one for
    # each of ranks 0..2; rank 3 reads the epoch's first sample again.
    make = stream(shards, batch=10)
    whole, _ = run_ranks(monkeypatch, 4, make, keys)
    assert_equal_batch_counts(whole, 6)
    assert [len(rank[-1]) for rank in whole] == [1, 1, 1, 1]
    seen = counts(whole)
    assert len(seen) == SAMPLES
    assert [k for k, v in seen.items() if v > 1] == [whole[0][0][0]]


def test_stream_without_partial_batches_drops_the_tail(monkeypatch, shards):
    make = stream(shards, buffer=20, partial=False)
    first, states = run_ranks(monkeypatch, 4, make, keys, batches=3)
    second, _ = run_ranks(monkeypatch, 3, make, keys, state=states[0])
    assert_equal_batch_counts(second, (SAMPLES - 60) // 15)
    seen = counts(first, second)
    assert set(seen.values()) == {1} and len(seen) == 60 + 9 * 15


def test_stream_epoch_finished_before_the_resume(monkeypatch, shards):
    make = stream(shards)
    whole, states = run_ranks(monkeypatch, 2, make, keys, batches=21)
    assert states[0]["elastic"]["remaining"] == []
    rest, _ = run_ranks(monkeypatch, 3, make, keys, state=states[0])
    assert rest == [[], [], []]
    assert len(counts(whole)) == SAMPLES


def test_stream_in_a_dataloader_resumes_elastically(monkeypatch, shards):
    def make() -> Any:
        ds = chute.WebDataset(shards, shardshuffle=True, seed=5, elastic=True).shuffle(10)
        return chute.DataLoader(ds.to_tuple("__key__"), batch_size=4, num_workers=2)

    ids = lambda b: list(b[0])  # noqa: E731
    first, states = run_ranks(monkeypatch, 2, make, ids, batches=5)
    assert states[0]["dataset"]["elastic"] == states[1]["dataset"]["elastic"]
    second, _ = run_ranks(monkeypatch, 3, make, ids, state=states[0])
    seen = counts(first, second)
    assert len(seen) == SAMPLES and set(seen.values()) == {1}
    assert_equal_batch_counts(second, -(-(SAMPLES - 40) // 12))


def test_stream_elastic_builds_missing_indexes(monkeypatch, tmp_path):
    urls = write_shards(tmp_path, tiny_samples(30, dim=4), per_shard=10)
    assert not list(tmp_path.glob("*.idx.json"))
    delivered, _ = run_ranks(monkeypatch, 2, stream(urls), keys)
    assert len(counts(delivered)) == 30
    assert len(list(tmp_path.glob("*.idx.json"))) == 3


def test_stream_state_refusals(monkeypatch, shards):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    ds = stream(shards, buffer=20)()
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="elastic=True, this pipeline has elastic=False"):
        (
            chute.WebDataset(shards, shardshuffle=True, seed=5)
            .shuffle(20, initial=10)
            .to_tuple("__key__")
            .batched(B)
            .load_state_dict(state)
        )
    other_initial = (
        chute.WebDataset(shards, shardshuffle=True, seed=5, elastic=True)
        .shuffle(20, initial=3)
        .to_tuple("__key__")
        .batched(B)
    )
    with pytest.raises(ValueError, match=r"another pipeline: stages \['shuffle\(20, initial=10\)"):
        other_initial.load_state_dict(state)
    other_seed = stream(shards, buffer=20)()
    other_seed.seed = 6
    with pytest.raises(ValueError, match="taken with seed 5; this dataset has seed 6"):
        other_seed.load_state_dict(state)
    tampered = stream(shards, buffer=20)()
    tampered.load_state_dict(dict(state, elastic=dict(state["elastic"], remaining=[0, 1])))
    with pytest.raises(ValueError, match="does not match this pipeline"):
        next(iter(tampered))


def test_stream_elastic_refuses_pipelines_it_cannot_place(shards):
    with pytest.raises(ValueError, match="the engine must batch"):
        next(iter(chute.WebDataset(shards, shardshuffle=False, seed=1, elastic=True)))
    with pytest.raises(ValueError, match="streams must be 1"):
        next(iter(stream(shards, streams=2)()))
    with pytest.raises(ValueError, match="neither a local file nor a remote url"):
        next(iter(stream(["pipe:cat " + shards[0]])()))


# -- a real DDP run --------------------------------------------------------------


def torchrun(script: Path, nproc: int, *args: str) -> None:
    env = dict(os.environ)
    package_root = str(Path(chute.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_torchrun_state_from_two_ranks_resumes_on_three(tmp_path):
    urls = write_shards(tmp_path / "shards", tiny_samples(90, dim=4), per_shard=10)
    (tmp_path / "urls.json").write_text(json.dumps(urls))
    script = Path(__file__).parent / "ddp" / "ddp_elastic.py"
    torchrun(script, 2, str(tmp_path), "save")
    torchrun(script, 3, str(tmp_path), "resume")
    saved = [json.loads((tmp_path / f"save{r}.json").read_text()) for r in range(2)]
    resumed = [json.loads((tmp_path / f"resume{r}.json").read_text()) for r in range(3)]
    assert saved[0]["positions"] == saved[1]["positions"]  # rank 0 alone may save it
    assert saved[0]["positions"]["rows"]["consumed"] == 5 * 4 * 2
    for key, total in (("rows", 101), ("stream", 90)):
        parts = [[r[key] for r in saved], [r[key] for r in resumed]]
        seen = counts(*parts)
        assert len(seen) == total and set(seen.values()) == {1}, key
        assert len({len(r[key]) for r in resumed}) == 1  # equal batch counts
