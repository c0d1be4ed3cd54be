import gc
import pickle

import numpy as np
import pytest
import torch
from chute.datasets.arrays import ArrayDataset
from torch.utils.data import DataLoader, TensorDataset

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def _check(ds, refs, threads=2):
    rng = np.random.default_rng(0)
    n = len(ds)
    batches = [rng.integers(0, n, 32) for _ in range(20)] + [np.arange(0, n, 1)[:50]]
    for idx, got in zip(batches, ds.iter_batches(batches, threads, 4), strict=True):
        for name, ref in refs.items():
            assert got[name].dtype == torch.from_numpy(np.ascontiguousarray(ref[:1])).dtype
            np.testing.assert_array_equal(got[name].numpy(), ref[idx])
    for name, ref in refs.items():
        np.testing.assert_array_equal(ds[-2][name].numpy(), ref[-2])


@pytest.mark.parametrize(
    "dtype", ["u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "?"]
)
def test_numpy_every_dtype(dtype):
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((300, 4, 3)) * 50).astype(dtype)
    s = np.arange(300).astype(dtype)
    _check(ArrayDataset(a=a, s=s), {"a": a, "s": s})


def test_tensor_npy_mixed(tmp_path):
    rng = np.random.default_rng(2)
    emb = rng.standard_normal((1000, 768)).astype("f4")
    np.save(tmp_path / "emb.npy", emb)
    ids = torch.arange(1000, dtype=torch.int64)
    t = torch.randn(1000, 8)[:, ::2]  # not contiguous: copied once
    ds = ArrayDataset(emb=tmp_path / "emb.npy", ids=ids, t=t, score=rng.random(1000))
    _check(
        ds,
        {"emb": emb, "ids": ids.numpy(), "t": t.contiguous().numpy(), "score": ds._arrays["score"]},
    )
    ds2 = pickle.loads(pickle.dumps(ds))
    assert "emb" in ds2._mapped and not ds2._arrays["emb"].flags.owndata  # mapped again
    np.testing.assert_array_equal(ds2[5]["emb"].numpy(), emb[5])


def test_strided_rows_and_big_endian():
    base = np.arange(2000, dtype=">i4").reshape(200, 10)
    ds = ArrayDataset(a=base[::2], b=base[:100, 3])
    _check(ds, {"a": base[::2].astype("i4"), "b": base[:100, 3].astype("i4")})


def test_length_mismatch_names_offenders():
    with pytest.raises(ValueError, match=r"a=10.*b=12"):
        ArrayDataset(a=np.zeros(10), b=np.zeros(12))
    with pytest.raises(ValueError, match="scalar"):
        ArrayDataset(a=np.array(3.0))
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        ArrayDataset(a="missing.npy")


def test_index_out_of_range():
    ds = ArrayDataset(a=np.zeros((10, 2)))
    with pytest.raises(IndexError):
        ds[10]
    with pytest.raises(ValueError, match=r"index 10 .*length 10"):
        ds.__getitems__([10])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_dataloader_matches_tensor_dataset(num_workers):
    x = torch.randn(200, 5)
    y = torch.arange(200)
    ref = DataLoader(
        TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    ours = DataLoader(
        ArrayDataset(x=x, y=y),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(3),
        num_workers=num_workers,
    )
    for (rx, ry), b in zip(ref, ours, strict=True):
        assert torch.equal(b["x"], rx) and torch.equal(b["y"], ry)


def test_batch_outlives_dataset_and_source():
    a = np.arange(30000, dtype=np.float32).reshape(10000, 3)
    ds = ArrayDataset(a=a.copy())
    it = ds.iter_batches(([i, i + 1] for i in range(0, 9000, 2)), 2, 4)
    first = next(it)["a"]
    held = first.numpy()
    for _ in range(100):
        next(it)
    it.close()
    del it, ds
    gc.collect()
    np.testing.assert_array_equal(first.numpy(), a[[0, 1]])
    assert held.base is not None
