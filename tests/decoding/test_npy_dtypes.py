"""Every dtype np.load reads without pickles, against np.load: through the
engine's .npy decoder (WebDataset's decode, one sample and batched), the
decode binding, ``chute inspect``, and ArrayDataset where torch has a type
for it; object arrays are refused as np.load(allow_pickle=False) refuses
them."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chute
import chute.wds as cwds
import numpy as np
import pytest
import torch
import webdataset
from chute import _core
from chute.cli import main
from conftest import npy_bytes

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

_RNG = np.random.default_rng(0)

# name: the array np.save writes.
ARRAYS: dict[str, Callable[[], np.ndarray]] = {
    "bool": lambda: np.array([True, False, True]),
    "int8": lambda: np.arange(-3, 3, dtype=np.int8),
    ">u2": lambda: np.arange(6, dtype=">u2").reshape(2, 3),
    "float16": lambda: _RNG.standard_normal(5).astype(np.float16),
    ">f8-fortran": lambda: np.asfortranarray(_RNG.standard_normal((3, 4)).astype(">f8")),
    "complex64": lambda: (_RNG.standard_normal((2, 3)) + 1j * _RNG.standard_normal((2, 3))).astype(
        np.complex64
    ),
    ">complex128": lambda: (_RNG.standard_normal(4) - 2j).astype(">c16"),
    "complex64-fortran": lambda: np.asfortranarray((np.arange(12) * (1 + 1j)).reshape(3, 4)).astype(
        np.complex64, order="F"
    ),
    "longdouble": lambda: _RNG.standard_normal(3).astype(np.longdouble),
    "record": lambda: np.array(
        [(1, 2.5, b"ab"), (3, -1.0, b"xyz")], dtype=[("a", "<i4"), ("b", ">f8"), ("c", "S3")]
    ),
    "record-nested": lambda: np.array(
        [((1.0, 2.0), [1, 2, 3]), ((3.0, 4.0), [4, 5, 6])],
        dtype=[("p", [("x", "<f4"), ("y", "<f4")]), ("v", "<i2", (3,))],
    ),
    "record-aligned": lambda: np.array(
        [(1, 2), (3, 4)], dtype=np.dtype([("a", "i1"), ("b", "<i8")], align=True)
    ),
    "record-titles": lambda: np.array(
        [(7,)], dtype=np.dtype({"names": ["a"], "formats": ["<i4"], "titles": ["the a"]})
    ),
    "record-fortran": lambda: np.asfortranarray(
        np.arange(6).astype([("a", "<i4")]).reshape(2, 3)  # type: ignore[call-overload]
    ),
    "record-quoted-name": lambda: np.array([(1,)], dtype=[("it's", "<i4")]),
    "datetime64[ns]": lambda: np.array(["2020-01-01T00:00:00.123", "NaT"], dtype="datetime64[ns]"),
    "datetime64[D]": lambda: np.array(["1999-12-31", "2000-01-01"], dtype="datetime64[D]"),
    "datetime64": lambda: np.array(["NaT"], dtype="datetime64"),
    "datetime64[10s]": lambda: np.array([3, 4], dtype="datetime64[10s]"),
    ">timedelta64[us]": lambda: np.array([1, -5], dtype=">m8[us]"),
    "bytes": lambda: np.array([b"hello", b"x", b""], dtype="S5"),
    "str": lambda: np.array(["ab", "ü€x", ""], dtype="<U3"),
    ">str": lambda: np.array(["ab", "ü"], dtype=">U2"),
    "void": lambda: np.array([b"\x01\x02\x03\x04", b"abcd"], dtype="V4"),
    "scalar-complex": lambda: np.array(1 + 2j, dtype=np.complex64),
    "empty-complex": lambda: np.zeros((0, 3), dtype=np.complex64),
}

# dtypes the engine knows by name come out in this machine's byte order
# (np.load keeps the file's); every other dtype is np.load's exactly.
NATIVE_KINDS = "biuf"


def expected_dtype(reference: np.dtype[Any]) -> np.dtype[Any]:
    known = reference.fields is None and reference.kind in NATIVE_KINDS and reference.itemsize <= 8
    return reference.newbyteorder("=") if known else reference


def same_values(got: np.ndarray, ref: np.ndarray) -> bool:
    """Element-wise equality for any dtype (padding bytes of records aside,
    which np.load leaves uninitialised)."""
    if got.shape != ref.shape:
        return False
    if ref.dtype.names is not None:
        return all(same_values(got[n], ref[n]) for n in ref.dtype.names)
    if ref.dtype.kind in "mM":
        native = [a.astype(a.dtype.newbyteorder("=")).view("i8") for a in (got, ref)]
        return np.array_equal(*native)
    if ref.dtype.kind in "fc":
        return np.array_equal(got, ref, equal_nan=True)
    return np.array_equal(got, ref)


def check(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.dtype == expected_dtype(ref.dtype), (got.dtype, ref.dtype)
    assert same_values(got, ref)


def shard(tmp_path: Path, name: str, array: np.ndarray, n: int = 3) -> str:
    path = tmp_path / f"{name}.tar"
    with webdataset.TarWriter(str(path)) as sink:
        for i in range(n):
            sink.write({"__key__": f"k{i}", "npy": npy_bytes(array), "cls": str(i)})
    return str(path)


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_decode_binding_equals_np_load(name: str) -> None:
    data = npy_bytes(ARRAYS[name]())
    check(_core.decode_npy(data, name), np.load(io.BytesIO(data)))


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_webdataset_decode_equals_webdataset(tmp_path: Path, name: str) -> None:
    url = shard(tmp_path, name, ARRAYS[name]())
    reference = list(webdataset.WebDataset(url, shardshuffle=False).decode())
    got = list(chute.WebDataset(url, shardshuffle=False).decode())
    assert [s["__key__"] for s in got] == [s["__key__"] for s in reference]
    for g, r in zip(got, reference, strict=True):
        check(g["npy"], r["npy"])
    # Batched natively: one [B, ...] array of the same dtype, as webdataset
    # stacks it (np.array of the list).
    (rows,) = list(chute.WebDataset(url, shardshuffle=False).decode().to_tuple("npy").batched(3))
    (ref_rows,) = list(
        webdataset.WebDataset(url, shardshuffle=False).decode().to_tuple("npy").batched(3)
    )
    assert same_values(rows[0], ref_rows[0])
    assert rows[0].dtype.descr == expected_dtype(reference[0]["npy"].dtype).descr


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_inspect_reports_np_loads_dtype(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    array = ARRAYS[name]()
    url = shard(tmp_path, name, array, n=1)
    assert main(["inspect", "--json", url]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    npy = report["first_samples"][0]["fields"]["npy"]
    ref = np.load(io.BytesIO(npy_bytes(array)))
    assert npy["dtype"] == str(expected_dtype(ref.dtype))
    assert npy["shape"] == list(ref.shape)


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_array_dataset_reads_what_torch_can_hold(tmp_path: Path, name: str) -> None:
    array = ARRAYS[name]()
    if array.ndim == 0 or array.shape[0] == 0:
        return  # not rows
    path = tmp_path / f"{name}.npy"
    np.save(path, array)
    ref = np.load(path)
    try:
        torch.from_numpy(np.ascontiguousarray(ref.astype(ref.dtype.newbyteorder("="))))
    except TypeError:
        with pytest.raises(ValueError, match="torch has no tensor type"):
            chute.ArrayDataset(x=str(path))
        return
    ds = chute.ArrayDataset(x=str(path))
    rows = ds.__getitems__(list(range(len(ref)))[::-1])
    for i, row in zip(range(len(ref))[::-1], rows, strict=True):
        expected = torch.from_numpy(np.array(ref[i], dtype=ref.dtype.newbyteorder("=")))
        assert row["x"].dtype == expected.dtype
        assert torch.equal(row["x"], expected)


def object_array_npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return out.getvalue()


def test_object_arrays_are_refused_as_np_load_refuses_them(tmp_path: Path) -> None:
    data = object_array_npy()
    with pytest.raises(ValueError, match="allow_pickle"):
        np.load(io.BytesIO(data))
    with pytest.raises(ValueError, match="allow_pickle") as info:
        _core.decode_npy(data, "obj.npy")
    assert isinstance(info.value, chute.DataError)
    path = tmp_path / "obj.tar"
    with webdataset.TarWriter(str(path)) as sink:
        sink.write({"__key__": "a", "npy": npy_bytes(np.arange(3.0))})
        sink.write({"__key__": "b", "npy": data})
        sink.write({"__key__": "c", "npy": npy_bytes(np.arange(3.0))})
    with pytest.raises(chute.DataError, match="allow_pickle") as err:
        list(chute.WebDataset(str(path), shardshuffle=False).decode().to_tuple("__key__", "npy"))
    assert "'b'" in str(err.value) or "b.npy" in str(err.value)
    ds = (
        chute.WebDataset(str(path), shardshuffle=False, handler=cwds.ignore_and_continue)
        .decode()
        .to_tuple("__key__", "npy")
    )
    assert [k for k, _ in ds] == ["a", "c"]
    assert ds.stats()["samples_skipped"] == 1
