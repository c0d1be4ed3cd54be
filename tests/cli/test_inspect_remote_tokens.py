"""``chute inspect`` on token files in object storage (moto's S3): the
report equals the local file's (problems included, naming the url), and
only what the report needs is fetched: a Megatron .bin is never read (its
.idx says it all), a raw .bin is only sized, a .npy gives its header; the
tokens come down only to find documents by --eod-id."""

from __future__ import annotations

import io
import json
import struct
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from remote_servers import S3, FaultProxy

pytest.importorskip("obstore")


def write_megatron(prefix: Path, documents: list[list[list[int]]], dtype: Any) -> None:
    """Megatron's documented .bin + .idx pair (version 1)."""
    dt = np.dtype(dtype)
    sequences = [seq for doc in documents for seq in doc]
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * dt.itemsize
    doc_index = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(np.int64)
    np.concatenate([np.asarray(s, dtype=dt) for s in sequences]).tofile(f"{prefix}.bin")
    code = {np.dtype(np.int32): 4, np.dtype(np.uint16): 8}[dt]
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(sequences), len(doc_index)))
        f.write(lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())


def inspect(paths: list[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    from chute.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["inspect", "--json", *paths, *args])
    return code, json.loads(out.getvalue())


def test_inspect_remote_token_files_as_local_ones(moto_s3: S3, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(1, 500, size=5000).astype(np.uint16)
    raw[rng.choice(5000, size=40, replace=False)] = 0
    raw.tofile(tmp_path / "raw.bin")
    np.save(tmp_path / "s.npy", raw.astype(np.int32))
    documents = [[rng.integers(0, 9, size=int(n)).tolist()] for n in rng.integers(1, 300, 60)]
    write_megatron(tmp_path / "m", documents, np.int32)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    write_megatron(tmp_path / "cut", [[[1, 2], [3]]], np.uint16)
    (tmp_path / "cut.idx").write_bytes((tmp_path / "cut.idx").read_bytes()[:-3])
    names = ["raw.bin", "s.npy", "m.bin", "m.idx", "odd.bin", "cut.bin"]
    objects = {n: (tmp_path / n).read_bytes() for n in names + ["cut.idx"]}
    moto_s3.bucket("tokens", {f"lm/{n}": data for n, data in objects.items()})
    local = [str(tmp_path / n) for n in names]
    urls = [f"s3://tokens/lm/{n}" for n in names]

    with FaultProxy(moto_s3.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        settings = [
            f"endpoint={proxy.url}",
            "access_key_id=testing",
            "secret_access_key=testing",
            "region=us-east-1",
        ]
        options = [arg for s in settings for arg in ("--storage-option", s)]
        for args in (["--dtype", "uint16"], ["--dtype", "uint16", "--eod-id", "0"]):
            code, want = inspect(local, *args)
            del proxy.requests[:]
            got_code, got = inspect(urls, *args, *options)
            assert (got_code, code) == (1, 1)  # odd.bin and cut.idx are reported
            for report, expected, url in zip(got, want, urls, strict=True):
                assert report["path"] == url
                text = json.dumps(expected).replace(str(tmp_path), "s3://tokens/lm")
                assert report == {**json.loads(text), "path": url}
            # What was fetched: the .idx files whole, the .npy's header, the
            # tokens of raw.bin and s.npy only to find their documents.
            fetched: dict[str, list[str | None]] = {}
            for r in proxy.requests:
                if r.method == "GET":
                    fetched.setdefault(r.path.rsplit("/", 1)[-1], []).append(r.range)
            header = (tmp_path / "s.npy").stat().st_size - 5000 * 4
            if "--eod-id" in args:
                assert set(fetched) == {"raw.bin", "s.npy", "m.idx", "odd.bin", "cut.idx"}
                assert fetched["raw.bin"] == ["bytes=0-9999"]
            else:
                assert set(fetched) == {"s.npy", "m.idx", "cut.idx"}
                assert fetched["s.npy"] == ["bytes=0-11", f"bytes=0-{header - 1}"]

    assert got[2]["format"] == got[3]["format"] == "megatron"
    assert got[2]["documents"] == 60 and got[2]["tokens"] == sum(len(d[0]) for d in documents)
    ends = int((raw == 0).sum()) + int(raw[-1] != 0)  # a last document without its end token
    assert got[0]["documents"] == got[1]["documents"] == ends
    assert "s3://tokens/lm/cut.idx': 71 bytes, but its header" in got[5]["problems"][0]
    assert "s3://tokens/lm/odd.bin': 3 bytes is not a whole number" in got[4]["problems"][0]
