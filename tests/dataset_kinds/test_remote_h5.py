"""HDF5 files in object storage: H5Dataset over S3 (moto) and http(s) equals
h5py on the local file (contiguous, gzip+shuffle chunked, chunks split
across the row, small rows through cached blocks), a batch fetches only the
extents and chunks it needs (counted at the server), the chunk cache spares
repeated fetches, globs are listed on the bucket, and a cache_dir
downloads each file once and reads it locally. Also ``chute inspect`` and
``chute index`` on remote urls."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import chute
import h5py
import numpy as np
import pytest
import torch
from conftest import tiny_samples, write_shards
from helpers import remote_test_options
from remote_servers import S3, FaultProxy, ObjectServer

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

remote = pytest.importorskip("chute.remote")
pytest.importorskip("obstore")

KiB = 1024


def options(**overrides: Any) -> Any:
    return remote_test_options(256 * KiB, **overrides)


def write_h5(path: Path, seed: int = 0, rows: int = 500) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = {
        "big": rng.standard_normal((rows, 1200)).astype(np.float32),  # 4800-byte rows
        "small": rng.integers(0, 1 << 30, (rows, 8)).astype(np.int32),  # cached blocks
        "gz": rng.standard_normal((rows, 40)).astype(np.float64),
        "split": rng.integers(0, 255, (rows, 6, 10)).astype(np.uint8),
    }
    with h5py.File(path, "w") as f:
        f.create_dataset("big", data=data["big"])
        f.create_dataset("small", data=data["small"])
        f.create_dataset("gz", data=data["gz"], chunks=(32, 40), compression="gzip", shuffle=True)
        f.create_dataset("split", data=data["split"], chunks=(20, 4, 5), compression="gzip")
    return data


def collate(ds: chute.H5Dataset, rows: list[int]) -> dict[str, np.ndarray]:
    batch = torch.utils.data.default_collate(ds.__getitems__(rows))
    return {k: v.numpy() for k, v in batch.items()}


@pytest.fixture
def h5_files(tmp_path: Path) -> tuple[list[Path], list[dict[str, np.ndarray]]]:
    paths = [tmp_path / f"session-{i}.h5" for i in range(2)]
    return paths, [write_h5(p, seed=i, rows=300 + 100 * i) for i, p in enumerate(paths)]


FIELDS = ["big", "small", "gz", "split"]


@pytest.mark.parametrize("backend", ["http", "s3"])
def test_h5_over_a_store_equals_h5py(
    backend: str,
    h5_files: tuple[list[Path], list[dict[str, np.ndarray]]],
    object_server: ObjectServer,
    request: pytest.FixtureRequest,
):
    paths, arrays = h5_files
    if backend == "http":
        for p in paths:
            object_server.objects[f"/h5/{p.name}"] = p.read_bytes()
        urls: Any = [f"{object_server.url}/h5/{p.name}" for p in paths]
        kwargs: dict[str, Any] = {}
    else:
        s3: S3 = request.getfixturevalue("moto_s3")
        s3.bucket("h5-equal", {f"sessions/{p.name}": p.read_bytes() for p in paths})
        urls = "s3://h5-equal/sessions/*.h5"  # listed on the bucket
        kwargs = {"storage_options": s3.storage_options()}
    ds = chute.H5Dataset(urls, FIELDS, remote=options(), **kwargs)
    local = chute.H5Dataset([str(p) for p in paths], FIELDS)
    assert len(ds) == len(local) == 700
    full = {k: np.concatenate([a[k] for a in arrays]) for k in FIELDS}
    rng = np.random.default_rng(1)
    for rows in ([0, 1, 2, 299, 300, 699], list(rng.permutation(700)[:64]), [5, 5, 4]):
        got = collate(ds, rows)
        for k in FIELDS:
            assert np.array_equal(got[k], full[k][rows]), k
    loader = chute.DataLoader(
        ds, batch_size=50, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    reference = chute.DataLoader(
        local, batch_size=50, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    for a, b in zip(loader, reference, strict=True):
        for k in FIELDS:
            assert torch.equal(a[k], b[k])


def _ranges(server: FaultProxy, since: int) -> list[tuple[int, int]]:
    out = []
    for r in server.requests[since:]:
        if r.method == "GET" and r.range:
            m = re.match(r"bytes=(\d+)-(\d+)", r.range)
            assert m is not None
            out.append((int(m.group(1)), int(m.group(2)) + 1))
    return out


def test_a_batch_fetches_only_what_it_needs(tmp_path: Path, object_server: ObjectServer):
    path = tmp_path / "one.h5"
    arrays = write_h5(path, rows=2000)
    object_server.objects["/one.h5"] = path.read_bytes()
    with h5py.File(path) as f:
        big_offset = f["big"].id.get_offset()
        gz = f["gz"]
        chunks = {
            gz.id.get_chunk_info(i).chunk_offset[0] // 32: gz.id.get_chunk_info(i)
            for i in range(gz.id.get_num_chunks())
        }
    row_bytes = 1200 * 4
    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        ds = chute.H5Dataset(f"{proxy.url}/one.h5", ["big", "gz"], remote=options())
        # Rows 10..12 are one run; 1000 and 1900 lie far apart: three ranges
        # of exactly those bytes for "big".
        since = len(proxy.requests)
        rows = [11, 10, 12, 1000, 1900]
        got = collate(ds, rows)
        assert np.array_equal(got["big"], arrays["big"][rows])
        assert np.array_equal(got["gz"], arrays["gz"][rows])
        fetched = sorted(_ranges(proxy, since))
        big = [
            (big_offset + a * row_bytes, big_offset + (b + 1) * row_bytes)
            for a, b in [(10, 12), (1000, 1000), (1900, 1900)]
        ]
        wanted_chunks = {r // 32 for r in rows}
        gz_extents = sorted(
            (chunks[c].byte_offset, chunks[c].byte_offset + chunks[c].size) for c in wanted_chunks
        )
        # All of them lie further apart than the 64 KiB that requests merge
        # over: one request per extent, of exactly its bytes.
        assert fetched == sorted(big + gz_extents)
        # Rows 20 and 25 lie 4 rows (19 KiB) apart: one request spans both.
        since = len(proxy.requests)
        got = collate(ds.__class__(f"{proxy.url}/one.h5", ["big"], remote=options()), [25, 20])
        assert np.array_equal(got["big"], arrays["big"][[25, 20]])
        assert _ranges(proxy, since)[-1] == (
            big_offset + 20 * row_bytes,
            big_offset + 26 * row_bytes,
        )
        # A second look at the same rows: chunks come from the chunk cache,
        # only the uncached contiguous runs are fetched again.
        since = len(proxy.requests)
        collate(ds, rows)
        again = _ranges(proxy, since)
        assert not any(a < e[1] and e[0] < b for a, b in again for e in gz_extents)


def test_cache_dir_downloads_whole_files_once(
    h5_files: tuple[list[Path], list[dict[str, np.ndarray]]],
    object_server: ObjectServer,
    tmp_path: Path,
):
    paths, arrays = h5_files
    for p in paths:
        object_server.objects[f"/h5/{p.name}"] = p.read_bytes()
    urls = [f"{object_server.url}/h5/{p.name}" for p in paths]
    cache = tmp_path / "cache"
    full = {k: np.concatenate([a[k] for a in arrays]) for k in FIELDS}
    for _ in range(2):  # the second dataset finds both files in the cache
        ds = chute.H5Dataset(urls, FIELDS, cache_dir=cache, remote=options(cache_fsync=False))
        got = collate(ds, [699, 0, 350])
        for k in FIELDS:
            assert np.array_equal(got[k], full[k][[699, 0, 350]])
        entries = sorted(p.name.split("-", 1)[1] for p in cache.iterdir() if "+" not in p.name)
        assert entries == ["session-0.h5", "session-1.h5"]
    for p in paths:
        assert object_server.range_bytes(f"/h5/{p.name}") <= 2 * p.stat().st_size
        # (the describe step's metadata reads, plus one whole download)
        whole = [r for r in object_server.requests if r.path == f"/h5/{p.name}" and r.range]
        assert sum(1 for r in whole if r.range and r.range.startswith("bytes=0-")) >= 1


def test_missing_remote_file_names_the_url(object_server: ObjectServer):
    url = f"{object_server.url}/h5/none.h5"
    with pytest.raises(chute.ReadError, match=re.escape(url) + ".*HTTP 404"):
        chute.H5Dataset(url, ["x"], remote=options())


@pytest.fixture
def bucket(
    moto_s3: S3, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[S3, str, list[str]]]:
    name = "cli-" + request.node.name.replace("_", "-")[:40].lower()
    shards = write_shards(tmp_path / "s", tiny_samples(60), per_shard=30)
    h5 = tmp_path / "rows.h5"
    write_h5(h5, rows=50)
    objects = {f"train/{os.path.basename(p)}": Path(p).read_bytes() for p in shards}
    objects["h5/rows.h5"] = h5.read_bytes()
    moto_s3.bucket(name, objects)
    yield moto_s3, name, shards


def _cli(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    from chute.cli.main import main

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(args)
    return code, out.getvalue()


def _s3_env(s3: S3) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3.endpoint,
    }


def test_cli_inspect_remote_urls(
    bucket: tuple[S3, str, list[str]], monkeypatch: pytest.MonkeyPatch
):
    s3, name, shards = bucket
    code, text = _cli(
        [
            "inspect",
            "--json",
            f"s3://{name}/train/shard-{{000000..000001}}.tar",
            f"s3://{name}/h5/rows.h5",
        ],
        _s3_env(s3),
        monkeypatch,
    )
    assert code == 0, text
    reports = json.loads(text)
    local = [json.loads(_cli(["inspect", "--json", p], {}, monkeypatch)[1])[0] for p in shards]
    for got, want, shard in zip(reports[:2], local, shards, strict=True):
        assert got["path"] == f"s3://{name}/train/{os.path.basename(shard)}"
        assert {k: v for k, v in got.items() if k != "path"} == {
            k: v for k, v in want.items() if k != "path"
        }
    h5 = reports[2]
    assert h5["kind"] == "hdf5" and not h5["problems"]
    assert {d["name"]: d["read"] for d in h5["datasets"]} == {
        "/big": "native",
        "/small": "native",
        "/gz": "native",
        "/split": "native",
    }
    # The same through --storage-option instead of the environment's endpoint.
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    code, text = _cli(
        [
            "inspect",
            "--storage-option",
            f"endpoint={s3.endpoint}",
            f"s3://{name}/train/shard-000000.tar",
        ],
        {},
        monkeypatch,
    )
    assert code == 0 and "samples: 30" in text


def test_cli_index_puts_the_index_beside_the_shard(
    bucket: tuple[S3, str, list[str]], monkeypatch: pytest.MonkeyPatch
):
    s3, name, shards = bucket
    url = f"s3://{name}/train/shard-000000.tar"
    code, text = _cli(["index", url], _s3_env(s3), monkeypatch)
    assert code == 0 and "30 samples" in text
    body: Any = s3.client().get_object(Bucket=name, Key="train/shard-000000.tar.idx.json")  # type: ignore[attr-defined]
    document = json.loads(body["Body"].read())
    from chute.sources.tarindex import build_index

    local = build_index(shards[0])
    assert document["samples"] == local["samples"]
    assert document["shard_size"] == local["shard_size"] and document["shard"] == url
    assert document["headers_digest"] == local["headers_digest"] and document["shard_version"]
    code, text = _cli(["index", url], _s3_env(s3), monkeypatch)
    assert code == 0 and "up to date" in text
    # Stream counting (even batches, elastic resume) takes it as it is: it
    # names the shard's ETag.
    import chute.sources.remote_urls
    from chute.wds.even import shard_samples

    def no_build(*args: Any) -> Any:
        raise AssertionError("the index beside the shard was not used")

    monkeypatch.setattr(chute.sources.remote_urls, "build_remote_index", no_build)
    assert shard_samples(url, "", 0.0, remote=remote.RemoteOptions()) == 30


def test_cli_bench_streams_remote_shards(
    bucket: tuple[S3, str, list[str]], monkeypatch: pytest.MonkeyPatch
):
    s3, name, _ = bucket
    options = [f"endpoint={s3.endpoint}", "access_key_id=testing", "secret_access_key=testing"]
    args = ["bench", "--json", "--no-progress", "--workers", "1", "--to-tuple", "npy cls"]
    for option in [*options, "region=us-east-1"]:
        args += ["--storage-option", option]
    code, text = _cli([*args, f"s3://{name}/train/shard-{{000000..000001}}.tar"], {}, monkeypatch)
    assert code == 0, text
    [result] = json.loads(text)
    assert result["loader"] == "chute" and result["samples"] == 60
    # webdataset has no s3 handler: comparing on s3 urls is refused up front.
    with pytest.raises(SystemExit) as info:
        _cli([*args, "--compare", f"s3://{name}/train/shard-000000.tar"], {}, monkeypatch)
    assert info.value.code == 2
