"""DataLoader(device=...): batches handed over on a CUDA device, the next
copied on a side stream while the current step runs (chute.gpu.device). Without
CUDA: the argument is refused, "cpu" changes nothing, and the hand-off's
logic (structure, order, the host batch kept until its copy ends, the
state of the batches handed over) runs against stand-in copies."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import chute
import chute.gpu.device
import numpy as np
import pytest
import torch
from chute.gpu.device import DeviceBatches, move_tensors
from conftest import assert_same_typed

Pair = collections.namedtuple("Pair", ["image", "label"])
NO_CUDA = not torch.cuda.is_available()


# -------------------------------------------------------------- without CUDA


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal where CUDA is missing")
def test_device_cuda_is_refused_without_cuda() -> None:
    ds = chute.ArrayDataset(x=np.arange(10))
    with pytest.raises(ValueError) as info:
        chute.DataLoader(ds, batch_size=4, device="cuda")
    assert str(info.value) == (
        "chute.DataLoader: device='cuda', but CUDA is not available here "
        "(torch.cuda.is_available() is False); pass device=None or 'cpu' to keep "
        "batches in host memory"
    )


def test_other_devices_are_refused() -> None:
    ds = chute.ArrayDataset(x=np.arange(10))
    with pytest.raises(ValueError, match=r"device='meta': batches are handed to CUDA devices"):
        chute.DataLoader(ds, batch_size=4, device="meta")
    with pytest.raises(ValueError, match=r"device='gpu7' is not a device"):
        chute.DataLoader(ds, batch_size=4, device="gpu7")


def test_device_cpu_changes_nothing(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    expected = list(chute.DataLoader(ds, batch_size=100))
    loader = chute.DataLoader(ds, batch_size=100, device="cpu")
    got = list(loader)
    assert_same_typed(got, expected)
    assert loader.device == "cpu"


def test_every_tensor_moves_and_the_rest_stays() -> None:
    array = np.arange(3)
    batch = {
        "pair": Pair(torch.ones(2, 3), 7),
        "list": [torch.zeros(1), "text", (torch.arange(4), b"raw")],
        "ordered": collections.OrderedDict(a=torch.tensor(1.5)),
        "array": array,
        "none": None,
    }
    moved = move_tensors(batch, lambda t: t.to("meta"))
    assert moved["pair"].image.device.type == "meta" and moved["pair"].image.shape == (2, 3)
    assert type(moved["pair"]) is Pair and moved["pair"].label == 7
    assert moved["list"][0].device.type == "meta" and moved["list"][1] == "text"
    assert type(moved["list"][2]) is tuple and moved["list"][2][0].device.type == "meta"
    assert moved["list"][2][1] == b"raw"
    assert type(moved["ordered"]) is collections.OrderedDict
    assert moved["ordered"]["a"].device.type == "meta"
    assert moved["array"] is array and moved["none"] is None
    assert list(chute.gpu.device.tensors_in(moved)) == [
        moved["pair"].image,
        moved["list"][0],
        moved["list"][2][0],
        moved["ordered"]["a"],
    ]


class FakeEvent:
    def __init__(self, copies: FakeCopies, index: int) -> None:
        self.copies = copies
        self.index = index
        self.done = False


class FakeCopies:
    """Stands in for CudaCopies: "copies" are clones, an event is done
    once `finish` says so (or it is waited for)."""

    def __init__(self, device: Any = None) -> None:
        self.started: list[Any] = []
        self.handed: list[int] = []
        self.events: list[FakeEvent] = []

    def start(self, batch: Any) -> tuple[Any, FakeEvent]:
        self.started.append(batch)
        event = FakeEvent(self, len(self.events))
        self.events.append(event)
        return move_tensors(batch, torch.clone), event

    def hand_over(self, moved: Any, event: FakeEvent) -> Any:
        self.handed.append(event.index)
        return moved

    def finished(self, event: FakeEvent) -> bool:
        return event.done

    def wait(self, event: FakeEvent) -> None:
        event.done = True

    def seconds(self, event: FakeEvent) -> float:
        return 0.0


def test_the_next_batch_is_copied_while_the_current_one_is_used() -> None:
    pulled: list[int] = []

    def source() -> Iterator[dict[str, Any]]:
        for i in range(4):
            pulled.append(i)
            yield {"x": torch.full((2,), float(i)), "i": i}

    copies = FakeCopies()
    batches = DeviceBatches(source(), copies)
    first = next(batches)
    assert_same_typed(first, {"x": torch.full((2,), 0.0), "i": 0})
    assert pulled == [0, 1]  # batch 1's copy started before batch 0 was handed over
    assert copies.handed == [0]
    # The host batch of a handed-over copy is kept until the copy ends.
    assert [host["i"] for _, host in batches.copying] == [0]
    copies.events[0].done = True
    second = next(batches)
    assert second["i"] == 1 and pulled == [0, 1, 2]
    assert [host["i"] for _, host in batches.copying] == [1]
    assert [b["i"] for b in batches] == [2, 3]
    assert copies.handed == [0, 1, 2, 3]
    # At the end every copy was waited for and no host batch is held.
    assert all(e.done for e in copies.events) and batches.copying == []


def _with_fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[FakeCopies]:
    made: list[FakeCopies] = []

    def copies(device: Any) -> FakeCopies:
        made.append(FakeCopies(device))
        return made[-1]

    monkeypatch.setattr(chute.gpu.device, "cuda_available", lambda: True)
    monkeypatch.setattr(chute.loader.dataloader, "CudaCopies", copies)
    return made


def test_state_dict_counts_the_batches_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _with_fake_cuda(monkeypatch)
    ds = chute.ArrayDataset(x=np.arange(100))
    plain = chute.DataLoader(ds, batch_size=10, shuffle=True, generator=torch.Generator())
    loader = chute.DataLoader(
        ds, batch_size=10, shuffle=True, generator=torch.Generator(), device="cuda"
    )
    expected = list(plain)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    assert len(made[0].started) == 4  # one copied ahead
    state = loader.state_dict()
    assert state["batches"] == 3
    assert_same_typed(got, expected[:3])
    resumed = chute.DataLoader(ds, batch_size=10, shuffle=True, generator=torch.Generator())
    resumed.load_state_dict(state)
    assert_same_typed(list(resumed), expected[3:])
    assert_same_typed(list(it), expected[3:])
    assert loader.state_dict()["batches"] == 0  # the next epoch's start


def test_a_stream_state_is_that_of_the_batches_handed_over(
    tiny_shards: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_fake_cuda(monkeypatch)

    def dataset() -> Any:
        return chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")

    plain = chute.DataLoader(dataset(), batch_size=100)
    it = iter(plain)
    for _ in range(4):
        next(it)
    expected = plain.state_dict()
    del it
    loader = chute.DataLoader(dataset(), batch_size=100, device="cuda")
    it = iter(loader)
    for _ in range(4):
        next(it)
    assert loader.state_dict() == expected


# -------------------------------------------------------------- with CUDA


@pytest.mark.cuda
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_arrive_on_the_device_equal_to_to_device(
    tiny_shards: list[str], workers: int
) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .decode()
        .to_tuple("npy", "cls", "__key__")
        .map(_as_dict)
    )
    expected = list(chute.DataLoader(ds, batch_size=64))
    loader = chute.DataLoader(ds, batch_size=64, num_workers=workers, device="cuda")
    got = list(loader)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a["x"].device.type == "cuda" and a["y"].device.type == "cuda"
        assert a["key"] == b["key"]
        assert torch.equal(a["x"], b["x"].to("cuda")) and torch.equal(a["y"], b["y"].to("cuda"))


def _as_dict(sample: tuple[Any, int, str]) -> dict[str, Any]:
    x, y, key = sample
    return {"x": torch.from_numpy(x), "y": y, "key": key}


@pytest.mark.cuda
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_copies_overlap_the_step() -> None:
    """A step over chute's batches (each copied while the previous step
    runs) takes at most 1.05x the same step over batches already on the
    device. The step lasts twice the longer of a batch's copy and the time
    the loader takes to make a batch in host memory, so that it is the copy,
    not the loader, that would show."""
    rows = torch.randn(64 * 24, 3 * 128 * 128).numpy()
    ds = chute.ArrayDataset(x=rows)
    host = chute.DataLoader(ds, batch_size=64, num_workers=2, pin_memory=True)
    on_device = [b["x"].to("cuda") for b in host]
    start = time.perf_counter()
    count = sum(1 for _ in host)
    host_seconds = (time.perf_counter() - start) / count
    copy = _copy_seconds(on_device[0].cpu().pin_memory())
    cycles = _cycles_for(2 * max(copy, host_seconds))

    def steps(batches: Any) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in batches:
            torch.cuda._sleep(cycles)
            batch["x"].add_(1)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    steps(on_device)  # warm-up
    baseline = min(steps(on_device) for _ in range(3))
    loader = chute.DataLoader(ds, batch_size=64, num_workers=2, device="cuda")
    steps(loader)
    ours = min(steps(loader) for _ in range(3))
    assert ours <= 1.05 * baseline, (ours, baseline)


def _copy_seconds(pinned: torch.Tensor) -> float:
    pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _cycles_for(seconds: float) -> int:
    probe = 10_000_000
    torch.cuda._sleep(probe)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    return max(1, int(probe * seconds / (time.perf_counter() - start)))
