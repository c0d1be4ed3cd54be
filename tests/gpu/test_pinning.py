"""pin_memory: arenas page-locked once at creation and unlocked right before
they are freed, through the hooks chute.gpu.pinning finds in the CUDA runtime."""

from __future__ import annotations

import ctypes
import gc
import warnings
from typing import Any

import chute
import chute.datasets.indexed
import chute.gpu.pinning
import chute.loader.dataloader
import chute.stream.native
import numpy as np
import pytest
import torch

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

REGISTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
UNREGISTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class RecordingHooks:
    """Stands in for cudaHostRegister/Unregister on a machine without CUDA:
    checks the engine's bookkeeping (each arena registered once, unregistered
    once before it is freed), not page-locking itself."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []
        self.register_fn = REGISTER(self._register)
        self.unregister_fn = UNREGISTER(self._unregister)

    def _register(self, ptr: int, size: int, flags: int) -> int:
        assert ptr not in self.registered and size % 4096 == 0 and flags == 0
        self.registered[ptr] = size
        return 0

    def _unregister(self, ptr: int) -> int:
        assert ptr in self.registered
        self.unregistered.append(ptr)
        return 0

    def addresses(self) -> tuple[int, int]:
        reg = ctypes.cast(self.register_fn, ctypes.c_void_p).value
        unreg = ctypes.cast(self.unregister_fn, ctypes.c_void_p).value
        assert reg is not None and unreg is not None
        return reg, unreg


# The real hooks live as long as the process; so must these callbacks, since
# a batch may outlive the test that made it.
_ALIVE: list[RecordingHooks] = []


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> RecordingHooks:
    gc.collect()  # batches of earlier tests die under their own hooks
    recording = RecordingHooks()
    _ALIVE.append(recording)
    monkeypatch.setattr(chute.stream.native, "pin_hooks", recording.addresses)
    monkeypatch.setattr(chute.datasets.indexed, "pin_hooks", recording.addresses)
    return recording


def test_stream_arenas_registered_once_and_released(
    tiny_shards: list[str], hooks: RecordingHooks
) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .decode()
        .to_tuple("npy", "cls")
        .batched(64)
    )
    loader = chute.DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True)
    kept = []
    for i, (vectors, _labels) in enumerate(loader):
        if i % 5 == 0:
            kept.append(vectors)
    stats = ds.stats()
    assert stats["arenas_created"] == len(hooks.registered) > 0
    assert stats["batch_bytes_pinned"] > 0
    assert not set(hooks.unregistered) - set(hooks.registered)
    del kept, loader, ds, vectors, _labels
    gc.collect()
    assert sorted(hooks.unregistered) == sorted(
        hooks.registered
    )  # every arena unpinned before free


def test_indexed_arenas_registered(hooks: RecordingHooks) -> None:
    ds = chute.ArrayDataset(x=np.arange(4096, dtype=np.float32).reshape(1024, 4))
    batches = [b["x"] for b in chute.DataLoader(ds, batch_size=128, pin_memory=True, num_workers=2)]
    assert torch.equal(
        torch.cat(batches), torch.from_numpy(np.arange(4096, dtype=np.float32).reshape(1024, 4))
    )
    assert len(hooks.registered) > 0
    del batches, ds
    gc.collect()
    assert sorted(hooks.unregistered) == sorted(hooks.registered)


def test_pin_memory_without_cuda_is_accepted(tiny_shards: list[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only behaviour")
    assert chute.gpu.pinning.pin_hooks() is None
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .decode()
        .to_tuple("npy", "cls")
        .batched(64)
    )
    batch: Any = next(iter(chute.DataLoader(ds, batch_size=None, pin_memory=True)))
    assert batch[0].shape == (64, 64)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_are_pinned_on_cuda(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .decode()
        .to_tuple("npy", "cls")
        .batched(64)
    )
    for tensor, _labels in chute.DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True):
        assert isinstance(tensor, torch.Tensor) and tensor.is_pinned()
        on_gpu = tensor.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(on_gpu.cpu(), tensor)
    assert ds.stats()["batch_bytes_pinned"] > 0


# ------------------------------------------------------- worker processes' arenas


class FakeCudart:
    """Stands in for ``torch.cuda.cudart()`` on a machine without CUDA:
    records cudaHostRegister/Unregister, and checks that no range is
    registered twice or unregistered when it is not registered."""

    def __init__(self) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []
        self.live: dict[int, int] = {}

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        assert ptr not in self.live and ptr % 4096 == 0 and flags == 0
        self.registered.append((ptr, size))
        self.live[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802 - CUDA's name
        assert ptr in self.live
        del self.live[ptr]
        self.unregistered.append(ptr)
        return 0

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s bytes lie in a registered range."""
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        return any(p <= start and end <= p + n for p, n in self.live.items())


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    gc.collect()  # batches of earlier tests die before this one's runtime stands in
    fake = FakeCudart()
    monkeypatch.setattr(chute.gpu.pinning, "cuda_runtime", lambda: fake)
    return fake


def doubled(sample: tuple[Any, int]) -> tuple[Any, int]:
    vector, cls = sample
    return vector * 2, cls


def summed(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"x": torch.stack([row["x"] for row in rows]) + 1}


def test_worker_arenas_are_pinned_in_place_once_and_unpinned_when_freed(
    tiny_shards: list[str], cudart: FakeCudart
) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    expected = list(chute.DataLoader(ds.map(doubled), batch_size=64, num_workers=0))
    loader = chute.DataLoader(ds.map(doubled), batch_size=64, num_workers=2, pin_memory=True)
    count = 0
    for (vectors, labels), (want, want_labels) in zip(loader, expected, strict=True):
        assert torch.equal(vectors, want) and torch.equal(labels, want_labels)
        assert cudart.holds(vectors)  # the batch is the worker's arena, registered: no copy
        count += 1
    assert count == 16
    # Each arena once (FakeCudart refuses a second registration), far fewer
    # arenas than batches.
    assert 0 < len(cudart.registered) <= 12
    del loader, vectors, labels
    gc.collect()
    assert cudart.live == {}  # every arena unregistered once the loader and its batches are gone
    assert sorted(cudart.unregistered) == sorted(p for p, _ in cudart.registered)


def test_index_driven_worker_batches_are_pinned_in_place(cudart: FakeCudart) -> None:
    ds = chute.ArrayDataset(x=np.arange(4000, dtype=np.float32).reshape(1000, 4))
    loader = chute.DataLoader(ds, batch_size=100, num_workers=2, collate_fn=summed, pin_memory=True)
    rows = []
    for batch in loader:
        assert cudart.holds(batch["x"])
        rows.append(batch["x"].clone())
    assert torch.equal(
        torch.cat(rows), torch.arange(4000, dtype=torch.float32).reshape(1000, 4) + 1
    )
    assert 0 < len(cudart.registered) < len(rows)
    del batch, loader
    gc.collect()
    assert cudart.live == {}


def test_pin_memory_device_is_accepted_with_torchs_warning(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        next(
            iter(
                torch.utils.data.DataLoader(
                    list(range(4)), pin_memory=True, pin_memory_device="cuda"
                )
            )
        )
    expected = [str(w.message) for w in theirs if "pin_memory_device" in str(w.message)]
    assert len(expected) == 1
    loader = chute.DataLoader(ds, batch_size=10, pin_memory=True, pin_memory_device="cuda")
    assert loader.pin_memory_device == "cuda"
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        vectors, _ = next(iter(loader))
    assert [str(w.message) for w in ours if "pin_memory_device" in str(w.message)] == expected
    assert vectors.shape == (10, 64)
