"""chute.DataLoader as a torch.utils.data.DataLoader: its type, its guards,
set_epoch, worker_init_fn, and the state dicts it refuses."""

from __future__ import annotations

import functools
import os
import warnings
from itertools import islice
from pathlib import Path
from typing import Any

import chute
import chute.loader.dataloader
import numpy as np
import pytest
import torch
from conftest import tiny_samples, write_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("dl"), tiny_samples(120, seed=9), per_shard=40)


def stream(urls: list[str]) -> chute.WebDataset:
    return chute.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "cls")


class Squares(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i * i


@pytest.mark.parametrize("kind", ["stream", "array", "torch"])
def test_is_a_torch_dataloader_and_annotates(shards: list[str], kind: str) -> None:
    dataset: Any = {
        "stream": lambda: stream(shards),
        "array": lambda: chute.ArrayDataset(x=np.arange(10)),
        "torch": Squares,
    }[kind]()
    loader = chute.DataLoader(dataset, batch_size=4)
    assert isinstance(loader, torch.utils.data.DataLoader)
    annotated: chute.DataLoader[int] = loader  # subscriptable, as torch's is
    assert chute.DataLoader[int] is not None and annotated is loader
    assert loader.batch_size == 4 and loader.dataset is dataset


@pytest.mark.parametrize(
    "attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_assigning_after_construction_raises_as_torch(attr: str) -> None:
    ds = chute.ArrayDataset(x=np.arange(10))
    messages = []
    for cls in (torch.utils.data.DataLoader, chute.DataLoader):
        loader = cls(ds, batch_size=2)
        with pytest.raises(ValueError) as info:
            setattr(loader, attr, None)
        messages.append(str(info.value))
    assert (
        messages[0]
        == messages[1]
        == (f"{attr} attribute should not be set after DataLoader is initialized")
    )
    loader = chute.DataLoader(ds, batch_size=2)
    loader.num_workers = 1  # what torch allows stays allowed
    assert [b["x"].tolist() for b in islice(loader, 2)] == [[0, 1], [2, 3]]


class Recorder(torch.utils.data.Dataset[int]):
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_set_epoch_function_reaches_sampler_and_dataset() -> None:
    data = Recorder()
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=0, seed=4)
    torch_loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
    chute.set_epoch(torch_loader, 3)
    assert sampler.epoch == 3 and data.epochs == [3]
    ds = chute.ArrayDataset(x=np.arange(8))
    loader = chute.DataLoader(ds, batch_size=2, distributed=True, seed=4)
    chute.set_epoch(loader, 5)
    assert loader.sampler.epoch == 5
    ref = torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, seed=4)
    ref.set_epoch(5)
    assert [i for b in loader for i in b["x"].tolist()] == list(ref)


