"""Remote shards through the datasets: WebDataset over http(s), S3 (moto) and
hf:// equals the local read (tuple and dict pipelines, with shuffle); the
first batch does not wait for a whole shard; upcoming shards are fetched
ahead within the byte budget; DDP ranks agree on batch counts; processes
share one cache; faults skip or raise as the handler says; closing cancels
requests in flight."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import pytest
import torch
from chute.common.handlers import ignore_and_continue
from conftest import same_values, tiny_samples, write_shards
from helpers import remote_test_options
from remote_servers import S3, Fault, FaultProxy, ObjectServer

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

remote = pytest.importorskip("chute.remote")
pytest.importorskip("obstore")

KiB = 1024
R = 64 * KiB


def options(**overrides: Any) -> Any:
    return remote_test_options(R, **overrides)


@dataclass
class Store:
    """Objects served over one url kind; `proxy` (when asked for) sits in
    front of the server and sees every request."""

    kind: str
    base: str  # urls are base + "/" + key
    storage_options: dict[str, str]
    put: Any
    proxy: FaultProxy | None = None
    keys: list[str] = field(default_factory=list)

    def url(self, key: str) -> str:
        return f"{self.base}/{key}"

    def upload(self, files: list[str], prefix: str = "data") -> list[str]:
        """Puts local files under `prefix`; returns their urls in order."""
        urls = []
        for path in files:
            key = f"{prefix}/{os.path.basename(path)}"
            self.put(key, Path(path).read_bytes())
            urls.append(self.url(key))
        return urls

    def dataset(self, urls: Any, **kwargs: Any) -> chute.WebDataset:
        kwargs.setdefault("remote", options())
        if self.storage_options:
            kwargs.setdefault("storage_options", self.storage_options)
        kwargs.setdefault("shardshuffle", False)
        return chute.WebDataset(urls, **kwargs)

    def range_gets(self, name: str) -> list[str]:
        """Ranges asked for of the objects whose path ends with `name`."""
        assert self.proxy is not None
        return [
            r.range
            for r in self.proxy.requests
            if r.method == "GET" and r.path.endswith(name) and r.range
        ]


def _serve(
    kind: str,
    request: pytest.FixtureRequest,
    object_server: ObjectServer,
    monkeypatch: pytest.MonkeyPatch,
    proxied: bool,
) -> Iterator[Store]:
    if kind == "s3":
        s3: S3 = request.getfixturevalue("moto_s3")
        bucket = "ds-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:50].lower()
        bucket = bucket.strip("-")
        s3.bucket(bucket, {})
        client: Any = s3.client()

        def put_s3(key: str, data: bytes) -> None:
            client.put_object(Bucket=bucket, Key=key, Body=data)

        if not proxied:
            yield Store(kind, f"s3://{bucket}", s3.storage_options(), put_s3)
            return
        with FaultProxy(s3.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield Store(kind, f"s3://{bucket}", s3.storage_options(proxy.url), put_s3, proxy)
        return
    prefix = "/datasets/org/repo/resolve/main" if kind == "hf" else ""

    def put_http(key: str, data: bytes) -> None:
        object_server.objects[f"{prefix}/{key}"] = data

    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        origin = proxy.url if proxied else object_server.url
        if kind == "hf":
            monkeypatch.setenv("HF_ENDPOINT", origin)
            yield Store(kind, "hf://datasets/org/repo", {}, put_http, proxy if proxied else None)
        else:
            yield Store(kind, origin, {}, put_http, proxy if proxied else None)


@pytest.fixture(params=["http", "s3", "hf"])
def store(
    request: pytest.FixtureRequest, object_server: ObjectServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    yield from _serve(request.param, request, object_server, monkeypatch, proxied=False)


@pytest.fixture(params=["http", "s3"])
def proxied(
    request: pytest.FixtureRequest, object_server: ObjectServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    yield from _serve(request.param, request, object_server, monkeypatch, proxied=True)


@pytest.fixture
def http(object_server: ObjectServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    request: Any = None
    yield from _serve("http", request, object_server, monkeypatch, proxied=True)


def pipeline(ds: chute.WebDataset, kind: str, shuffle: bool) -> Any:
    if shuffle:
        ds = ds.shuffle(50, seed=7)
    if kind == "tuple":
        return ds.decode("rgb8").to_tuple("jpg;png", "cls").batched(8)
    return ds.decode("rgb8")


def without_url(items: list[Any]) -> list[Any]:
    # A local shard also gives __local_path__ (as webdataset does); a remote one does not.
    return [{k: v for k, v in x.items() if k not in ("__url__", "__local_path__")} for x in items]


@pytest.mark.parametrize("kind", ["tuple", "dict"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_webdataset_equals_the_local_read(
    store: Store, image_shards: list[str], kind: str, shuffle: bool
):
    urls = store.upload(image_shards)
    pattern = store.url("data/shard-{000000..000002}.tar")
    expected = list(pipeline(chute.WebDataset(image_shards, shardshuffle=False), kind, shuffle))
    got = list(pipeline(store.dataset(pattern), kind, shuffle))
    from_list = list(pipeline(store.dataset(urls), kind, shuffle))
    if kind == "dict":
        assert [x["__url__"] for x in got] == [
            urls[image_shards.index(x["__url__"])] for x in expected
        ]
        expected, got, from_list = without_url(expected), without_url(got), without_url(from_list)
    assert len(got) == len(expected) > 0
    assert same_values(got, expected)
    assert same_values(from_list, expected)


def test_glob_on_a_bucket(moto_s3: S3, tiny_shards: list[str]):
    moto_s3.bucket("globbed", {})
    client: Any = moto_s3.client()
    for path in tiny_shards:
        client.put_object(Bucket="globbed", Key=f"train/{os.path.basename(path)}", Body=b"")
    client.put_object(Bucket="globbed", Key="train/notes.txt", Body=b"")
    for path in tiny_shards:
        data = Path(path).read_bytes()
        client.put_object(Bucket="globbed", Key=f"train/{os.path.basename(path)}", Body=data)
    ds = chute.WebDataset(
        "s3://globbed/train/*.tar",
        shardshuffle=False,
        storage_options=moto_s3.storage_options(),
        remote=options(),
    ).to_tuple("__key__", "cls")
    expected = list(chute.WebDataset(tiny_shards, shardshuffle=False).to_tuple("__key__", "cls"))
    assert list(ds) == expected
    assert ds.urls == [f"s3://globbed/train/{os.path.basename(p)}" for p in tiny_shards]


def test_http_has_no_glob(object_server: ObjectServer):
    ds = chute.WebDataset(f"{object_server.url}/d/*.tar", shardshuffle=False, remote=options())
    with pytest.raises(ValueError, match="no listing"):
        next(iter(ds))


def test_the_first_batch_does_not_wait_for_the_shard(http: Store, tmp_path: Path):
    [shard] = write_shards(tmp_path, tiny_samples(400), per_shard=400)
    [url] = http.upload([shard])
    assert http.proxy is not None
    # The server sends the first range, then holds every other one back
    # until the test has its first batch. (The parser hands samples on in
    # chunks of at least 16: the first range holds more than that.)
    size = os.path.getsize(shard)
    first_range = 4 * R
    stalls = [
        http.proxy.add(Fault("stall", path_contains="shard-000000", range_start=start))
        for start in range(first_range, size, first_range)
    ]
    opts = options(range_bytes=first_range)
    it = iter(http.dataset(url, remote=opts).decode().to_tuple("npy", "cls").batched(4))
    first = next(it)
    # The second range was asked for (it is requested with the first) and is
    # still held: the batch came from the first range alone.
    assert stalls[0].hit.wait(60)
    assert not any(s.release.is_set() for s in stalls)  # the shard is still being served
    for s in stalls:
        s.release.set()
    rest = list(it)
    expected = list(
        chute.WebDataset(shard, shardshuffle=False).decode().to_tuple("npy", "cls").batched(4)
    )
    assert same_values([first, *rest], expected)


def test_upcoming_shards_are_fetched_ahead_within_the_budget(http: Store, tmp_path: Path):
    shards = write_shards(tmp_path, tiny_samples(600), per_shard=150)
    urls = http.upload(shards)
    assert http.proxy is not None
    stall = http.proxy.add(Fault("stall", path_contains="shard-000000", range_start=2 * R))
    opts = options(prefetch_bytes=6 * R, max_in_flight=3)
    ds = http.dataset(urls, remote=opts).to_tuple("__key__").batched(4)
    it = iter(ds)
    next(it)
    assert stall.hit.wait(60)
    session = remote.get_session(opts)
    # While the first shard is held back, the next ones are already arriving.
    deadline = time.monotonic() + 60  # a hang guard: the loop ends when both arrived
    while time.monotonic() < deadline and not (
        http.range_gets("shard-000001.tar") and http.range_gets("shard-000002.tar")
    ):
        time.sleep(0.02)
    assert http.range_gets("shard-000001.tar") and http.range_gets("shard-000002.tar")
    assert not http.range_gets("shard-000003.tar")  # parse_ahead bounds the shards open
    # Fetched-but-unread bytes stay within the budget, plus the one range each
    # open shard may always take.
    assert session.stats()["reserved_bytes"] <= 6 * R + 3 * R
    stall.release.set()
    keys = [k for batch in it for k in batch[0]]
    assert len(keys) == 600 - 4


def _settled(count: Any, quiet_s: float = 0.5, bound_s: float = 30.0) -> int:
    """`count()` once it has not changed for `quiet_s` (at most `bound_s`)."""
    deadline = time.monotonic() + bound_s
    last = count()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = count()
        if now == last:
            break
        last = now
    return int(last)


def _ranked_counts(ds_factory: Any, world: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        counts.append(sum(1 for _ in ds_factory()))
    return counts


@pytest.mark.parametrize("sidecar", ["none", "unversioned", "bound"])
def test_ddp_ranks_yield_equal_batch_counts(
    http: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sidecar: str
):
    from chute.sources.sample_counts import sample_counter
    from chute.sources.tarindex import _write_document, build_index, write_index
    from chute.wds.even import shard_samples

    samples = tiny_samples(30 + 50 + 70 + 20)
    shards = []
    start = 0
    for i, n in enumerate([30, 50, 70, 20]):
        shards += write_shards(tmp_path / "s", samples[start : start + n], n, prefix=f"part{i}")
        start += n
    urls = http.upload(shards)
    for path, url in zip(shards, urls, strict=True):
        if sidecar == "unversioned":  # a local `chute index`, uploaded: no ETag recorded
            index = write_index(path)
        elif sidecar == "bound":  # as `chute index URL` writes it
            version = str(remote.get_session(options()).ranges(url).version)
            index = tmp_path / (os.path.basename(path) + ".idx.json")
            _write_document(build_index(path, identity=url, version=version), index)
        else:
            continue
        http.put(f"data/{index.name}", index.read_bytes())

    def make(local: bool) -> Any:
        src = shards if local else urls
        kwargs: dict[str, Any] = {"nodesplitter": chute.wds.split_by_node, "shardshuffle": False}
        ds = chute.WebDataset(src, **kwargs) if local else http.dataset(src, **kwargs)
        return ds.to_tuple("cls").batched(8)

    local = _ranked_counts(lambda: make(True), 2, monkeypatch)
    got = _ranked_counts(lambda: make(False), 2, monkeypatch)
    assert got == local == [9, 9]  # rank 0: 100 samples, rank 1: 70 -> capped at 9 batches
    # Counted afresh: with an index bound to each shard's ETag beside it,
    # counting reads the indexes, not the shards; an index that records no
    # ETag is checked against the shard's headers (read by ranges), and
    # without an index the shard is read.
    counter = sample_counter(urls[0])
    monkeypatch.setattr(counter, "_counts", {})
    monkeypatch.setattr(counter, "_layouts", {})
    # Reads the capped rank left in flight may still reach the server: count
    # from when they have drained (the count holds still; bounded).
    before = _settled(lambda: sum(len(http.range_gets(os.path.basename(s))) for s in shards))
    counts = [shard_samples(u, "", 0.0, remote=options()) for u in urls]
    after = sum(len(http.range_gets(os.path.basename(s))) for s in shards)
    assert counts == [30, 50, 70, 20]
    if sidecar == "bound":
        assert after == before
        assert http.range_gets(".idx.json")
    else:
        assert after > before


def test_processes_share_one_cache(http: Store, tmp_path: Path):
    shards = write_shards(tmp_path / "s", tiny_samples(300), per_shard=100)
    urls = http.upload(shards)
    assert http.proxy is not None
    cache = tmp_path / "cache"
    cache.mkdir()
    script = textwrap.dedent(
        f"""
        import sys
        import chute
        from chute.remote import RemoteOptions
        urls = sys.argv[1:]
        ds = chute.WebDataset(urls, shardshuffle=False, cache_dir={str(cache)!r},
                              remote=RemoteOptions(range_bytes={R}, cache_fsync=False))
        print(len([k for (k,) in ds.to_tuple("__key__")]))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *order], env=env, stdout=subprocess.PIPE, text=True
        )
        for order in (urls, urls[::-1])
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [["300"], ["300"]]
    for path in shards:
        got = http.range_gets(os.path.basename(path))
        fetched = sum(int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) + 1 for r in got)
        assert fetched == os.path.getsize(path)  # downloaded once for both processes


