"""chute.DataLoader against torch's DataLoader: the same batches for the same
arguments, the same argument errors, DistributedSampler's partition, and real
two-process runs under torchrun (gloo, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import chute
import chute.wds
import h5py
import numpy as np
import pytest
import torch
import torch.utils.data as tud

N = 37
DDP_DIR = Path(__file__).parent / "ddp"


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "x": rng.standard_normal((N, 5)).astype(np.float32),
        "y": np.arange(N, dtype=np.int64),
    }


@pytest.fixture(scope="module", params=["array", "h5"])
def dataset(request, tmp_path_factory):
    data = arrays()
    if request.param == "array":
        return chute.ArrayDataset(**data)
    path = tmp_path_factory.mktemp("h5") / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data["x"], chunks=(8, 5), compression="gzip")
        f.create_dataset("y", data=data["y"])
    return chute.H5Dataset(str(path), fields=["x", "y"])


def assert_same_batches(chute_loader, torch_loader):
    ours, theirs = list(chute_loader), list(torch_loader)
    assert len(ours) == len(theirs) == len(chute_loader) == len(torch_loader)
    for a, b in zip(ours, theirs, strict=True):
        assert sorted(a) == sorted(b)
        for key in b:
            assert a[key].dtype == b[key].dtype
            assert torch.equal(a[key], b[key]), key


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


CASES = {
    "sequential": lambda: dict(batch_size=4),
    "sequential_drop_last": lambda: dict(batch_size=4, drop_last=True),
    "shuffle_generator": lambda: dict(batch_size=5, shuffle=True, generator=gen(5)),
    "shuffle_generator_drop_last": lambda: dict(
        batch_size=6, shuffle=True, drop_last=True, generator=gen(9)
    ),
    "weighted": lambda: dict(
        batch_size=4,
        sampler=tud.WeightedRandomSampler(
            torch.linspace(0.1, 1, N), num_samples=50, generator=gen(2)
        ),
    ),
    "subset_random": lambda: dict(
        batch_size=3, sampler=tud.SubsetRandomSampler(list(range(3, 30, 2)), generator=gen(4))
    ),
    "batch_sampler": lambda: dict(
        batch_sampler=tud.BatchSampler(tud.SequentialSampler(range(N)), 6, drop_last=False)
    ),
    "batch_sampler_list": lambda: dict(batch_sampler=[[3, 1, 2], [36, 0], [5]]),
    "generator_without_shuffle": lambda: dict(batch_size=7, generator=gen(1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_batches_as_torch(dataset, case):
    # Each loader gets its own, identically seeded sampler/generator objects.
    assert_same_batches(
        chute.DataLoader(dataset, **CASES[case]()), tud.DataLoader(dataset, **CASES[case]())
    )


def test_shuffle_from_global_seed(dataset):
    torch.manual_seed(17)
    ours = list(chute.DataLoader(dataset, batch_size=8, shuffle=True))
    torch.manual_seed(17)
    theirs = list(tud.DataLoader(dataset, batch_size=8, shuffle=True))
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a["y"], b["y"])
    # Successive epochs of one loader continue the same generator stream.
    g1, g2 = gen(3), gen(3)
    ours_loader = chute.DataLoader(dataset, batch_size=8, shuffle=True, generator=g1)
    theirs_loader = tud.DataLoader(dataset, batch_size=8, shuffle=True, generator=g2)
    for _ in range(3):
        assert_same_batches(ours_loader, theirs_loader)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shuffle=True, sampler=tud.SequentialSampler(range(N))),
        dict(batch_size=2, batch_sampler=[[0, 1]]),
        dict(batch_sampler=[[0, 1]], drop_last=True),
        dict(batch_sampler=[[0, 1]], shuffle=True),
        dict(num_workers=-1),
        dict(prefetch_factor=2),
        dict(persistent_workers=True),
        dict(batch_size=None, drop_last=True),
        dict(timeout=-1),
    ],
    ids=lambda kw: ",".join(kw),
)
def test_argument_errors_are_torchs(kwargs):
    ds = chute.ArrayDataset(y=np.arange(N))
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(ds, **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        chute.DataLoader(ds, **kwargs)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_partition_is_distributed_samplers(monkeypatch, world, shuffle, drop_last):
    ds = chute.ArrayDataset(y=np.arange(N, dtype=np.int64))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    for seed in (0, 5):
        seen: list[int] = []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            loader = chute.DataLoader(
                ds, batch_size=4, distributed=True, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
            for epoch in (0, 1, 7):
                loader.set_epoch(epoch)
                ref_sampler = tud.DistributedSampler(
                    ds,
                    num_replicas=world,
                    rank=rank,
                    shuffle=shuffle,
                    seed=seed,
                    drop_last=drop_last,
                )
                ref_sampler.set_epoch(epoch)
                ref = tud.DataLoader(ds, batch_size=4, sampler=ref_sampler, drop_last=drop_last)
                assert_same_batches(loader, ref)
                if epoch == 0:
                    seen += [int(v) for b in loader for v in b["y"]]
        if not drop_last and world > 0:
            assert set(seen) == set(range(N))  # every index on some rank


def run_torchrun(
    script: str, out_dir: Path, *args: str, nproc: int = 2
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # The children import the chute the tests import, installed or in-tree.
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
        str(DDP_DIR / script),
        str(out_dir),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_torchrun_two_ranks_map_style(tmp_path):
    n = 100
    run_torchrun("ddp_map.py", tmp_path, str(n))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in ("0", "1"):
        batches = [r["epochs"][epoch] for r in ranks]
        assert len(batches[0]) == len(batches[1]) == ranks[0]["len"] == 7  # 50 rows, batch 8
        seen = [[i for b in rb for i in b] for rb in batches]
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(n))
    assert ranks[0]["epochs"]["0"] != ranks[0]["epochs"]["1"]  # set_epoch reshuffled
    # Curriculum under DDP: one global draw, dealt to the ranks in turn.
    for epoch in ("0", "1"):
        cur = [r["curriculum"][epoch] for r in ranks]
        assert cur[0]["global"] == cur[1]["global"]
        seen = [[i for b in c["batches"] for i in b] for c in cur]
        assert len(seen[0]) == len(seen[1]) == 20
        assert seen[0] == cur[0]["global"][0::2] and seen[1] == cur[0]["global"][1::2]
        assert not set(seen[0]) & set(seen[1])
    high = [sum(i >= n // 2 for i in ranks[0]["curriculum"][e]["global"]) for e in ("0", "1")]
    assert high == [0, 30]  # epoch 1's schedule: 3/4 of 40 from "high"


@pytest.mark.slow
def test_torchrun_two_ranks_tar_stream_uneven_shards(tmp_path):
    from conftest import tiny_samples, write_shards

    urls = write_shards(tmp_path / "shards", tiny_samples(50, dim=4), per_shard=10)
    assert len(urls) == 5
    (tmp_path / "urls.json").write_text(json.dumps(urls))
    run_torchrun("ddp_stream.py", tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    keys = [[k for b in r["batches"] for k in b] for r in ranks]
    assert not set(keys[0]) & set(keys[1])
    assert all(len(set(k)) == len(k) for k in keys)
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"])


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_even_batches_of_a_shuffled_stream(tmp_path, world):
    """Issue 30: ten shards of 100 samples (id = cls) over 2 ranks (500 each)
    and 3 ranks (400/300/300), shuffle buffer 200, batches of 32."""
    import webdataset

    urls = []
    for shard in range(10):
        path = tmp_path / f"shard-{shard:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i in range(shard * 100, shard * 100 + 100):
                sink.write({"__key__": f"s{i:05d}", "npy": np.full(4, i, np.float32), "cls": i})
        urls.append(str(path))
    (tmp_path / "urls.json").write_text(json.dumps(urls))
    run_torchrun("ddp_even.py", tmp_path, nproc=world)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    own = [
        {i for s in range(r, 10, world) for i in range(s * 100, s * 100 + 100)}
        for r in range(world)
    ]
    # Per run: each rank's batch count, samples delivered, distinct, repeated.
    expected = {
        2: {
            "cap": [(16, 500, 500, 0)] * 2,
            "repeat": [(16, 500, 500, 0)] * 2,
            "off": [(16, 500, 500, 0)] * 2,
            "cap+map": [(16, 500, 500, 0)] * 2,
        },
        3: {
            "cap": [(10, 320, 320, 0), (10, 300, 300, 0), (10, 300, 300, 0)],
            "repeat": [(13, 400, 400, 0), (13, 396, 300, 96), (13, 396, 300, 96)],
            "off": [(13, 400, 400, 0), (10, 300, 300, 0), (10, 300, 300, 0)],
            # Python batches: every rank yields the smallest rank's samples.
            "cap+map": [(10, 300, 300, 0)] * 3,
        },
    }[world]
    for run, figures in expected.items():
        for epoch in (0, 1):
            got = []
            for r, rank in enumerate(ranks):
                batches = rank[run][epoch]["batches"]
                ids = [i for b in batches for i in b]
                assert set(ids) <= own[r], (run, epoch, r)
                got.append((len(batches), len(ids), len(set(ids)), rank[run][epoch]["repeated"]))
            assert got == figures, (run, epoch)
            if world == 2 or run in ("repeat", "off"):
                every = {i for rank in ranks for b in rank[run][epoch]["batches"] for i in b}
                assert every == set(range(1000)), (run, epoch)
    assert ranks[0]["cap"][0]["batches"] != ranks[0]["cap"][1]["batches"]  # set_epoch reshuffled


@pytest.mark.parametrize("mode", ["cap", "repeat"])
def test_stream_ranks_yield_equal_batch_counts(tmp_path, monkeypatch, mode):
    from conftest import tiny_samples, write_shards

    # 7 shards of 10 samples: rank 0 gets 4 shards (40 samples), rank 1 gets 3 (30).
    urls = write_shards(tmp_path, tiny_samples(70, dim=4), per_shard=10)
    counts = {}
    keys = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = (
            chute.WebDataset(
                urls, shardshuffle=False, nodesplitter=chute.wds.split_by_node, even_batches=mode
            )
            .to_tuple("__key__")
            .batched(4)
        )
        batches = [list(k) for (k,) in ds]
        counts[rank] = len(batches)
        keys[rank] = [k for b in batches for k in b]
    expected = {"cap": 8, "repeat": 10}[mode]  # ceil(30 / 4) and ceil(40 / 4)
    assert counts == {0: expected, 1: expected}
    assert not set(keys[0]) & set(keys[1])
    if mode == "repeat":
        assert len(keys[1]) > len(set(keys[1]))  # the short rank read its shards again


def test_stream_even_batches_needs_a_way_to_agree(tmp_path, monkeypatch):
    from conftest import tiny_samples, write_shards

    urls = write_shards(tmp_path, tiny_samples(20, dim=4), per_shard=10)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    ds = (
        chute.WebDataset(urls, shardshuffle=False, nodesplitter=lambda src: src)
        .to_tuple("__key__")
        .batched(4)
    )
    with pytest.raises(ValueError, match="cannot agree"):
        list(ds)


def test_num_workers_beyond_cpu_count_are_threads_not_a_warning():
    ds = chute.ArrayDataset(x=np.arange(10))
    loader = chute.DataLoader(ds, batch_size=5, num_workers=(os.cpu_count() or 1) + 3)
    assert [b["x"].tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


@pytest.mark.slow
def test_a_rank_without_shards_joins_the_count(tmp_path: Path) -> None:
    """3 ranks over 2 shards: rank 2 gets none. It raises webdataset's
    empty-dataset error, after giving its count, so ranks 0 and 1 agree on
    "cap"'s count (the smallest, none) and end instead of waiting for it."""
    import webdataset

    urls = []
    for shard in range(2):
        path = tmp_path / f"shard-{shard:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i in range(shard * 20, shard * 20 + 20):
                sink.write({"__key__": f"s{i:05d}", "cls": i})
        urls.append(str(path))
    (tmp_path / "urls.json").write_text(json.dumps(urls))
    run_torchrun("ddp_empty_rank.py", tmp_path, nproc=3)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert ranks[2] == {
        "error": "No samples found in dataset; perhaps you have fewer shards than workers."
    }
    assert ranks[0] == ranks[1] == {"batches": 0}
