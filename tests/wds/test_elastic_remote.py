"""Elastic resume and even batch counts over remote tar shards (S3 through
moto, HTTP through the local object server): a state taken on 4 ranks
resumes on 2, 3 and 6, every sample once; sample counts come from index
sidecars beside the shards when they are bound to the shard as it is now
(url, size, ETag), else from an index built by reading the shard once and
kept in the node cache; a sidecar or cached index of a replaced shard is
rebuilt, and a state taken before a shard changed is refused."""

from __future__ import annotations

import io
import itertools
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chute
import pytest
from conftest import tiny_samples, write_shards
from helpers import assert_equal_batch_counts, counts, keys, run_ranks
from remote_servers import S3, ObjectServer

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

remote = pytest.importorskip("chute.remote")
pytest.importorskip("obstore")

SAMPLES = 203  # in shards of 17: 12 shards, the last one of 16
B = 5


@dataclass
class Store:
    """Objects on one server kind: urls are base + "/" + key."""

    base: str
    storage_options: dict[str, str]
    put: Callable[[str, bytes], None]

    def url(self, key: str) -> str:
        return f"{self.base}/{key}"

    def upload(self, paths: list[str]) -> list[str]:
        for path in paths:
            self.put(f"data/{os.path.basename(path)}", Path(path).read_bytes())
        return [self.url(f"data/{os.path.basename(p)}") for p in paths]

    def options(self, **settings: Any) -> Any:
        return remote.RemoteOptions(
            storage_options=self.storage_options, backoff_s=0.01, max_backoff_s=0.05, **settings
        )


