"""ArrowDataset over http(s) and S3 (moto): a save_to_disk directory read
remotely equals datasets.load_from_disk of the local copy; only ranged
requests are sent, never a whole file; a node cache is filled once and
mapped locally; a lasting failure names the file and record batch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
from conftest import image_samples
from helpers import remote_test_options
from remote_servers import S3, Fault, FaultProxy, ObjectServer

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

pytest.importorskip("chute.remote")
pytest.importorskip("obstore")
datasets = pytest.importorskip("datasets")

N = 140


def options(**overrides: Any) -> Any:
    return remote_test_options(64 << 10, **overrides)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("arrow_remote")
    samples = image_samples(N, seed=8, size=(16, 12))
    table = {
        "image": [{"bytes": s["jpg"], "path": f"{i}.jpg"} for i, s in enumerate(samples)],
        "label": [int(s["cls"]) for s in samples],
        "text": [f"caption {i}" for i in range(N)],
    }
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.Value("int64"),
            "text": datasets.Value("string"),
        }
    )
    datasets.Dataset.from_dict(table, features=features).save_to_disk(str(root / "d"), num_shards=2)
    objects = {p.name: p.read_bytes() for p in sorted((root / "d").iterdir())}
    return {
        "dir": root / "d",
        "objects": objects,
        "reference": datasets.load_from_disk(str(root / "d")),
    }


@pytest.fixture(params=["http", "s3"])
def served(
    request: pytest.FixtureRequest, object_server: ObjectServer, saved: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any], FaultProxy]]:
    """The directory behind a fault proxy: its url, the storage options, the proxy."""
    if request.param == "http":
        for name, data in saved["objects"].items():
            object_server.objects[f"/ds/{name}"] = data
        with FaultProxy(object_server.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield f"{proxy.url}/ds", {}, proxy
    else:
        s3: S3 = request.getfixturevalue("moto_s3")
        bucket = f"arrow-{request.node.name.split('[')[0].replace('_', '-')[:40]}"
        s3.bucket(bucket, {f"ds/{n}": d for n, d in saved["objects"].items()})
        with FaultProxy(s3.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield f"s3://{bucket}/ds", {"storage_options": s3.storage_options(proxy.url)}, proxy


def rows(ds: Any, **kw: Any) -> list[dict[str, Any]]:
    out = []
    for batch in chute.DataLoader(ds, batch_size=10, **kw):
        n = len(next(iter(batch.values())))
        out.extend(
            {k: (v[i].tolist() if isinstance(v, torch.Tensor) else v[i]) for k, v in batch.items()}
            for i in range(n)
        )
    return out


def test_remote_directory_equals_load_from_disk_with_ranged_reads(served: Any, saved: Any) -> None:
    url, settings, proxy = served
    ds = chute.ArrowDataset(url, decode="torchrgb8", remote=options(**settings))
    assert ds.urls == [f"{url}/data-00000-of-00002.arrow", f"{url}/data-00001-of-00002.arrow"]
    got = rows(ds, shuffle=True)
    by_text = {r["text"]: r for r in got}
    ref = saved["reference"]
    assert len(got) == N
    for i in range(N):
        want = ref[i]
        row = by_text[want["text"]]
        assert row["label"] == want["label"]
        assert row["image"] == np.asarray(want["image"].convert("RGB")).transpose(2, 0, 1).tolist()
    data_gets = [r for r in proxy.requests if r.method == "GET" and r.path.endswith(".arrow")]
    assert data_gets and all(r.range for r in data_gets)  # never a whole file


def test_lasting_failure_names_file_and_record_batch(served: Any) -> None:
    url, settings, proxy = served
    ds = chute.ArrowDataset(url, ["label"], remote=options(retries=1, **settings))
    proxy.add(Fault("status", status=503, times=1000))
    with pytest.raises(
        chute.ReadError, match=r"file '.*data-00000-of-00002.arrow', record batch 0"
    ):
        ds[0]


def test_transient_faults_are_retried_with_the_bytes_intact(served: Any, saved: Any) -> None:
    url, settings, proxy = served
    ds = chute.ArrowDataset(url, ["text", "image"], remote=options(**settings))
    fault = proxy.add(Fault("short", times=3))
    got = rows(ds)
    assert fault.hit.is_set()
    raw = saved["reference"].cast_column("image", datasets.Image(decode=False))
    assert [r["text"] for r in got] == raw["text"]
    assert [r["image"] for r in got] == raw["image"]


def test_node_cache_is_filled_once_and_mapped(
    object_server: ObjectServer, saved: Any, tmp_path: Path
) -> None:
    for name, data in saved["objects"].items():
        object_server.objects[f"/c/{name}"] = data
    cache = tmp_path / "cache"
    first = chute.ArrowDataset(
        f"{object_server.url}/c", ["text"], remote=options(cache_dir=str(cache))
    )
    assert [r["text"] for r in rows(first)] == saved["reference"]["text"]
    assert any(cache.iterdir())
    before = len(object_server.requests)
    again = chute.ArrowDataset(
        f"{object_server.url}/c", ["text"], remote=options(cache_dir=str(cache))
    )
    assert [r["text"] for r in rows(again)] == saved["reference"]["text"]
    # The second dataset's record batches come from the cache's copies.
    data_gets = [
        r
        for r in object_server.requests[before:]
        if r.method == "GET" and r.path.endswith(".arrow")
    ]
    assert len(data_gets) <= 2 * 2  # the message headers at open, nothing for the batches
