"""ParquetDataset over http(s), S3 (moto) and hf:// (a local server standing
in for the hub): the rows equal pyarrow's reading of the local files; only
the footer and the asked-for column chunks are fetched, with ranged
requests; transient faults (dropped connections, short reads, 503s) are
retried with the bytes intact, a lasting one raises naming file and row
group; a node cache is filled once and read locally."""

from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import image_samples
from helpers import remote_test_options
from PIL import Image
from remote_servers import S3, Fault, FaultProxy, ObjectServer

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

pytest.importorskip("chute.remote")
pytest.importorskip("obstore")

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
N = 36


def options(**overrides: Any) -> Any:
    return remote_test_options(64 << 10, **overrides)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("parquet_remote")
    samples = image_samples(N, seed=8, size=(40, 48))
    paths = []
    for k, part in enumerate((samples[:20], samples[20:])):
        first = 20 * k
        table = pa.table(
            {
                "image": pa.array(
                    [{"bytes": s["jpg"], "path": f"{first + i}.jpg"} for i, s in enumerate(part)],
                    IMAGE,
                ),
                "label": pa.array([int(s["cls"]) for s in part], pa.int64()),
                "text": [f"caption {first + i}" for i in range(len(part))],
            }
        )
        path = root / f"train-{k:05d}-of-00002.parquet"
        pq.write_table(table, path, row_group_size=6)
        paths.append(str(path))
    return {
        "paths": paths,
        "bytes": {Path(p).name: Path(p).read_bytes() for p in paths},
        "reference": pa.concat_tables([pq.read_table(p) for p in paths]).to_pylist(),
    }


def rows(ds: Any, batch_size: int = 5, **kw: Any) -> list[dict[str, Any]]:
    out = []
    for batch in chute.DataLoader(ds, batch_size=batch_size, **kw):
        n = len(next(iter(batch.values())))
        out.extend(
            {k: (v[i].tolist() if isinstance(v, torch.Tensor) else v[i]) for k, v in batch.items()}
            for i in range(n)
        )
    return out


def pillow(data: bytes) -> list[Any]:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).transpose(2, 0, 1).tolist()