@pytest.fixture(params=["s3", "http"])
def store(request: pytest.FixtureRequest, object_server: ObjectServer) -> Iterator[Store]:
    if request.param == "s3":
        s3: S3 = request.getfixturevalue("moto_s3")
        bucket = "elastic-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
        s3.bucket(bucket, {})
        client: Any = s3.client()

        def put_s3(key: str, data: bytes) -> None:
            client.put_object(Bucket=bucket, Key=key, Body=data)

        yield Store(f"s3://{bucket}", s3.storage_options(), put_s3)
        return

    def put_http(key: str, data: bytes) -> None:
        object_server.objects[f"/{key}"] = data

    yield Store(object_server.url, {}, put_http)


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test counts as a new process would (no layout kept from another test)."""
    from chute.sources.sample_counts import sample_counter

    counter = sample_counter("shard.tar")
    monkeypatch.setattr(counter, "_counts", {})
    monkeypatch.setattr(counter, "_layouts", {})


def bound_sidecar(store: Store, path: str, url: str) -> None:
    """Puts beside the shard the index `chute index URL` would write (bound to its ETag)."""
    from chute.sources.tarindex import _write_document, build_index

    version = str(remote.get_session(store.options()).ranges(url).version)
    target = Path(path + ".bound.idx.json")
    _write_document(build_index(path, identity=url, version=version), target)
    store.put(f"data/{os.path.basename(path)}.idx.json", target.read_bytes())


def stream(
    store: Store,
    urls: list[str],
    buffer: int = 20,
    shuffle_max_bytes: int = 1 << 30,
    **remote_settings: Any,
) -> Callable[[], Any]:
    def make() -> Any:
        ds = chute.WebDataset(
            urls,
            shardshuffle=True,
            seed=5,
            elastic=True,
            shuffle_max_bytes=shuffle_max_bytes,
            remote=store.options(**remote_settings),
        )
        if buffer:
            ds = ds.shuffle(buffer, initial=buffer // 2)
        return ds.to_tuple("__key__").batched(B)

    return make


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    return write_shards(tmp_path / "shards", tiny_samples(SAMPLES, dim=4), 17)


@pytest.mark.parametrize("world", [2, 3, 6])
def test_remote_stream_resumes_on_another_world_size(
    monkeypatch: pytest.MonkeyPatch, store: Store, shards: list[str], world: int
):
    urls = store.upload(shards)
    for path, url in list(zip(shards, urls, strict=True))[::2]:
        bound_sidecar(store, path, url)  # half the shards have one: the rest are indexed here
    # A byte budget of a few samples: the shuffle buffer lets samples out
    # early, so resuming replays it on the indexes' encoded sizes.
    make = stream(store, urls, shuffle_max_bytes=1500)
    first, states = run_ranks(monkeypatch, 4, make, keys, batches=3)
    assert all(s["elastic"] == states[0]["elastic"] for s in states)
    assert_equal_batch_counts(first, 3)
    second, _ = run_ranks(monkeypatch, world, make, keys, state=states[0])
    seen = counts(first, second)
    assert len(seen) == SAMPLES and set(seen.values()) == {1}
    assert_equal_batch_counts(second, -(-(SAMPLES - 60) // (world * B)))


def test_remote_and_local_elastic_runs_deliver_the_same_batches(
    monkeypatch: pytest.MonkeyPatch, store: Store, shards: list[str]
):
    urls = store.upload(shards)
    remote_part, remote_states = run_ranks(monkeypatch, 3, stream(store, urls), keys, batches=4)

    def local() -> Any:
        ds = chute.WebDataset(shards, shardshuffle=True, seed=5, elastic=True)
        return ds.shuffle(20, initial=10).to_tuple("__key__").batched(B)

    local_part, local_states = run_ranks(monkeypatch, 3, local, keys, batches=4)
    assert remote_part == local_part
    assert remote_states[0]["elastic"] == local_states[0]["elastic"]


def test_built_indexes_are_kept_in_the_node_cache(
    monkeypatch: pytest.MonkeyPatch, store: Store, shards: list[str], tmp_path: Path
):
    from chute.sources.sample_counts import sample_counter

    urls = store.upload(shards[:3])
    cache = tmp_path / "cache"
    cache.mkdir()
    make = stream(store, urls, cache_dir=str(cache))
    whole, _ = run_ranks(monkeypatch, 2, make, keys)
    assert len(counts(whole)) == 51
    kept = sorted(p.name for p in (cache / "indexes").iterdir())
    assert len(kept) == 3 and all(name.endswith(".idx.json") for name in kept)
    # Another process of the node (a fresh counter) reads them, not the shards.
    counter = sample_counter(urls[0])
    monkeypatch.setattr(counter, "_layouts", {})
    import chute.sources.remote_urls

    def no_build(*args: Any) -> Any:
        raise AssertionError("an index kept in the node cache was built again")

    monkeypatch.setattr(chute.sources.remote_urls, "build_remote_index", no_build)
    again, _ = run_ranks(monkeypatch, 2, make, keys)
    assert again == whole


def same_size_shards(tmp_path: Path) -> tuple[bytes, bytes]:
    """Two tar shards of one size: one sample with a 1024-byte member, and
    two samples with 512 and 0 bytes (headers and payloads fill the same
    blocks)."""

    def shard(members: list[tuple[str, int]]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, size in members:
                info = tarfile.TarInfo(name)
                info.size = size
                info.mtime = 1
                tar.addfile(info, io.BytesIO(bytes(size)))
        return out.getvalue()

    one = shard([("a0.bin", 1024)])
    two = shard([("b0.bin", 512), ("b1.bin", 0)])
    assert len(one) == len(two)
    return one, two


@pytest.mark.parametrize("where", ["sidecar", "unversioned_sidecar", "node_cache"])
def test_an_index_of_a_replaced_shard_is_rebuilt(
    monkeypatch: pytest.MonkeyPatch, store: Store, tmp_path: Path, where: str
):
    from chute.sources.sample_counts import remote_index_dir
    from chute.sources.tarindex import INDEX_SUFFIX, _write_document, build_index, index_path
    from chute.wds.even import shard_samples

    one, two = same_size_shards(tmp_path)
    url = store.url("data/swap.tar")
    store.put("data/swap.tar", one)
    old = tmp_path / "swap.tar"
    old.write_bytes(one)
    cache = tmp_path / "cache"
    cache.mkdir()
    options = store.options(cache_dir=str(cache))
    version = str(remote.get_session(options).ranges(url).version)
    # An index of the first shard, where counting looks for one.
    document = build_index(old, identity=url, version=version)
    if where == "unversioned_sidecar":
        document = build_index(old)  # a local `chute index`, uploaded
    if where == "node_cache":
        index_dir = remote_index_dir(options)
        assert index_dir is not None
        _write_document(document, index_path(url, index_dir))
    else:
        _write_document(document, tmp_path / "sidecar.json")
        store.put("data/swap.tar" + INDEX_SUFFIX, (tmp_path / "sidecar.json").read_bytes())
    if where != "unversioned_sidecar":
        assert shard_samples(url, "", 0.0, remote=options) == 1  # taken while it is current
    # The shard is replaced by one of the same size with two samples.
    store.put("data/swap.tar", two)
    assert shard_samples(url, "", 0.0, remote=options) == 2

    make = lambda: (  # noqa: E731
        chute.WebDataset([url], shardshuffle=False, seed=1, elastic=True, remote=options)
        .to_tuple("__key__")
        .batched(1)
    )
    whole, _ = run_ranks(monkeypatch, 2, make, keys)
    assert sorted(counts(whole)) == ["b0", "b1"]


def test_a_state_taken_before_a_shard_changed_is_refused(
    monkeypatch: pytest.MonkeyPatch, store: Store, shards: list[str]
):
    urls = store.upload(shards)
    make = stream(store, urls)
    _, states = run_ranks(monkeypatch, 4, make, keys, batches=2)
    # One shard loses its last sample (its two members).
    with tarfile.open(shards[3]) as tar:
        members = [(m, tar.extractfile(m)) for m in tar.getmembers()]
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as shorter:
            for info, data in members[:-2]:
                shorter.addfile(info, data)
    store.put(f"data/{os.path.basename(shards[3])}", out.getvalue())
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    loader = make()
    loader.load_state_dict(states[0])
    with pytest.raises(ValueError, match="taken with another samples"):
        next(iter(loader))


def test_even_batches_over_remote_shards_count_from_bound_indexes(
    monkeypatch: pytest.MonkeyPatch, store: Store, tmp_path: Path
):
    import chute.sources.remote_urls

    # Ranks of split_by_node: rank 0 reads shards 0 and 2 (40 + 30 samples),
    # rank 1 shard 1 (20): "cap" gives both ceil(20 / 8) = 3 batches (rank 1's
    # third is its partial one).
    samples = tiny_samples(90, dim=4)
    paths: list[str] = []
    for i, (begin, end) in enumerate([(0, 40), (40, 60), (60, 90)]):
        paths += write_shards(tmp_path / "s", samples[begin:end], 40, prefix=f"part{i}")
    urls = store.upload(paths)
    for path, url in zip(paths, urls, strict=True):
        bound_sidecar(store, path, url)

    def no_build(*args: Any) -> Any:
        raise AssertionError("a shard was read to count it: its sidecar was not used")

    monkeypatch.setattr(chute.sources.remote_urls, "build_remote_index", no_build)

    def make() -> Any:
        ds = chute.WebDataset(
            urls, shardshuffle=False, nodesplitter=chute.wds.split_by_node, remote=store.options()
        )
        return ds.to_tuple("__key__").batched(8)

    got = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        got.append([len(b[0]) for b in itertools.islice(make(), 10)])
    assert got == [[8, 8, 8], [8, 8, 4]]


def test_an_unversioned_sidecar_is_checked_by_the_shard_headers(
    monkeypatch: pytest.MonkeyPatch, object_server: ObjectServer, tmp_path: Path
):
    import chute.sources.remote_urls
    import numpy as np
    from chute.sources.tarindex import write_index
    from chute.wds.even import shard_samples

    # Members far larger than the gap ranged reads merge over: reading the
    # headers costs a small part of the shard.
    rng = np.random.default_rng(4)
    samples = [{"__key__": f"big{i}", "bin": rng.bytes(300_000), "cls": i} for i in range(4)]
    [path] = write_shards(tmp_path / "s", samples, 4)
    store = Store(object_server.url, {}, lambda k, d: object_server.objects.update({f"/{k}": d}))
    [url] = store.upload([path])
    sidecar = write_index(path)  # built locally: it records no ETag
    store.put(f"data/{sidecar.name}", sidecar.read_bytes())

    def no_build(*args: Any) -> Any:
        raise AssertionError("the sidecar was not used")

    with monkeypatch.context() as m:
        m.setattr(chute.sources.remote_urls, "build_remote_index", no_build)
        assert shard_samples(url, "", 0.0, remote=store.options()) == 4
    fetched = object_server.range_bytes(os.path.basename(path))
    sidecar_bytes = object_server.range_bytes(sidecar.name)
    assert 0 < fetched - sidecar_bytes < os.path.getsize(path) // 4

    # The shard replaced by one of the same size whose headers differ (a
    # sample renamed): the sidecar is not trusted, the shard is indexed again.
    samples[1]["__key__"] = "bag1"
    [renamed] = write_shards(tmp_path / "renamed", samples, 4)
    assert os.path.getsize(renamed) == os.path.getsize(path)
    store.upload([renamed])
    assert shard_samples(url, "", 0.0, remote=store.options()) == 4
    again = object_server.range_bytes(os.path.basename(path)) - fetched
    assert again >= os.path.getsize(path)


def test_a_sidecar_accepted_by_its_headers_is_kept_bound_to_the_shards_etag(
    monkeypatch: pytest.MonkeyPatch, object_server: ObjectServer, tmp_path: Path
) -> None:
    import chute.sources.remote_urls
    import chute.sources.sample_counts
    from chute.sources.tarindex import write_index
    from chute.wds.even import shard_samples

    # Small members: the ranges of their headers merge into the whole shard.
    [path] = write_shards(tmp_path / "s", tiny_samples(17), 17)
    store = Store(object_server.url, {}, lambda k, d: object_server.objects.update({f"/{k}": d}))
    [url] = store.upload([path])
    sidecar = write_index(path)  # built locally: it records no ETag
    store.put(f"data/{sidecar.name}", sidecar.read_bytes())
    options = store.options(cache_dir=str(tmp_path / "cache"))
    name = os.path.basename(path)

    def no_build(*args: Any) -> Any:
        raise AssertionError("the sidecar was not used")

    def shard_bytes() -> int:
        return object_server.range_bytes(name) - object_server.range_bytes(sidecar.name)

    monkeypatch.setattr(chute.sources.remote_urls, "build_remote_index", no_build)
    assert shard_samples(url, "", 0.0, remote=options) == 17
    checked = shard_bytes()
    assert checked > os.path.getsize(path) // 2  # the headers, read to check the sidecar
    # A new process: the index kept in the node cache names the ETag, so
    # neither the headers nor the shard are read again.
    counter = chute.sources.sample_counts.sample_counter("shard.tar")
    monkeypatch.setattr(counter, "_counts", {})
    monkeypatch.setattr(counter, "_layouts", {})
    assert shard_samples(url, "", 0.0, remote=options) == 17
    assert shard_bytes() == checked
