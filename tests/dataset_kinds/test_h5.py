import gc
import os
import threading
import time
import weakref

import chute_testing
import h5py
import numpy as np
import pytest
import torch
from chute import DataError, H5Dataset, ReadError, SlowPathWarning
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

N = 500


def _write(path, name, data, **kwargs):
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=data, **kwargs)


def _reference(paths, ds_path):
    parts = []
    for p in paths:
        with h5py.File(p, "r") as f:
            parts.append(f[ds_path][()])
    return np.concatenate(parts)


def _batches(n, rng, size=37):
    seq = [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
    perm = rng.permutation(n)
    rnd = [perm[i : i + size] for i in range(0, n, size)]
    dup = [rng.integers(0, n, size)]  # repeated indices
    return seq + rnd + dup


def _check(ds, refs, rng, threads=2):
    n = len(ds)
    batches = _batches(n, rng)
    for idx, got in zip(batches, ds.iter_batches(batches, threads, 3), strict=True):
        for name, ref in refs.items():
            expected = ref[idx]
            out = got[name].numpy()
            assert out.dtype == expected.dtype.newbyteorder("="), name
            np.testing.assert_array_equal(out, expected)
    # __getitems__ and __getitem__ agree too
    idx = batches[-2]
    rows = ds.__getitems__(list(idx))
    for name, ref in refs.items():
        np.testing.assert_array_equal(np.stack([r[name].numpy() for r in rows]), ref[idx])
        np.testing.assert_array_equal(ds[int(idx[0])][name].numpy(), ref[idx[0]])
        np.testing.assert_array_equal(ds[-1][name].numpy(), ref[-1])


LAYOUTS = {
    "contiguous": {},
    "chunked": {"chunks": (32, 3, 4)},
    "gzip": {"chunks": (32, 3, 4), "compression": "gzip"},
    "gzip_shuffle": {"chunks": (32, 3, 4), "compression": "gzip", "shuffle": True},
    "fletcher32": {"chunks": (32, 3, 4), "fletcher32": True},
    "all_filters": {
        "chunks": (50, 3, 4),
        "compression": "gzip",
        "shuffle": True,
        "fletcher32": True,
    },
    "split_dims": {"chunks": (7, 2, 3), "compression": "gzip"},
    "whole_rows": {"chunks": (64, 3, 4), "compression": "gzip", "compression_opts": 9},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_match_h5py(tmp_path, layout):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((N, 3, 4)).astype(np.float32)
    path = tmp_path / "a.h5"
    _write(path, "x", data, **LAYOUTS[layout])
    ds = H5Dataset(path, ["x"])
    _check(ds, {"x": _reference([path], "x")}, rng)


@pytest.mark.parametrize(
    "dtype",
    ["u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "?", ">f4", ">i8", ">u2"],
)
@pytest.mark.parametrize("chunked", [False, True])
def test_every_dtype(tmp_path, dtype, chunked):
    rng = np.random.default_rng(2)
    data = (rng.standard_normal((N, 5)) * 100).astype(dtype)
    path = tmp_path / "d.h5"
    kw = {"chunks": (40, 5), "compression": "gzip", "shuffle": True} if chunked else {}
    _write(path, "x", data, **kw)
    ds = H5Dataset(path, {"v": "x"})
    _check(ds, {"v": _reference([path], "x")}, rng)


@pytest.mark.parametrize("kw", [{}, {"chunks": (64,), "compression": "gzip", "shuffle": True}])
def test_scalar_rows_and_nd_rows(tmp_path, kw):
    rng = np.random.default_rng(3)
    path = tmp_path / "s.h5"
    _write(path, "ids", np.arange(N, dtype=np.int64) * 3, **kw)
    _write(path, "img", rng.integers(0, 255, (N, 2, 3, 4, 5), dtype=np.uint8))
    ds = H5Dataset(path, {"id": "ids", "img": "img"})
    assert ds[4]["id"].shape == ()
    _check(ds, {"id": _reference([path], "ids"), "img": _reference([path], "img")}, rng)


def test_big_endian_shuffled_chunks(tmp_path):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((N, 6)).astype(">f8")
    path = tmp_path / "be.h5"
    _write(path, "x", data, chunks=(16, 4), compression="gzip", shuffle=True, fletcher32=True)
    ds = H5Dataset(path, ["x"])
    assert ds[0]["x"].dtype == torch.float64
    _check(ds, {"x": _reference([path], "x")}, rng)


@pytest.mark.parametrize("fill", [0, -7])
@pytest.mark.parametrize("compressed", [False, True])
def test_unallocated_chunks_read_fill_value(tmp_path, fill, compressed):
    path = tmp_path / "u.h5"
    kw = {"compression": "gzip"} if compressed else {}
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(N, 10), dtype="i4", chunks=(20, 4), fillvalue=fill, **kw)
        d[100:150, 3:7] = 5  # only some chunks get written
        d[400] = np.arange(10)
        f.create_dataset("empty", shape=(N,), dtype="f4", fillvalue=fill)  # never written
        f.create_dataset("rows", shape=(N, 3), dtype="u2", chunks=(50, 3), fillvalue=fill + 9)
        f["rows"][0:50] = 1
    with h5py.File(path, "r") as f:
        assert f["x"].id.get_num_chunks() < 25 * 3
        assert f["empty"].id.get_offset() is None
    ds = H5Dataset(path, ["x", "empty", "rows"])
    refs = {k: _reference([path], k) for k in ["x", "empty", "rows"]}
    _check(ds, refs, np.random.default_rng(5))


def test_lzf_takes_slow_path_with_warning(tmp_path):
    rng = np.random.default_rng(6)
    path = tmp_path / "lzf.h5"
    _write(path, "x", rng.standard_normal((N, 8)).astype("f4"), chunks=(32, 8), compression="lzf")
    _write(path, "y", np.arange(N, dtype="i4"))
    with pytest.warns(SlowPathWarning, match="'/x'.*lzf"):
        ds = H5Dataset(path, ["x", "y"])
    _check(ds, {"x": _reference([path], "x"), "y": _reference([path], "y")}, rng)
    assert ds.stats()["python_items"] > 0


def _many_files(tmp_path, count=40, seed=7):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        p = tmp_path / f"sess{i:02d}.h5"
        rows = int(rng.integers(4, 30))
        _write(
            p,
            "betas",
            rng.standard_normal((rows, 9)).astype("f4"),
            chunks=(4, 9),
            compression="gzip",
            shuffle=True,
        )
        _write(p, "ids", np.arange(rows, dtype=np.int32) + 1000 * i)
        paths.append(p)
    return paths


def test_multi_file_glob_and_list(tmp_path):
    paths = _many_files(tmp_path)
    refs = {"voxels": _reference(paths, "betas"), "id": _reference(paths, "ids")}
    fields = {"voxels": "betas", "id": "ids"}
    ds = H5Dataset(str(tmp_path / "sess*.h5"), fields, max_open_files=3)
    assert len(ds) == len(refs["id"])
    _check(ds, refs, np.random.default_rng(8), threads=4)
    st = ds.stats()
    assert st["open_files"] <= 3 + 4  # bound, plus descriptors held by reading threads
    assert st["file_opens"] > 3
    assert st["chunk_cache_hits"] > 0 and st["chunk_cache_misses"] > 0
    ds2 = H5Dataset([str(p) for p in paths], fields, chunk_cache_bytes=0)
    _check(ds2, refs, np.random.default_rng(9))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_torch_dataloader_getitems(tmp_path, num_workers, shuffle):
    paths = _many_files(tmp_path, count=5)
    refs = {"voxels": _reference(paths, "betas"), "id": _reference(paths, "ids")}
    ds = H5Dataset(paths, {"voxels": "betas", "id": "ids"})
    ds.__getitems__([0, 1])  # native state in the parent must not leak into workers
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(ds, batch_size=16, shuffle=shuffle, num_workers=num_workers, generator=g)
    order = list(
        BatchSampler(
            RandomSampler(ds, generator=torch.Generator().manual_seed(0))
            if shuffle
            else SequentialSampler(ds),
            16,
            False,
        )
    )
    seen = []
    for batch in loader:
        ids = batch["id"].numpy()
        pos = np.searchsorted(refs["id"], ids) if not shuffle else None
        rows = np.array([np.nonzero(refs["id"] == i)[0][0] for i in ids])
        if pos is not None:
            np.testing.assert_array_equal(pos, rows)
        np.testing.assert_array_equal(batch["voxels"].numpy(), refs["voxels"][rows])
        assert batch["voxels"].shape == (len(ids), 9)
        assert batch["id"].dtype == torch.int32
        seen.extend(rows.tolist())
    assert sorted(seen) == list(range(len(ds)))
    assert len(order) == len(loader)


def test_order_is_submission_order_with_many_threads(tmp_path):
    rng = np.random.default_rng(10)
    path = tmp_path / "o.h5"
    _write(path, "i", np.arange(20000, dtype=np.int64), chunks=(100,), compression="gzip")
    ds = H5Dataset(path, {"i": "i"})
    batches = [rng.integers(0, 20000, int(rng.integers(1, 700))) for _ in range(200)]
    out = list(ds.iter_batches(batches, num_threads=8, prefetch=16))
    assert len(out) == len(batches)
    for idx, got in zip(batches, out, strict=True):
        np.testing.assert_array_equal(got["i"].numpy(), idx)
    # empty batches are allowed and keep their place
    out = list(ds.iter_batches([[], [3], []], 2, 2))
    assert [b["i"].tolist() for b in out] == [[], [3], []]


# -- bad input ---------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.h5"):
        H5Dataset(tmp_path / "nope.h5", ["x"])
    with pytest.raises(FileNotFoundError, match="none"):
        H5Dataset(str(tmp_path / "none*.h5"), ["x"])


def test_field_absent_from_one_file(tmp_path):
    paths = _many_files(tmp_path, count=3)
    with h5py.File(paths[1], "a") as f:
        del f["ids"]
    with pytest.raises(KeyError, match=r"sess01\.h5.*'ids'"):
        H5Dataset(paths, ["betas", "ids"])


def test_mismatched_shapes_and_dtypes(tmp_path):
    a, b, c = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "c.h5"
    _write(a, "x", np.zeros((5, 3), "f4"))
    _write(b, "x", np.zeros((5, 4), "f4"))
    _write(c, "x", np.zeros((5, 3), "f8"))
    with pytest.raises(ValueError, match=r"a\.h5.*b\.h5"):
        H5Dataset([a, b], ["x"])
    with pytest.raises(ValueError, match=r"a\.h5.*c\.h5"):
        H5Dataset([a, c], ["x"])
    # big-endian vs little-endian of the same type is fine
    d = tmp_path / "d.h5"
    _write(d, "x", np.arange(15, dtype=">f4").reshape(5, 3))
    ds = H5Dataset([a, d], ["x"])
    np.testing.assert_array_equal(ds[6]["x"].numpy(), [3, 4, 5])


def test_index_out_of_range(tmp_path):
    path = tmp_path / "r.h5"
    _write(path, "x", np.zeros((10, 2), "f4"))
    ds = H5Dataset(path, ["x"])
    with pytest.raises(IndexError, match="10"):
        ds[10]
    with pytest.raises(ValueError, match=r"index 12 .*length 10"):
        ds.__getitems__([1, 12])
    with pytest.raises(ValueError, match=r"index -11 .*length 10"):
        list(ds.iter_batches([[0], [-11]], 2, 2))
    # the shared engine still works after an error
    assert ds.__getitems__([-1])[0]["x"].shape == (2,)


def test_file_truncated_after_open(tmp_path):
    path = tmp_path / "t.h5"
    _write(path, "x", np.arange(4000, dtype="f4").reshape(1000, 4))
    ds = H5Dataset(path, ["x"])
    assert ds[999]["x"][0] == 3996
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(ReadError, match=r"t\.h5.*changed.*row 999.*offset"):
        ds[999]
    # a fresh process state (as in a worker) reopens and notices it too
    ds2 = H5Dataset.__new__(H5Dataset)
    ds2.__setstate__(ds.__getstate__())
    with pytest.raises(ReadError, match=r"t\.h5"):
        ds2.__getitems__([999])


def test_corrupt_deflate_chunk(tmp_path):
    path = tmp_path / "c.h5"
    rng = np.random.default_rng(11)
    data = rng.standard_normal((256, 16)).astype("f4")
    _write(path, "x", data, chunks=(64, 16), compression="gzip")
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(2)
    stat = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 10)
        fh.write(b"\xff" * 40)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as if corrupted before open
    ds = H5Dataset(path, ["x"])
    np.testing.assert_array_equal(ds[0]["x"].numpy(), data[0])  # other chunks are intact
    with pytest.raises(DataError, match=rf"c\.h5.*'/x' chunk 2 .*byte offset {info.byte_offset}"):
        ds.__getitems__([3, 130])


# -- memory and shutdown ---------------------------------------------------------------------


def test_returned_tensor_outlives_dataset(tmp_path):
    path = tmp_path / "k.h5"
    data = np.arange(3000, dtype="f8").reshape(1000, 3)
    _write(path, "x", data, chunks=(100, 3), compression="gzip")
    ds = H5Dataset(path, ["x"])
    it = ds.iter_batches([[5, 6, 7]] + [list(range(i, i + 50)) for i in range(0, 900, 50)], 2, 4)
    first = next(it)["x"]
    base = first.numpy().base
    refs = [weakref.ref(ds)]
    assert first.numpy().base is not None and base is not None
    for _ in range(5):
        next(it)  # more batches stream through recycled buffers
    it.close()
    del it, ds
    gc.collect()
    assert refs[0]() is None
    np.testing.assert_array_equal(first.numpy(), data[[5, 6, 7]])
    # the tensor's storage is held by exactly the numpy array → capsule chain
    assert first.sum().item() == data[[5, 6, 7]].sum()


def test_break_out_of_iter_batches_does_not_hang(tmp_path):
    path = tmp_path / "b.h5"
    _write(path, "x", np.zeros((100000, 16), "f4"), chunks=(1000, 16), compression="gzip")
    ds = H5Dataset(path, ["x"])
    before = threading.active_count()

    def endless():
        i = 0
        while True:
            yield np.arange(i, i + 256) % 100000
            i += 256

    start = time.monotonic()
    gen = ds.iter_batches(endless(), num_threads=4, prefetch=8)
    for k, _ in enumerate(gen):
        if k == 20:
            break
    gen.close()
    assert gen.gi_frame is None  # generator finished: its finally closed the engine
    del gen
    assert time.monotonic() - start < 10
    assert threading.active_count() == before  # native threads are not Python threads
    assert ds.stats()["batches"] >= 21


def test_timeout(tmp_path):
    path = tmp_path / "to.h5"
    _write(path, "x", np.zeros((10, 2), "f4"))
    ds = H5Dataset(path, ["x"])

    def slow():
        yield [0]
        time.sleep(0.01)
        yield [1]

    assert len(list(ds.iter_batches(slow(), 1, 1, timeout=5))) == 2


def test_pickle_roundtrip(tmp_path):
    import pickle

    paths = _many_files(tmp_path, count=3)
    ds = H5Dataset(paths, ["betas"])
    ds.__getitems__([0])
    ds2 = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(ds2[3]["betas"].numpy(), ds[3]["betas"].numpy())


# -- unfiltered storage served through the chunk cache -------------------------------------


def test_contiguous_rows_through_cached_blocks(tmp_path):
    # 56-byte rows do not divide the 64 KiB cache blocks, so rows straddle
    # block edges; 5,000 rows make 5 blocks and 1,234 rows 2, the last of each
    # partial. Two files,
    # one big-endian, cover the file index and the byte swap on this path.
    rng = np.random.default_rng(7)
    a = rng.standard_normal((5000, 7))
    b = rng.standard_normal((1234, 7)).astype(">f8")
    _write(tmp_path / "a.h5", "x", a)
    _write(tmp_path / "b.h5", "x", b)
    ds = H5Dataset([tmp_path / "a.h5", tmp_path / "b.h5"], ["x"], mmap=False)
    ref = np.concatenate([a, b.astype("=f8")])
    _check(ds, {"x": ref}, rng)
    s = ds.stats()
    assert s["chunk_cache_misses"] == 5 + 2  # each block read once
    assert s["chunk_cache_hits"] > 0
    assert s["chunk_cache_bytes"] == ref.nbytes
    # a second pass over shuffled rows reads nothing from the files
    before = ds.stats()["source_bytes_read"]
    perm = rng.permutation(len(ds))
    got = np.concatenate([x["x"].numpy() for x in ds.iter_batches(np.array_split(perm, 31), 2, 3)])
    np.testing.assert_array_equal(got, ref[perm])
    assert ds.stats()["source_bytes_read"] == before


def test_plain_chunks_through_cache(tmp_path):
    rng = np.random.default_rng(8)
    data = rng.integers(0, 1 << 30, (3000, 5), dtype="i4")
    _write(tmp_path / "c.h5", "x", data, chunks=(100, 5))
    ds = H5Dataset(tmp_path / "c.h5", ["x"])
    _check(ds, {"x": data}, rng)
    assert ds.stats()["chunk_cache_misses"] == 30


def test_unfiltered_data_larger_than_cache_share_reads_directly(tmp_path):
    # Half the cache is the most unfiltered data may claim; beyond it rows are
    # read straight from the file (random rows would otherwise each pull a
    # whole block and evict one another).
    rng = np.random.default_rng(9)
    data = rng.standard_normal((4000, 8)).astype("f4")  # 128,000 bytes
    _write(tmp_path / "d.h5", "x", data)
    ds = H5Dataset(tmp_path / "d.h5", ["x"], chunk_cache_bytes=200_000)
    _check(ds, {"x": data}, rng)
    s = ds.stats()
    assert s["chunk_cache_misses"] == 0 and s["chunk_cache_bytes"] == 0
    ds = H5Dataset(tmp_path / "d.h5", ["x"], chunk_cache_bytes=0)
    _check(ds, {"x": data}, rng)


def test_contiguous_rows_through_the_mapping(tmp_path):
    # The default for contiguous data: rows copied out of a file mapping, no
    # chunk cache. Rows of odd sizes, small and large, two files, one of them
    # big-endian, a third empty.
    rng = np.random.default_rng(17)
    a = rng.standard_normal((3001, 7))
    b = rng.standard_normal((999, 7)).astype(">f8")
    big = rng.integers(-(2**31), 2**31, (4000, 1031), dtype="i4")  # rows of 4,124 bytes
    _write(tmp_path / "a.h5", "x", a)
    _write(tmp_path / "a.h5", "big", big[:3001])
    _write(tmp_path / "b.h5", "x", b)
    _write(tmp_path / "b.h5", "big", big[3001:])
    _write(tmp_path / "e.h5", "x", np.empty((0, 7)))
    _write(tmp_path / "e.h5", "big", np.empty((0, 1031), dtype="i4"))
    files = [tmp_path / "a.h5", tmp_path / "e.h5", tmp_path / "b.h5"]
    ds = H5Dataset(files, ["x", "big"])
    _check(ds, {"x": np.concatenate([a, b.astype("=f8")]), "big": big}, rng)
    s = ds.stats()
    assert s["chunk_cache_misses"] == 0 and s["chunk_cache_bytes"] == 0
    # the same rows through pread
    plain = H5Dataset(files, ["x", "big"], mmap=False)
    for i in (0, 3000, 3001, 3999):
        assert all(torch.equal(ds[i][k], plain[i][k]) for k in ("x", "big"))


def test_mapped_range_past_the_end_of_the_file_raises_instead_of_crashing(tmp_path):
    # A file truncated while its rows are being copied out of a mapping makes
    # the kernel send SIGBUS; the copy turns it into ReadError. (The fstat
    # check before each read catches truncation that happened earlier; this
    # is the race it cannot see, driven directly.)
    path = tmp_path / "short.bin"
    path.write_bytes(bytes(range(256)) * 32)  # 8 KiB
    assert chute_testing.mapped_read(str(path), 100, 50) == (bytes(range(256)) * 32)[100:150]
    with pytest.raises(ReadError, match=r"short\.bin.*ends inside"):
        chute_testing.mapped_read(str(path), 0, 64 << 10)
    # the process is fine and so is the next copy
    assert chute_testing.mapped_read(str(path), 8000, 192) == (bytes(range(256)) * 32)[8000:]


def test_file_truncated_after_open_while_mapped(tmp_path):
    path = tmp_path / "m.h5"
    _write(path, "x", np.arange(40000, dtype="f4").reshape(10000, 4))
    ds = H5Dataset(path, ["x"])
    assert float(ds[9999]["x"][0]) == 39996
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(ReadError, match=r"m\.h5.*changed.*row 9999"):
        ds[9999]


def test_file_truncated_after_blocks_were_cached(tmp_path):
    path = tmp_path / "t.h5"
    _write(path, "x", np.arange(40000, dtype="f4").reshape(10000, 4))
    ds = H5Dataset(path, ["x"], mmap=False)
    np.testing.assert_array_equal(ds.__getitems__(list(range(10000)))[-1]["x"].numpy()[0], 39996)
    assert ds.stats()["chunk_cache_bytes"] == 160000
    os.truncate(path, os.path.getsize(path) // 2)
    # every row is cached, yet the change is still noticed before any is used
    with pytest.raises(ReadError, match=r"t\.h5.*changed.*row 3.*offset"):
        ds[3]
    with pytest.raises(ReadError, match=r"t\.h5.*changed.*row 5 .*offset"):
        list(ds.iter_batches([[9999, 5]], 2, 1))
