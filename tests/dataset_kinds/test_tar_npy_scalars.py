"""A 0-d ``.npy`` member comes back from TarDataset as webdataset's decoder
gives it (and ``chute.wds``): a 0-d ndarray, which ``torch.from_numpy``
takes, not a numpy scalar."""

from __future__ import annotations

from pathlib import Path

import chute
import chute.wds as cwds
import numpy as np
import pytest
import torch
import webdataset as wds
from conftest import npy_bytes, write_shards

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def test_a_0d_npy_member_is_a_0d_array_as_webdataset_gives(tmp_path: Path) -> None:
    samples = [
        {
            "__key__": f"{i:04d}",
            "x.npy": npy_bytes(np.array(i * 3, dtype=np.int64)),
            "f.npy": npy_bytes(np.array(i / 4, dtype=np.float32)),
            "v.npy": npy_bytes(np.arange(i, i + 3, dtype=np.int16)),
        }
        for i in range(5)
    ]
    [shard] = write_shards(tmp_path, samples, per_shard=5)
    theirs = list(wds.WebDataset(shard, shardshuffle=False).decode())
    streamed = list(cwds.WebDataset(shard, shardshuffle=False).decode())
    ours = chute.TarDataset([shard], decode="")
    as_tuples = chute.TarDataset([shard], decode="", fields=["x.npy", "f.npy", "v.npy"])
    for i, want in enumerate(theirs):
        for got in (
            ours[i],
            dict(zip(["x.npy", "f.npy", "v.npy"], as_tuples[i], strict=True)),
            streamed[i],
        ):
            for name in ("x.npy", "f.npy", "v.npy"):
                value = got[name]
                assert type(value) is np.ndarray and value.dtype == want[name].dtype, (i, name)
                assert value.shape == want[name].shape and (value == want[name]).all()
                torch.from_numpy(value)  # what a scalar would refuse
    batch = next(iter(chute.DataLoader(as_tuples, batch_size=5)))
    assert batch[0].tolist() == [0, 3, 6, 9, 12] and batch[0].dtype == torch.int64