@pytest.fixture(params=["http", "s3"])
def served(
    request: pytest.FixtureRequest, object_server: ObjectServer, files: dict[str, Any]
) -> Iterator[tuple[list[str], dict[str, Any], FaultProxy]]:
    """The files behind a fault proxy: their urls, the storage options, the proxy."""
    if request.param == "http":
        for name, data in files["bytes"].items():
            object_server.objects[f"/pq/{name}"] = data
        with FaultProxy(object_server.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield [f"{proxy.url}/pq/{n}" for n in files["bytes"]], {}, proxy
    else:
        s3: S3 = request.getfixturevalue("moto_s3")
        bucket = f"pq-{request.node.name.split('[')[0].replace('_', '-')[:40]}"
        s3.bucket(bucket, {f"pq/{n}": d for n, d in files["bytes"].items()})
        with FaultProxy(s3.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield (
                [f"s3://{bucket}/pq/{n}" for n in files["bytes"]],
                {"storage_options": s3.storage_options(proxy.url)},
                proxy,
            )


def test_remote_rows_equal_pyarrow_and_only_ranges_are_fetched(served: Any, files: Any) -> None:
    urls, settings, proxy = served
    ds = chute.ParquetDataset(urls, decode="torchrgb8", remote=options(**settings))
    got = rows(ds, shuffle=True)
    by_text = {r["text"]: r for r in got}
    ref = files["reference"]
    assert len(got) == N and set(by_text) == {r["text"] for r in ref}
    for r in ref:
        assert by_text[r["text"]]["label"] == r["label"]
        assert by_text[r["text"]]["image"] == pillow(r["image"]["bytes"])
    gets = [r for r in proxy.requests if r.method == "GET"]
    assert gets and all(r.range for r in gets)  # never a whole file
    # After the footers, a projection fetches that column's chunks, not the images.
    labels = chute.ParquetDataset(urls, ["label"], remote=options(**settings))
    proxy.requests.clear()
    assert [r["label"] for r in rows(labels)] == [r["label"] for r in ref]
    fetched = sum(
        int(r.range.split("-")[1]) - int(r.range.split("=")[1].split("-")[0]) + 1
        for r in proxy.requests
        if r.method == "GET" and r.range
    )
    assert 0 < fetched < sum(len(d) for d in files["bytes"].values()) // 20


@pytest.mark.parametrize("kind", ["drop", "short", "status-503"])
def test_transient_faults_are_retried_with_the_bytes_intact(
    served: Any, files: Any, kind: str
) -> None:
    urls, settings, proxy = served
    ds = chute.ParquetDataset(urls, ["label", "text", "image"], remote=options(**settings))
    # Faults on the row groups' reads, after the footers were read at open.
    kind, _, status = kind.partition("-")
    fault = proxy.add(Fault(kind, status=int(status or 500), times=3))
    got = rows(ds)
    assert fault.hit.is_set()
    assert [r["text"] for r in got] == [r["text"] for r in files["reference"]]
    assert [r["image"] for r in got] == [r["image"] for r in files["reference"]]


def test_lasting_failure_names_file_and_row_group(served: Any) -> None:
    urls, settings, proxy = served
    ds = chute.ParquetDataset(urls, ["label"], remote=options(retries=1, **settings))
    proxy.add(Fault("status", status=503, times=1000))
    with pytest.raises(
        chute.ReadError, match=r"file '.*train-00000-of-00002.parquet', row group 0"
    ):
        ds[0]


def test_hf_urls_through_a_server_standing_in_for_the_hub(
    object_server: ObjectServer, files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, data in files["bytes"].items():
        object_server.objects[f"/datasets/org/pets/resolve/main/data/{name}"] = data
    monkeypatch.setenv("HF_ENDPOINT", object_server.url)
    urls = [f"hf://datasets/org/pets/data/{name}" for name in files["bytes"]]
    ds = chute.ParquetDataset(urls, decode="torchrgb8", remote=options())
    got = rows(ds)
    assert [r["text"] for r in got] == [r["text"] for r in files["reference"]]
    assert got[7]["image"] == pillow(files["reference"][7]["image"]["bytes"])


def test_the_docs_hub_example_runs_against_a_stand_in_hub(
    object_server: ObjectServer, files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "parquet.md").read_text()
    example = re.search(r"```python\n(.*?)```", doc, re.S)
    assert example is not None and "hf://datasets/org/pets/" in example.group(1)
    for name, data in files["bytes"].items():
        object_server.objects[f"/datasets/org/pets/resolve/main/data/{name}"] = data
    monkeypatch.setenv("HF_ENDPOINT", object_server.url)
    scope: dict[str, Any] = {}
    exec(compile(example.group(1), "docs/parquet.md", "exec"), scope)
    assert scope["images"].shape == (N, 3, 224, 224) and scope["images"].dtype == torch.float16
    assert sorted(scope["labels"].tolist()) == sorted(r["label"] for r in files["reference"])
    assert all(r.path.startswith("/datasets/org/pets/") for r in object_server.requests)


def test_node_cache_is_filled_once_and_read_locally(
    object_server: ObjectServer, files: Any, tmp_path: Path
) -> None:
    for name, data in files["bytes"].items():
        object_server.objects[f"/c/{name}"] = data
    urls = [f"{object_server.url}/c/{name}" for name in files["bytes"]]
    cache = tmp_path / "cache"
    first = chute.ParquetDataset(urls, ["text"], remote=options(cache_dir=str(cache)))
    assert [r["text"] for r in rows(first)] == [r["text"] for r in files["reference"]]
    assert any(cache.iterdir())
    gets = object_server.count("GET")
    again = chute.ParquetDataset(urls, ["text"], remote=options(cache_dir=str(cache)))
    assert [r["text"] for r in rows(again)] == [r["text"] for r in files["reference"]]
    # Only the footers again (at open): the row groups come from the cache.
    assert object_server.count("GET") - gets <= len(urls)


def test_each_file_is_opened_once_whatever_the_threads_reading_it(served: Any) -> None:
    urls, settings, proxy = served
    ds = chute.ParquetDataset(urls, decode="torchrgb8", remote=options(**settings))
    assert len(rows(ds, batch_size=4, shuffle=True)) == N
    # One HEAD per file, at open: the threads reading row groups share its reader.
    heads = collections.Counter(r.path.split("?")[0] for r in proxy.requests if r.method == "HEAD")
    assert sorted(heads.values()) == [1, 1], heads


def test_the_node_cache_copy_is_opened_once_per_file(
    object_server: ObjectServer, files: Any, tmp_path: Path
) -> None:
    for name, data in files["bytes"].items():
        object_server.objects[f"/once/{name}"] = data
    urls = [f"{object_server.url}/once/{name}" for name in files["bytes"]]
    ds = chute.ParquetDataset(urls, ["text"], remote=options(cache_dir=str(tmp_path / "cache")))
    assert sorted(r["text"] for r in rows(ds, shuffle=True)) == sorted(
        r["text"] for r in files["reference"]
    )
    # Per file: the HEAD at open, then the download into the cache and the
    # copy's open (a HEAD each), whatever the threads reading row groups.
    heads = collections.Counter(r.path for r in object_server.requests if r.method == "HEAD")
    assert sorted(heads.values()) == [3, 3], heads


def dataset_threads() -> list[str]:
    """The threads of chute running here other than the remote fetcher
    (which lives as long as the process's remote session): the engines'
    native ones by their kernel names, the row group readers by theirs."""
    names = [t.name for t in threading.enumerate()]
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return [n for n in names if n.startswith("chute-") and n != "chute-fetch"]


def test_a_dataset_dropped_mid_epoch_lets_its_threads_end(served: Any) -> None:
    urls, settings, _ = served
    ds = chute.ParquetDataset(urls, decode="torchrgb8", remote=options(**settings))
    assert ds[0]["label"] is not None
    it = iter(chute.DataLoader(ds, batch_size=5))
    next(it)
    assert "chute-read" in dataset_threads()
    assert any(n.startswith("chute-parquet") for n in dataset_threads())
    del ds, it  # no garbage collection: dropping them is enough
    # A pool's idle readers leave once it is freed, a moment later.
    deadline = time.monotonic() + 25
    while dataset_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not dataset_threads()


def test_remote_column_names_with_dots(tmp_path: Path, object_server: ObjectServer) -> None:
    # A column "a.b" beside a struct "a" with a field "b": the leaf paths are alike.
    table = pa.table(
        {
            "a.b": pa.array(np.arange(12), pa.int64()),
            "a": pa.array([{"b": 100 + i} for i in range(12)]),
            "c": pa.array(np.arange(12) * 3),
        }
    )
    path = tmp_path / "dotted.parquet"
    pq.write_table(table, path, row_group_size=5)
    object_server.objects["/dotted.parquet"] = path.read_bytes()
    for columns in (["a.b"], ["c", "a.b"], ["a"]):
        remote_ds = chute.ParquetDataset(f"{object_server.url}/dotted.parquet", columns)
        assert rows(remote_ds) == rows(chute.ParquetDataset(str(path), columns))
