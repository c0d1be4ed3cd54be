"""States that do not belong are refused, naming what does not match: an
unknown version, a position past the end of the epoch, a state of other
files, arrays or mix sources, a mix state without its sources' states."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import chute
import h5py
import numpy as np
import pytest
import torch
from conftest import tiny_samples, write_shards

ROWS = 100


def write_h5(path: Path, rows: int = ROWS, chunks: tuple[int, ...] | None = None) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(rows * 2, dtype="f4").reshape(rows, 2), chunks=chunks)
        f["y"] = np.arange(rows, dtype="i8")
    return path


def h5_loader(path: Path, **kwargs: Any) -> chute.DataLoader:
    return chute.DataLoader(
        chute.H5Dataset(path, ["x", "y"]),
        batch_size=10,
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
        **kwargs,
    )


def state_after(loader: chute.DataLoader, batches: int) -> dict[str, Any]:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_a_loader_state_carries_a_version_and_refuses_others(tmp_path: Path) -> None:
    path = write_h5(tmp_path / "a.h5")
    state = state_after(h5_loader(path), 2)
    assert state["version"] == 1
    for version, words in [
        (2, "loader state has version 2; this chute reads version 1"),
        ("1", "loader state has version '1'; this chute reads version 1"),
        (True, "loader state has version True"),
    ]:
        with pytest.raises(ValueError, match=words):
            h5_loader(path).load_state_dict({**state, "version": version})
    unversioned = {k: v for k, v in state.items() if k != "version"}
    with pytest.raises(ValueError, match="loader state has no 'version'"):
        h5_loader(path).load_state_dict(unversioned)
    resumed = h5_loader(path)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 8


def test_a_stream_loader_state_carries_a_version(tmp_path: Path) -> None:
    shards = write_shards(tmp_path, tiny_samples(30), per_shard=10)

    def loader() -> chute.DataLoader:
        ds = chute.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "cls")
        return chute.DataLoader(ds, batch_size=5)

    state = state_after(loader(), 2)
    assert state["version"] == 1
    with pytest.raises(ValueError, match="loader state has version 7"):
        loader().load_state_dict({**state, "version": 7})


def test_an_hdf5_state_past_the_end_of_the_epoch_is_refused(tmp_path: Path) -> None:
    path = write_h5(tmp_path / "a.h5")
    state = state_after(h5_loader(path), 3)
    with pytest.raises(
        ValueError,
        match=r"loader state is 1000000 batches into its epoch, but this loader's epoch has "
        r"10 batches",
    ):
        h5_loader(path).load_state_dict({**state, "batches": 10**6})
    with pytest.raises(ValueError, match="11 batches into its epoch, but .* has 10 batches"):
        h5_loader(path).load_state_dict({**state, "batches": 11})
    # The end of the epoch is a position: the next iteration is empty.
    at_end = h5_loader(path)
    at_end.load_state_dict({**state, "batches": 10})
    assert list(at_end) == []
    # With a distributed loader the bound is the rank's part of the epoch.
    elastic = chute.DataLoader(chute.H5Dataset(path, ["x"]), batch_size=10, distributed=True)
    e_state = state_after(elastic, 2)
    bad = {**e_state, "elastic": {**e_state["elastic"], "batches": 10**6}}
    with pytest.raises(ValueError, match="1000000 batches into its epoch, .* has 10 batches"):
        chute.DataLoader(
            chute.H5Dataset(path, ["x"]), batch_size=10, distributed=True
        ).load_state_dict(bad)


def test_a_state_of_other_hdf5_files_is_refused(tmp_path: Path) -> None:
    a = write_h5(tmp_path / "a.h5")
    state = state_after(h5_loader(a), 2)
    assert state["loader"]["dataset"]["type"] == "H5Dataset"
    # Another file of the same rows and fields.
    b = write_h5(tmp_path / "b.h5")
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        h5_loader(b).load_state_dict(state)
    # The same path, rewritten with the same rows in another layout.
    write_h5(a, chunks=(10, 2))
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        h5_loader(a).load_state_dict(state)


def test_a_state_of_other_arrays_is_refused(tmp_path: Path) -> None:
    def loader(values: np.ndarray) -> chute.DataLoader:
        return chute.DataLoader(chute.ArrayDataset(x=values), batch_size=10)

    state = state_after(loader(np.arange(ROWS, dtype="i8")), 2)
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        loader(np.arange(ROWS, dtype="f4")).load_state_dict(state)
    npy = tmp_path / "x.npy"
    np.save(npy, np.arange(ROWS, dtype="i8"))
    mapped = state_after(chute.DataLoader(chute.ArrayDataset(x=str(npy)), batch_size=10), 1)
    assert mapped["loader"]["dataset"]["fields"]["x"]["path"] == str(npy)
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        loader(np.arange(ROWS, dtype="i8")).load_state_dict(mapped)


def mixed_loader(sources: dict[str, Any]) -> chute.DataLoader:
    return chute.DataLoader(chute.mix(sources, weights={"a": 1, "b": 1}, seed=3), batch_size=5)


def test_a_state_of_a_mix_over_other_datasets_is_refused() -> None:
    a = chute.ArrayDataset(y=np.arange(40, dtype=np.int64))
    b = chute.ArrayDataset(y=np.arange(1000, 1040, dtype=np.int64))
    state = state_after(mixed_loader({"a": a, "b": b}), 3)
    assert set(state["loader"]["dataset"]["datasets"]) == {"a", "b"}
    other = chute.ArrayDataset(y=np.arange(40, dtype=np.int32))  # same rows, another dtype
    with pytest.raises(ValueError, match=r"another dataset \(its files, arrays or sources\)"):
        mixed_loader({"a": a, "b": other}).load_state_dict(state)
    resumed = mixed_loader({"a": a, "b": b})
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 16 - 3


# -- per-batch mixes of streams ---------------------------------------------------------


@pytest.fixture(scope="module")
def stream_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("mix_states")
    b = tiny_samples(45, seed=1, dim=4)
    for s in b:
        s["__key__"] = "b" + str(s["__key__"])
    return {
        "a": write_shards(root, tiny_samples(60, dim=4), per_shard=10, prefix="a"),
        "b": write_shards(root, b, per_shard=9, prefix="b"),
    }


def stream_mix(shards: dict[str, list[str]], names: tuple[str, str] = ("a", "b")) -> Any:
    def web(urls: list[str], seed: int) -> Any:
        return (
            chute.WebDataset(urls, shardshuffle=True, seed=seed, elastic=True)
            .to_tuple("__key__")
            .batched(3)
        )

    return chute.mix(
        {names[0]: web(shards["a"], 1), names[1]: web(shards["b"], 2)},
        weights={names[0]: 2, names[1]: 1},
    )


def test_a_mix_state_without_its_sources_states_is_refused(
    stream_shards: dict[str, list[str]],
) -> None:
    whole = list(stream_mix(stream_shards))
    mixed = stream_mix(stream_shards)
    running = iter(mixed)  # the state is a running iteration's
    head = list(itertools.islice(running, 7))
    state = mixed.state_dict()
    assert state["version"] == 1 and state["names"] == ["a", "b"]
    for gone in ({**state, "sources": None}, {k: v for k, v in state.items() if k != "sources"}):
        with pytest.raises(ValueError, match="7 batches into epoch 0 but holds no source states"):
            stream_mix(stream_shards).load_state_dict(gone)
    resumed = stream_mix(stream_shards)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(whole)
    assert [list(b[0]) for b in head + rest] == [list(b[0]) for b in whole]


def test_a_mix_state_of_other_sources_or_versions_is_refused(
    stream_shards: dict[str, list[str]],
) -> None:
    mixed = stream_mix(stream_shards)
    running = iter(mixed)
    list(itertools.islice(running, 4))
    state = mixed.state_dict()
    assert state["steps"] == 4
    with pytest.raises(ValueError, match=r"mix state is of a mix of the sources \['a', 'b'\]"):
        stream_mix(stream_shards, names=("a", "c")).load_state_dict(state)
    with pytest.raises(ValueError, match="mix state has version 3"):
        stream_mix(stream_shards).load_state_dict({**state, "version": 3})
    # A source's own state of other shards: refused when loaded, naming the source.
    swapped = {"a": stream_shards["b"], "b": stream_shards["a"]}
    with pytest.raises(ValueError, match="mix state of source 'a': .*another dataset"):
        stream_mix(swapped).load_state_dict(state)
    # Through a loader, the mix's state is the loader state's dataset part.
    loader = chute.DataLoader(stream_mix(stream_shards), batch_size=None)
    in_loader = iter(loader)
    next(in_loader)
    loader_state = loader.state_dict()
    broken = {**loader_state, "dataset": {**loader_state["dataset"], "sources": None}}
    with pytest.raises(ValueError, match="holds no source states"):
        chute.DataLoader(stream_mix(stream_shards), batch_size=None).load_state_dict(broken)
    resumed = chute.DataLoader(stream_mix(stream_shards), batch_size=None)
    resumed.load_state_dict(loader_state)
    whole = [list(b[0]) for b in stream_mix(stream_shards)]
    assert [list(b[0]) for b in resumed] == whole[1:]