def test_cache_is_bounded_by_its_limit(http: Store, tmp_path: Path):
    shards = write_shards(tmp_path / "s", tiny_samples(400), per_shard=100)
    urls = http.upload(shards)
    cache = tmp_path / "cache"
    cache.mkdir()
    size = max(os.path.getsize(p) for p in shards)
    limit = int(2.5 * size)
    # One thread reads the shards one after another: with two, a shard still
    # being read when the last one arrives holds its entry (readers are never
    # evicted), and which shards end up kept depends on timing.
    ds = http.dataset(
        urls, cache_dir=cache, cache_limit_bytes=limit, remote=options(cache_fsync=False),
        threads=1,
    )  # fmt: skip
    assert len(list(ds.to_tuple("__key__"))) == 400
    entries = [p for p in cache.iterdir() if "+" not in p.name]
    assert sum(p.stat().st_size for p in entries) <= limit
    assert 1 <= len(entries) <= 2
    # The most recent shards are the ones kept: a second epoch hits them.
    kept = {p.name.split("-", 1)[1] for p in entries}
    assert "shard-000003.tar" in kept


def test_a_failure_mid_shard_is_skipped_from_there(proxied: Store, tmp_path: Path):
    shards = write_shards(tmp_path, tiny_samples(300), per_shard=100)
    urls = proxied.upload(shards)
    assert proxied.proxy is not None
    proxied.proxy.add(
        Fault("status", status=500, times=1000, path_contains="shard-000001", range_start=R)
    )
    ds = proxied.dataset(urls, handler=ignore_and_continue, remote=options(retries=1))
    ds = ds.to_tuple("__key__")
    keys = [k for (k,) in ds]
    all_keys = [s["__key__"] for s in tiny_samples(300)]
    middle = [k for k in keys if k in all_keys[100:200]]
    assert keys[:100] == all_keys[:100] and keys[-100:] == all_keys[200:]
    # The samples of shard 1 before the failed range arrived, in order; the rest is lost.
    assert 0 < len(middle) < 100 and middle == all_keys[100 : 100 + len(middle)]
    assert ds.stats()["samples_skipped"] == 1