def test_worker_init_fn_runs_in_torch_workers(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()

    def mark(worker_id: int) -> None:
        (marks / f"w{worker_id}-{os.getpid()}").touch()

    loader = chute.DataLoader(Squares(), batch_size=5, num_workers=2, worker_init_fn=mark)
    assert sorted(b.tolist() for b in loader) == [[0, 1, 4, 9, 16], [25, 36, 49, 64, 81]]
    names = sorted(p.name.split("-")[0] for p in marks.iterdir())
    assert names == ["w0", "w1"]
    assert all(int(p.name.split("-")[1]) != os.getpid() for p in marks.iterdir())


def test_worker_init_fn_with_native_threads_warns_once_and_is_not_called(
    shards: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chute.loader.dataloader, "_warned_worker_init_fn", set())
    calls: list[int] = []
    with pytest.warns(chute.WorkerInitFnWarning, match="worker_init_fn is not called"):
        loader = chute.DataLoader(
            stream(shards), batch_size=10, num_workers=2, worker_init_fn=calls.append
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second loader is silent
        chute.DataLoader(stream(shards), batch_size=10, num_workers=2, worker_init_fn=calls.append)
    # A map-style dataset has its own warning: the stream's does not silence it.
    with pytest.warns(chute.WorkerInitFnWarning, match="runs ArrayDataset on native threads"):
        chute.DataLoader(
            chute.ArrayDataset(x=np.arange(4)),
            batch_size=2,
            num_workers=2,
            worker_init_fn=calls.append,
        )
    assert len(list(loader)) == 12 and calls == []
    # Without workers torch does not call it either, and says nothing.
    monkeypatch.setattr(chute.loader.dataloader, "_warned_worker_init_fn", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chute.DataLoader(stream(shards), batch_size=10, worker_init_fn=calls.append)


# What a user fixes after an epoch failed in collate_fn (module-level, so
# that a worker started without fork sees the value this module imports with).
COLLATE_FAILS = True


def collate_until_fixed(rows: list[Any]) -> Any:
    if COLLATE_FAILS:
        raise RuntimeError("collate_fn is broken")
    return torch.utils.data.default_collate(rows)


def h5_rows(tmp_path: Path) -> chute.H5Dataset:
    import h5py

    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(40, dtype="f4").reshape(20, 2)
    return chute.H5Dataset(path, ["x"])


def test_a_collate_fn_fixed_after_it_raised_works_in_the_next_epoch_as_in_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = h5_rows(tmp_path)
    ds[0]  # the dataset's engine now has threads in this process
    epochs: dict[str, list[list[float]]] = {}
    for make in (torch.utils.data.DataLoader, chute.DataLoader):
        monkeypatch.setattr(__import__(__name__), "COLLATE_FAILS", True)
        loader = make(ds, batch_size=4, num_workers=2, collate_fn=collate_until_fixed)
        with pytest.raises(RuntimeError, match="collate_fn is broken"):
            list(loader)
        monkeypatch.setattr(__import__(__name__), "COLLATE_FAILS", False)
        epochs[make.__module__] = [b["x"].flatten().tolist() for b in loader]
    assert epochs["chute.loader.dataloader"] == epochs["torch.utils.data.dataloader"]
    assert len(epochs["chute.loader.dataloader"]) == 5
    ds[1]  # and the dataset still reads in this process


def mark_worker(marks: Path, worker_id: int) -> None:
    (marks / f"w{worker_id}-{os.getpid()}").touch()


def failing_worker_init(worker_id: int) -> None:
    raise RuntimeError(f"Error in worker_init_fn {worker_id}")


def test_worker_init_fn_of_a_map_style_dataset_on_workers_runs_in_each_and_raises_there(
    tmp_path: Path,
) -> None:
    ds = h5_rows(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    loader = chute.DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        collate_fn=torch.utils.data.default_collate,
        worker_init_fn=functools.partial(mark_worker, marks),
    )
    assert len(list(loader)) == 5
    assert sorted(p.name.split("-")[0] for p in marks.iterdir()) == ["w0", "w1"]
    assert all(int(p.name.split("-")[1]) != os.getpid() for p in marks.iterdir())
    # As torch's test_error_in_init: the worker's exception reaches the loop.
    for make in (torch.utils.data.DataLoader, chute.DataLoader):
        failing = make(
            ds,
            batch_size=4,
            num_workers=2,
            collate_fn=torch.utils.data.default_collate,
            worker_init_fn=failing_worker_init,
        )
        with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
            list(failing)


# ---------------------------------------------------------------- state dicts


def test_stream_state_refuses_another_dataset_or_batch_size(
    shards: list[str], tmp_path: Path
) -> None:
    def pipeline(urls: list[str], batch: int) -> chute.WebDataset:
        return stream(urls).batched(batch)

    a = pipeline(shards, 16)
    it = iter(a)
    next(it)
    state = a.state_dict()
    other_shards = write_shards(tmp_path, tiny_samples(10), per_shard=10)
    with pytest.raises(ValueError, match="another dataset: its shard list differs"):
        pipeline(other_shards, 16).load_state_dict(state)
    with pytest.raises(ValueError, match=r"another batch size: batched\(16\) in the state"):
        pipeline(shards, 32).load_state_dict(state)
    with pytest.raises(ValueError, match="another pipeline"):
        stream(shards).shuffle(10).batched(16).load_state_dict(state)
    same = pipeline(shards, 16)
    same.load_state_dict(state)
    assert sum(len(b[1]) for b in same) == 120 - 16


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ([1, 2], "must be a dict"),
        ({"batches": 1, "rows": 0}, "'epoch' is missing"),
        ({"epoch": "1", "batches": 1, "rows": 0}, "'epoch' must be a count"),
        ({"epoch": 1, "batches": -1, "rows": 0}, "'batches' must be a count"),
        ({"epoch": 1, "batches": 1, "rows": 0, "shuffle_seed": "x"}, "'shuffle_seed'"),
        ({"epoch": 1, "batches": 1, "rows": 0, "pipeline": 3}, "'pipeline' must be a dict"),
    ],
)
def test_garbage_stream_states_are_refused(shards: list[str], state: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        stream(shards).load_state_dict(state)


def test_states_of_the_earlier_format_are_refused(shards: list[str]) -> None:
    # {"epoch", "batches", "rows", "shuffle_seed"}: what state_dict() returned
    # before states carried a pipeline fingerprint; nothing ties it to a pipeline.
    ds = stream(shards).batched(16)
    with pytest.raises(ValueError, match="has no pipeline fingerprint"):
        ds.load_state_dict({"epoch": 0, "batches": 3, "rows": 0, "shuffle_seed": None})


def test_resume_inside_a_later_pass_of_with_epoch(shards: list[str]) -> None:
    def build() -> chute.WebDataset:
        return stream(shards[:1]).batched(16).with_epoch(7)

    full = [b[1].tolist() for b in build()]
    assert [len(b) for b in full] == [16, 16, 8, 16, 16, 8, 16]
    a = build()
    it = iter(a)
    head = [next(it)[1].tolist() for _ in range(4)]
    state = a.state_dict()
    assert (state["pass"], state["batches"], state["items"]) == (1, 1, 4)
    b = build()
    b.load_state_dict(state)
    assert head + [x[1].tolist() for x in b] == full


def test_loader_states_refuse_another_dataset_batch_size_or_garbage(shards: list[str]) -> None:
    ds = chute.ArrayDataset(x=np.arange(100))
    loader = chute.DataLoader(ds, batch_size=10, shuffle=True, generator=torch.Generator())
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=r"another dataset \(its row count\): rows=100"):
        chute.DataLoader(chute.ArrayDataset(x=np.arange(90)), batch_size=10).load_state_dict(state)
    with pytest.raises(ValueError, match="another batch size: batch_size=10 in the state"):
        chute.DataLoader(ds, batch_size=20).load_state_dict(state)
    with pytest.raises(ValueError, match="another dataset \\(its fields\\)"):
        chute.DataLoader(chute.ArrayDataset(y=np.arange(100)), batch_size=10).load_state_dict(state)
    for garbage, words in [
        ({**state, "rng_state": torch.zeros(3)}, "rng_state"),
        ({**state, "batches": "2"}, "'batches' must be a count"),
        ({**state, "sampler_epoch": 1.5}, "sampler_epoch"),
        ("state", "must be a dict"),
    ]:
        with pytest.raises(ValueError, match=words):
            chute.DataLoader(ds, batch_size=10).load_state_dict(garbage)  # type: ignore[arg-type]
    stream_loader = chute.DataLoader(stream(shards), batch_size=8)
    s_it = iter(stream_loader)
    next(s_it)
    s_state = stream_loader.state_dict()
    with pytest.raises(ValueError, match="another batch size"):
        chute.DataLoader(stream(shards), batch_size=4).load_state_dict(s_state)
    with pytest.raises(ValueError, match="'dataset' must be the dataset's state dict"):
        chute.DataLoader(stream(shards), batch_size=8).load_state_dict(
            {"kind": "stream", "version": 1}
        )
    resumed = chute.DataLoader(stream(shards), batch_size=8)
    resumed.load_state_dict(s_state)
    assert sum(len(b[1]) for b in resumed) == 112
    # A state without the loader's fingerprint (an older chute's) is refused:
    # nothing in it says which dataset it was taken over.
    old = {k: v for k, v in state.items() if k != "loader"}
    again = chute.DataLoader(ds, batch_size=10, shuffle=True, generator=torch.Generator())
    with pytest.raises(ValueError, match="loader state has no 'loader' record"):
        again.load_state_dict(old)


def test_stats_of_a_dataset_iterated_in_worker_processes(shards: list[str]) -> None:
    ds = stream(shards)
    before = ds.stats()
    assert before["samples_yielded"] == 0 and before["python_items"] == 0
    rows = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    assert len(rows) == 120
    # The engines ran in the workers: this process's copy saw none of it.
    assert ds.stats() == before
