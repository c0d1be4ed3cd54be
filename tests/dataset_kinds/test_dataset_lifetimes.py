"""A dataset the user lets go of ends its native threads at once, not at
Python's next garbage collection: nothing a dataset holds (its engines, its
converter, its callbacks) may hold it back in a reference cycle.

The tests run with the collector off, so only reference counting frees
what they drop.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chute
import h5py
import numpy as np
import pytest
from conftest import tiny_samples, write_shards

ROWS = 96
# A joined thread leaves /proc/self/task a moment after join() returns.
GONE_WITHIN_S = 10.0


def engine_threads() -> int:
    """This process's threads of chute's indexed engines, those of every
    dataset here (native threads, which ``threading`` does not see)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        count += name == "chute-read"
    return count


def wait_for_threads(at_most: int) -> int:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (now := engine_threads()) > at_most and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lifetimes")
    h5 = root / "rows.h5"
    with h5py.File(h5, "w") as f:
        f["x"] = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    return {"shards": write_shards(root / "tar", tiny_samples(ROWS), per_shard=32), "h5": h5}


def tar(files: dict[str, Any]) -> Any:
    return chute.TarDataset(files["shards"], decode="", fields=("npy", "cls"))


def h5(files: dict[str, Any]) -> Any:
    return chute.H5Dataset(files["h5"], {"x": "x"})


def arrays(files: dict[str, Any]) -> Any:
    return chute.ArrayDataset(x=np.zeros((ROWS, 4), np.float32))


def mixed_per_sample(files: dict[str, Any]) -> Any:
    return chute.mix([h5(files), arrays(files)], weights=[0.5, 0.5])


def mixed_per_batch(files: dict[str, Any]) -> Any:
    return chute.mix([tar(files), tar(files)], weights=[0.5, 0.5], batch_size=8)


KINDS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "tar": tar,
    "h5": h5,
    "arrays": arrays,
    "mixed_per_sample": mixed_per_sample,
    "mixed_per_batch": mixed_per_batch,
}


@pytest.fixture()
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("how", ["part", "whole", "getitem"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_dropped_dataset_ends_its_threads_without_a_collection(
    files: dict[str, Any], collector_off: None, kind: str, how: str, num_workers: int
) -> None:
    before = engine_threads()
    ds = KINDS[kind](files)
    gone = weakref.ref(ds)
    per_batch = isinstance(ds, chute.MixedStream)
    loader = chute.DataLoader(ds, batch_size=None if per_batch else 8, num_workers=num_workers)
    it = iter(loader)
    next(it)
    next(it)
    if how == "whole":  # a finished epoch's engine is kept for the next one
        for _ in it:
            pass
    elif how == "getitem" and not per_batch:  # the shared engine behind ds[i]
        ds[3]
    assert engine_threads() > before or how == "whole"
    del it, loader, ds
    assert gone() is None, f"{kind}: the dataset outlived its last reference"
    assert wait_for_threads(before) <= before, f"{kind}: engine threads outlived the dataset"