def test_a_failure_mid_shard_raises_naming_url_and_status(proxied: Store, tmp_path: Path):
    shards = write_shards(tmp_path, tiny_samples(200), per_shard=100)
    urls = proxied.upload(shards)
    assert proxied.proxy is not None
    proxied.proxy.add(
        Fault("status", status=503, times=1000, path_contains="shard-000001", range_start=R)
    )
    ds = proxied.dataset(urls, remote=options(retries=1)).to_tuple("__key__")
    keys = []
    with pytest.raises(chute.ReadError) as info:
        for (k,) in ds:
            keys.append(k)
    assert urls[1] in str(info.value) and "HTTP 503" in str(info.value)
    # Everything before the failing batch arrived, in order.
    assert keys and keys == [s["__key__"] for s in tiny_samples(200)][: len(keys)]


@pytest.mark.parametrize("status", [403, 404])
def test_forbidden_and_missing_shards_raise(proxied: Store, tmp_path: Path, status: int):
    shards = write_shards(tmp_path, tiny_samples(100), per_shard=50)
    urls = proxied.upload(shards)
    assert proxied.proxy is not None
    if status == 404:
        urls[1] = urls[1].replace("shard-000001", "missing")
    else:
        proxied.proxy.add(Fault("status", method="HEAD", status=403, path_contains="shard-000001"))
    ds = proxied.dataset(urls).to_tuple("__key__")
    with pytest.raises(chute.ReadError) as info:
        list(ds)
    assert urls[1] in str(info.value) and f"HTTP {status}" in str(info.value)


