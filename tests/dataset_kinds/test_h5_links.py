"""H5Dataset over links and over datasets h5py alone reads: the rows are
h5py's, wherever HDF5 finds them."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import chute
import h5py
import numpy as np
import pytest
import torch
from chute import H5Dataset, SlowPathWarning

ROWS = 40


def h5py_rows(path: Path, name: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return np.asarray(f[name][()])


def assert_rows_match_h5py(ds: H5Dataset, path: Path, fields: dict[str, str]) -> None:
    """Every row, single and in shuffled batches, and through a loader."""
    expected = {name: h5py_rows(path, ds_path) for name, ds_path in fields.items()}
    for name, ref in expected.items():
        assert len(ds) == len(ref)
        for i in (0, 7, len(ref) - 1):
            np.testing.assert_array_equal(ds[i][name].numpy(), ref[i])
    order = np.random.default_rng(3).permutation(len(ds))
    batches = [order[i : i + 6] for i in range(0, len(ds), 6)]
    for idx, got in zip(batches, ds.iter_batches(batches, 2, 2), strict=True):
        for name, ref in expected.items():
            np.testing.assert_array_equal(got[name].numpy(), ref[idx])
    loaded = list(chute.DataLoader(ds, batch_size=16))
    for name, ref in expected.items():
        np.testing.assert_array_equal(torch.cat([b[name] for b in loaded]).numpy(), ref)


@pytest.fixture()
def linked(tmp_path: Path) -> Path:
    """a.h5 with its own `n`, an external link `x` (relative: sub/b.h5, which
    HDF5 resolves beside a.h5), a soft link `s` and a link into b.h5's lzf
    dataset."""
    (tmp_path / "sub").mkdir()
    rng = np.random.default_rng(1)
    with h5py.File(tmp_path / "sub" / "b.h5", "w") as f:
        f["x"] = rng.standard_normal((ROWS, 3)).astype("f4") + 100
        f.create_dataset("lz", data=np.arange(ROWS * 2).reshape(ROWS, 2), compression="lzf")
        f.create_dataset(
            "chunked", data=np.arange(ROWS, dtype="i8") * 3, chunks=(8,), compression="gzip"
        )
    with h5py.File(tmp_path / "a.h5", "w") as f:
        # Same shape and dtype as b.h5's x, at its own offset: read from the
        # wrong file, these are the bytes that come back.
        f["n"] = rng.standard_normal((ROWS, 3)).astype("f4")
        f["x"] = h5py.ExternalLink("sub/b.h5", "/x")
        f["lz"] = h5py.ExternalLink("sub/b.h5", "/lz")
        f["chunked"] = h5py.ExternalLink("sub/b.h5", "/chunked")
        f["g/y"] = np.arange(ROWS, dtype="i4")
        f["s"] = h5py.SoftLink("/g/y")
    return tmp_path / "a.h5"


def test_external_links_read_the_linked_files_rows(
    linked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From elsewhere: the link resolves beside a.h5, not in the working directory.
    monkeypatch.chdir(linked.parent / "sub")
    fields = {"x": "x", "n": "n", "chunked": "chunked", "s": "s"}
    ds = H5Dataset(linked, fields)
    assert ds._slow == set()  # all native, from the file HDF5 found
    assert_rows_match_h5py(ds, linked, fields)
    assert not np.array_equal(h5py_rows(linked, "x"), h5py_rows(linked, "n"))


def test_an_external_link_to_a_slow_path_dataset(
    linked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.warns(SlowPathWarning, match="lzf"):
        ds = H5Dataset(linked, ["lz", "n"])
    # The read happens later, from another working directory.
    monkeypatch.chdir(linked.parent / "sub")
    assert_rows_match_h5py(ds, linked, {"lz": "lz", "n": "n"})


def test_external_link_targets_are_bound_to_their_file(linked: Path) -> None:
    ds = H5Dataset(linked, ["x"])
    ds[0]
    target = linked.parent / "sub" / "b.h5"
    with h5py.File(target, "a") as f:
        f.attrs["touched"] = 1  # rewrites the linked file
    os.utime(target, ns=(0, 0))
    with pytest.raises(chute.ReadError, match="b.h5"):
        for _ in ds.iter_batches([np.arange(ROWS)], 1, 1):
            pass


def test_a_dangling_link_is_named(linked: Path) -> None:
    with h5py.File(linked, "a") as f:
        f["gone"] = h5py.ExternalLink("missing.h5", "/x")
        f["nowhere"] = h5py.SoftLink("/not/there")
    with pytest.raises(KeyError, match=r"'gone' is a link to '/x' in 'missing.h5' that leads"):
        H5Dataset(linked, ["gone"])
    with pytest.raises(KeyError, match=r"'nowhere' is a link to '/not/there' that leads"):
        H5Dataset(linked, ["nowhere"])


def test_a_missing_key_lists_the_datasets_the_file_has(linked: Path) -> None:
    with pytest.raises(KeyError) as info:
        H5Dataset(linked, ["nn"])
    assert str(info.value) == (
        f"\"{linked}: dataset 'nn' not found; the file has datasets 'chunked', 'g/y', 'lz', "
        "'n', 's', 'x'\""
    )
    with pytest.raises(KeyError, match=r"'g' is a group, not a dataset; the file has datasets"):
        H5Dataset(linked, ["g"])
    with pytest.raises(KeyError, match=r"'g/nope' not found"):
        H5Dataset(linked, ["g/nope"])
    many = linked.parent / "many.h5"
    with h5py.File(many, "w") as f:
        for i in range(30):
            f[f"d{i:02d}"] = np.zeros(2)
    with pytest.raises(KeyError, match=r"datasets 'd00', 'd01', .*'d19', \.\.\.\"$"):
        H5Dataset(many, ["x"])


# -- every field on h5py's path -------------------------------------------------------


def write_lzf(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "v", data=np.arange(ROWS * 3, dtype="f4").reshape(ROWS, 3), compression="lzf"
        )


def write_virtual(path: Path) -> None:
    halves = []
    for i in range(2):
        source = path.parent / f"part{i}.h5"
        with h5py.File(source, "w") as f:
            f["p"] = np.arange(ROWS // 2, dtype="i8") + 1000 * i
        halves.append(source)
    layout = h5py.VirtualLayout(shape=(ROWS,), dtype="i8")
    for i, source in enumerate(halves):
        layout[i * (ROWS // 2) : (i + 1) * (ROWS // 2)] = h5py.VirtualSource(
            source.name, "p", shape=(ROWS // 2,)
        )
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)


def write_external_storage(path: Path) -> None:
    raw = path.parent / "raw.bin"
    data = np.arange(ROWS * 2, dtype="<i4").reshape(ROWS, 2) * 7
    raw.write_bytes(data.tobytes())
    with h5py.File(path, "w") as f:
        f.create_dataset("v", shape=data.shape, dtype="<i4", external=[(str(raw), 0, data.nbytes)])


@pytest.mark.parametrize("kind", ["lzf", "virtual", "external_storage"])
def test_a_dataset_whose_every_field_takes_the_h5py_path(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "only.h5"
    {"lzf": write_lzf, "virtual": write_virtual, "external_storage": write_external_storage}[kind](
        path
    )
    with pytest.warns(SlowPathWarning):
        ds = H5Dataset(path, ["v"])
    assert ds._slow == {"v"}
    assert_rows_match_h5py(ds, path, {"v": "v"})
    assert ds[-1]["v"].tolist() == np.asarray(h5py_rows(path, "v")[-1]).tolist()
    with pytest.raises(IndexError, match=f"index {ROWS} is out of range for a dataset of length"):
        ds[ROWS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SlowPathWarning)
        torch_rows = [b["v"] for b in torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)]
    np.testing.assert_array_equal(torch.cat(torch_rows).numpy(), h5py_rows(path, "v"))


def test_external_links_in_a_remote_file_are_refused(linked: Path) -> None:
    pytest.importorskip("obstore")
    from chute.remote import RemoteOptions
    from remote_servers import ObjectServer

    absolute = linked.parent / "absolute.h5"
    with h5py.File(absolute, "w") as f:
        f["n"] = np.zeros((ROWS, 3), dtype="f4")
        # An absolute name: h5py would open this machine's file for it.
        f["x"] = h5py.ExternalLink(str(linked.parent / "sub" / "b.h5"), "/x")
    with ObjectServer() as server:
        server.objects["/absolute.h5"] = absolute.read_bytes()
        url = f"{server.url}/absolute.h5"
        options = RemoteOptions(backoff_s=0.01, max_backoff_s=0.05)
        assert len(H5Dataset(url, ["n"], remote=options)) == ROWS
        with pytest.raises(
            ValueError,
            match=r"absolute.h5: dataset 'x' is an external link into .*b.h5'; chute follows "
            "external links of local files only",
        ):
            H5Dataset(url, ["x", "n"], remote=options)
