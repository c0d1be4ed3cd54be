"""chute.create_loader over a generated split-on-disk directory."""

from __future__ import annotations

import json
from pathlib import Path

import chute
import numpy as np
import pytest
import torch
import torch.utils.data

N = 103


def make_dir(root: Path, idx_format: str = "npy", fields: object = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(root / "x.npy", rng.standard_normal((N, 4)).astype(np.float32))
    torch.save(torch.arange(N, dtype=torch.int64) * 10, root / "y.pt")
    perm = rng.permutation(N)
    splits = {"train": perm[:70], "val": perm[70:90], "test": perm[90:]}
    for name, idx in splits.items():
        if idx_format == "npy":
            np.save(root / f"{name}_idx.npy", idx)
        else:
            torch.save(torch.from_numpy(idx), root / f"{name}_idx.pt")
    (root / "config.json").write_text(json.dumps({"fields": fields or ["x", "y"], "seed": 4}))
    return root


def rows(loader) -> list[int]:
    return [int(v) // 10 for b in loader for v in b["y"]]


@pytest.mark.parametrize("idx_format", ["npy", "pt"])
def test_splits_rows_and_defaults(tmp_path, idx_format):
    root = make_dir(tmp_path / "d", idx_format)
    x = np.load(root / "x.npy")
    order = {
        s: np.load(root / f"{s}_idx.npy")
        if idx_format == "npy"
        else torch.load(root / f"{s}_idx.pt").numpy()
        for s in ("train", "val", "test")
    }

    val = chute.create_loader(root, "val", batch_size=8)
    assert isinstance(val, chute.DataLoader)
    assert len(val) == 3 and not val.drop_last  # 20 rows: 8 + 8 + 4
    assert rows(val) == order["val"].tolist()  # no shuffle, index-file order
    batch = next(iter(val))
    np.testing.assert_array_equal(batch["x"].numpy(), x[order["val"][:8]])
    assert batch["x"].dtype == torch.float32 and batch["y"].dtype == torch.int64
    # The dataset is a view of the split: row i is the index file's i-th row.
    view = val.dataset
    assert len(view) == 20
    assert int(view[3]["y"]) == 10 * int(order["val"][3])
    assert int(view[-1]["y"]) == 10 * int(order["val"][-1])
    assert [int(r["y"]) for r in view.__getitems__([0, 5])] == [
        10 * int(order["val"][0]),
        10 * int(order["val"][5]),
    ]
    with pytest.raises(IndexError, match="out of range for a dataset of length 20"):
        view[20]

    test = chute.create_loader(root, "test", batch_size=5, drop_last=True)
    assert len(test) == 2 and rows(test) == order["test"][:10].tolist()

    train = chute.create_loader(root, "train", batch_size=16, num_workers=2)
    assert train.drop_last and len(train) == 4  # 70 rows: 4 full batches
    seen = rows(train)
    assert len(seen) == 64 and len(set(seen)) == 64 and set(seen) <= set(order["train"].tolist())
    assert seen != order["train"][:64].tolist()  # shuffled
    # The train order is a function of (config seed, epoch).
    ref = torch.utils.data.DistributedSampler(range(70), num_replicas=1, rank=0, seed=4)
    ref.set_epoch(0)
    assert seen == [int(order["train"][i]) for i in list(ref)[:64]]
    again = chute.create_loader(root, "train", batch_size=16)
    assert rows(again) == seen
    epoch3 = chute.create_loader(root, "train", batch_size=16, epoch=3)
    assert rows(epoch3) != seen
    again.set_epoch(3)
    assert rows(again) == rows(epoch3)


def test_pin_memory_only_with_cuda(tmp_path):
    root = make_dir(tmp_path / "d")
    loader = chute.create_loader(root, "val", batch_size=4, pin_memory=True)
    assert loader.pin_memory == torch.cuda.is_available()
    list(loader)  # pytest turns torch's "pin_memory without accelerator" warning into an error


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_partition_matches_distributed_sampler(tmp_path, monkeypatch, world):
    root = make_dir(tmp_path / "d")
    train_idx = np.load(root / "train_idx.npy")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    per_rank: list[list[int]] = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        loader = chute.create_loader(root, "train", batch_size=4, distributed=True, epoch=2)
        ref = torch.utils.data.DistributedSampler(
            range(70), num_replicas=world, rank=rank, shuffle=True, seed=4, drop_last=True
        )
        ref.set_epoch(2)
        expected = [int(train_idx[i]) for i in ref]
        expected = expected[: len(expected) // 4 * 4]
        per_rank.append(rows(loader))
        assert per_rank[-1] == expected
    assert len({len(r) for r in per_rank}) == 1
    flat = [i for r in per_rank for i in r]
    assert len(flat) == len(set(flat))


def test_fields_as_dict_and_split_override(tmp_path):
    root = make_dir(tmp_path / "d", fields={"feat": "x.npy", "target": "y.pt"})
    cfg = json.loads((root / "config.json").read_text())
    np.save(root / "holdout.npy", np.array([5, 6]))
    cfg["splits"] = {"holdout": "holdout.npy"}
    (root / "config.json").write_text(json.dumps(cfg))
    b = next(iter(chute.create_loader(root, "holdout", batch_size=2)))
    assert sorted(b) == ["feat", "target"] and b["target"].tolist() == [50, 60]


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset directory not found"):
        chute.create_loader(tmp_path / "nope", "train", 4)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        chute.create_loader(tmp_path / "empty", "train", 4)

    root = make_dir(tmp_path / "d")
    with pytest.raises(
        FileNotFoundError,
        match=r"split 'dev' not found \(splits here: \['test', "
        r"'train', 'val'\]\).*dev_idx.npy or .*dev_idx.pt",
    ):
        chute.create_loader(root, "dev", 4)

    (root / "y.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"field 'y' not found.*y\.npy or .*y\.pt"):
        chute.create_loader(root, "val", 4)

    root = make_dir(tmp_path / "e")
    np.save(root / "val_idx.npy", np.array([1, 2, N, 3]))
    with pytest.raises(
        IndexError,
        match=r"val_idx\.npy: index 103 \(position 2\) is out of "
        r"range for 103 rows",
    ):
        chute.create_loader(root, "val", 4)
    np.save(root / "val_idx.npy", np.array([-1]))
    with pytest.raises(IndexError, match="index -1"):
        chute.create_loader(root, "val", 4)
    np.save(root / "val_idx.npy", np.array([0.5]))
    with pytest.raises(ValueError, match="1-D integer"):
        chute.create_loader(root, "val", 4)

    root = make_dir(tmp_path / "f")
    (root / "config.json").write_text(json.dumps({"files": ["x"]}))
    with pytest.raises(ValueError, match="needs a 'fields' key"):
        chute.create_loader(root, "val", 4)