@pytest.mark.parametrize("kind", ["drop", "short", "status"])
def test_transient_faults_are_retried_under_the_engine(
    proxied: Store, image_shards: list[str], kind: str
):
    urls = proxied.upload(image_shards)
    assert proxied.proxy is not None
    fault = proxied.proxy.add(Fault(kind, status=500, path_contains="shard-000001", range_start=R))
    expected = list(pipeline(chute.WebDataset(image_shards, shardshuffle=False), "tuple", False))
    assert same_values(list(pipeline(proxied.dataset(urls), "tuple", False)), expected)
    assert fault.hit.is_set()


def test_break_cancels_requests_in_flight(http: Store, tmp_path: Path):
    [shard] = write_shards(tmp_path, tiny_samples(400), per_shard=400)
    [url] = http.upload([shard])
    assert http.proxy is not None
    stall = http.proxy.add(Fault("stall", path_contains="shard-000000", range_start=4 * R))
    opts = options(range_bytes=4 * R, timeout_s=300.0)
    for batch in http.dataset(url, remote=opts).to_tuple("__key__").batched(4):
        assert len(batch[0]) == 4
        break
    assert stall.hit.wait(60)
    # Leaving the loop closed the engine: the held request's connection was dropped.
    deadline = time.monotonic() + 60  # a hang guard: the loop ends when the proxy saw it
    while time.monotonic() < deadline and http.proxy.abandoned == 0:
        time.sleep(0.05)
    assert http.proxy.abandoned >= 1
    assert not stall.release.is_set()
    assert remote.get_session(opts).stats()["in_flight"] == 0


