"""Map-style datasets over a server that stalls after the dataset opened:
``DataLoader(timeout=)`` raises TimeoutError and the engine's threads end
at once, not after the store's retry budget (minutes) for the stalled read.
The conformance suite found both waiting ~6 minutes (its lifecycle tests)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import chute
import h5py
import numpy as np
import pytest
from conftest import tiny_samples, write_shards
from remote_servers import Fault, FaultProxy, ObjectServer

pytest.importorskip("obstore")

PROMPT_S = 25.0  # a hang detector: the stalled read would hold the close for minutes


def tar_dataset(tmp_path: Path, base: str, server: ObjectServer) -> Any:
    urls = []
    for path in write_shards(tmp_path / "tar", tiny_samples(40, dim=4), per_shard=20):
        server.objects[f"/d/{Path(path).name}"] = Path(path).read_bytes()
        urls.append(f"{base}/d/{Path(path).name}")
    return chute.TarDataset(urls, fields=("__key__", "cls"), index=tmp_path / "indexes")


def h5_dataset(tmp_path: Path, base: str, server: ObjectServer) -> Any:
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(4000, dtype=np.float32), chunks=(100,))
    server.objects["/d/rows.h5"] = path.read_bytes()
    return chute.H5Dataset(f"{base}/d/rows.h5", ["x"])


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("make", [tar_dataset, h5_dataset], ids=["TarDataset", "H5Dataset"])
def test_a_timeout_over_a_stalled_server_ends_the_epoch_promptly(tmp_path: Path, make) -> None:
    with ObjectServer() as server, FaultProxy(server.port) as proxy:
        assert isinstance(server, ObjectServer) and isinstance(proxy, FaultProxy)
        ds = make(tmp_path, proxy.url, server)
        loader = chute.DataLoader(ds, batch_size=8, num_workers=2, timeout=1.0)
        before = tasks()
        stall = proxy.add(Fault("stall", times=10_000))
        start = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                for _ in loader:
                    pass
            elapsed = time.monotonic() - start
            assert elapsed < 1.0 + PROMPT_S, f"the epoch ended {elapsed:.0f} s after its timeout"
            deadline = time.monotonic() + PROMPT_S
            while tasks() > before and time.monotonic() < deadline:
                time.sleep(0.02)
            assert tasks() <= before, "the engine's threads outlived the epoch"
        finally:
            stall.release.set()