@pytest.mark.parametrize("indexed", [False, True])
def test_tar_dataset_over_a_store_equals_the_local_one(
    proxied: Store, image_shards: list[str], tmp_path: Path, indexed: bool
):
    from chute.sources.tarindex import write_index

    proxied.upload(image_shards)
    if indexed:  # indexes beside the objects: the shards are read only for samples
        for path in image_shards:
            index = write_index(path, output=tmp_path / (os.path.basename(path) + ".idx.json"))
            proxied.put(f"data/{index.name}", index.read_bytes())
    local = chute.TarDataset(image_shards, decode="rgb8", fields=("jpg;png", "cls"))
    assert proxied.proxy is not None
    before = len(proxied.proxy.requests)
    ds = chute.TarDataset(
        proxied.url("data/shard-{000000..000002}.tar"),
        decode="rgb8",
        fields=("jpg;png", "cls"),
        storage_options=proxied.storage_options or None,
        remote=options(),
    )
    opening = proxied.proxy.requests[before:]
    assert len(ds) == len(local) == 120
    rows = [3, 117, 40, 41, 42, 0, 79]
    assert same_values(ds.__getitems__(rows), local.__getitems__(rows))
    loader = chute.DataLoader(
        ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    reference = chute.DataLoader(
        local, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    assert same_values(list(loader), list(reference))
    # Opening read every shard once to index it, unless it had an index.
    opened = [r for r in opening if r.method == "GET" and r.path.endswith(".tar") and r.range]
    assert (opened == []) if indexed else (len(opened) >= len(image_shards))


def test_torch_workers_read_remote_shards_when_the_parent_did_not(
    object_server: ObjectServer, tmp_path: Path
):
    # Each forked worker makes its own session (obstore's runtime does not
    # survive a fork, so the parent must not have used it first).
    shards = write_shards(tmp_path, tiny_samples(200), per_shard=50)
    for path in shards:
        object_server.objects[f"/b/{os.path.basename(path)}"] = Path(path).read_bytes()
    script = textwrap.dedent(
        f"""
        import chute, torch
        ds = chute.WebDataset({object_server.url + "/b/shard-{000000..000003}.tar"!r},
                              shardshuffle=False).to_tuple("__key__")
        keys = [k for (k,) in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
        print(len(keys), len(set(keys)))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["200", "200"]


def test_select_files_reads_remote_shards_in_python(store: Store, image_shards: list[str]):
    urls = store.upload(image_shards)

    def not_png(name: str) -> bool:
        return not name.endswith(".png")

    def build(ds: chute.WebDataset) -> Any:
        return ds.decode("rgb8").to_tuple("__key__", "jpg", "cls", handler=wds.ignore_and_continue)

    expected = list(build(chute.WebDataset(image_shards, shardshuffle=False, select_files=not_png)))
    got = list(build(store.dataset(urls, select_files=not_png)))
    assert len(got) == len(expected) > 0
    assert same_values(got, expected)


# How long close() from another thread may take to end a next() waiting on a
# stalled server (docs/remote.md states about a second; generous here for a
# busy machine).
CLOSE_BOUND_S = 10.0


@pytest.mark.parametrize("via", ["dataset", "loader"])
def test_close_from_another_thread_ends_a_stalled_iteration(http: Store, tmp_path: Path, via: str):
    [shard] = write_shards(tmp_path, tiny_samples(200), per_shard=200)
    [url] = http.upload([shard])
    assert http.proxy is not None
    stall = http.proxy.add(Fault("stall", path_contains="shard-000000", times=1000))
    ds = http.dataset(url, remote=options(timeout_s=300.0)).to_tuple("__key__").batched(4)
    it = iter(ds) if via == "dataset" else iter(chute.DataLoader(ds, batch_size=None))
    outcome: list[object] = []

    def consume() -> None:
        try:
            outcome.append(next(it))
        except StopIteration:
            outcome.append(StopIteration)
        except BaseException as e:  # noqa: BLE001 - the test reports what ended it
            outcome.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    # The engine asks for the shard's first range only once next() runs: the
    # consumer now waits in next() for a range the server holds back.
    assert stall.hit.wait(60)
    assert consumer.is_alive()
    closed_at = time.monotonic()
    ds.close()
    consumer.join(CLOSE_BOUND_S)
    assert not consumer.is_alive(), "close() did not end the waiting next()"
    assert time.monotonic() - closed_at < CLOSE_BOUND_S
    assert outcome == [StopIteration]
    with pytest.raises(StopIteration):
        next(it)
