"""The node-shared cache of remote objects: one download per object across
readers and processes, atomic publish, version checks, and least-recently-used
eviction that never takes an object being read."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import chute
import pytest
from chute import _core
from conftest import tiny_samples, write_shards
from remote_servers import S3, Fault, FaultProxy, ObjectServer

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

remote = pytest.importorskip("chute.remote")
pytest.importorskip("obstore")

KiB = 1024
R = 64 * KiB


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 5 + seed * 29 + (i >> 11)) % 241 for i in range(n))


def session(cache: Path, **overrides: object) -> chute.remote.RemoteSession:
    settings: dict[str, object] = {
        "range_bytes": R,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "cache_dir": str(cache),
        "cache_fsync": False,
    }
    settings.update(overrides)
    return remote.RemoteSession(remote.RemoteOptions(**settings))  # type: ignore[arg-type]


def entry(cache: Path, url: str) -> Path:
    return cache / _core.tar_cache_file_name(url)


def listing(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir())


def test_download_publish_then_hit(object_server: ObjectServer, tmp_path: Path):
    data = payload(5 * R + 7)
    object_server.objects["/b/shard-000.tar"] = data
    url = f"{object_server.url}/b/shard-000.tar"
    cache = tmp_path / "cache"
    with session(cache) as s:
        assert s.read_bytes(url) == data
        name = entry(cache, url).name
        assert name.endswith("-shard-000.tar")
        # Published whole, with its version beside it; no lock or part left.
        assert listing(cache) == [name, name + "+meta"]
        assert entry(cache, url).read_bytes() == data
        meta = (cache / (name + "+meta")).read_text()
        assert f"size {len(data)}\n" in meta and object_server.etag("/b/shard-000.tar") in meta
        with s.open(url) as f:
            assert f.in_place  # the cached file, mapped
            assert f.read() == data
    assert object_server.range_bytes("shard-000") == len(data)  # downloaded once
    assert object_server.count("HEAD") == 2  # the hit is still checked against the store


def test_changed_object_is_fetched_again(object_server: ObjectServer, tmp_path: Path):
    url = f"{object_server.url}/v.bin"
    cache = tmp_path / "c"
    object_server.objects["/v.bin"] = payload(3 * R, seed=1)
    with session(cache) as s:
        assert s.read_bytes(url) == payload(3 * R, seed=1)
        object_server.objects["/v.bin"] = payload(3 * R, seed=2)  # same size, new ETag
        assert s.read_bytes(url) == payload(3 * R, seed=2)
        assert entry(cache, url).read_bytes() == payload(3 * R, seed=2)
        assert s.read_bytes(url) == payload(3 * R, seed=2)
    assert object_server.range_bytes("/v.bin") == 2 * 3 * R


def test_entry_that_does_not_match_its_meta_is_refetched(
    object_server: ObjectServer, tmp_path: Path
):
    url = f"{object_server.url}/m.bin"
    cache = tmp_path / "c"
    object_server.objects["/m.bin"] = payload(2 * R)
    with session(cache) as s:
        assert s.read_bytes(url) == payload(2 * R)
        with open(entry(cache, url), "r+b") as f:  # a torn copy: shorter than recorded
            f.truncate(R)
        assert s.read_bytes(url) == payload(2 * R)
        (cache / (entry(cache, url).name + "+meta")).unlink()  # data without meta: untrusted
        assert s.read_bytes(url) == payload(2 * R)
    assert object_server.range_bytes("/m.bin") == 3 * 2 * R


def corrupt_one_byte(path: Path, at: int) -> None:
    """Flips the bits of one byte in place: same size, same modification
    time (what a disk error or a stray write can leave)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)
        f.seek(at)
        f.write(bytes([old[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_corrupt_entry_is_dropped_and_fetched_again(object_server: ObjectServer, tmp_path: Path):
    data = payload(5 * R + 3)
    object_server.objects["/c.bin"] = data
    url = f"{object_server.url}/c.bin"
    cache = tmp_path / "c"
    with session(cache) as s:
        assert s.read_bytes(url) == data
        corrupt_one_byte(entry(cache, url), 3 * R + 11)
        assert s.read_bytes(url) == data  # never the corrupt bytes
        assert s.stats()["cache_corrupt_refetches"] == 1
        # The checksum made while downloading is recorded beside the entry.
        meta = (cache / (entry(cache, url).name + "+meta")).read_text()
        assert f"crc32c {crc32c_hex(data)}\n" in meta
        assert entry(cache, url).read_bytes() == data  # the new download replaced it
        with s.open(url) as f:
            assert f.in_place and f.read() == data  # a good entry is a hit again
        assert s.stats()["cache_corrupt_refetches"] == 1
    assert object_server.range_bytes("/c.bin") == 2 * len(data)


def test_a_corrupt_entry_under_the_engine(moto_s3: S3, tmp_path: Path):
    # A shard in S3, read once through the cache by a WebDataset; one byte of
    # the cache entry is then changed in place. The next epoch reads the
    # shard's own bytes again, and the dataset's stats count the refetch.
    [shard] = write_shards(tmp_path / "local", tiny_samples(300), per_shard=300)
    moto_s3.bucket("corrupt-cache", {"train/shard-000000.tar": Path(shard).read_bytes()})
    url = "s3://corrupt-cache/train/shard-000000.tar"
    cache = tmp_path / "cache"
    cache.mkdir()
    ds = chute.WebDataset(
        url,
        shardshuffle=False,
        cache_dir=str(cache),
        storage_options=moto_s3.storage_options(),
        remote=remote.RemoteOptions(range_bytes=R, cache_fsync=False),
    ).to_tuple("__key__", "npy", "cls")
    expected = list(chute.WebDataset(shard, shardshuffle=False).to_tuple("__key__", "npy", "cls"))
    assert list(ds) == expected
    cached = entry(cache, url)
    assert cached.read_bytes() == Path(shard).read_bytes()
    # Inside a member's bytes, where nothing else would notice.
    with tarfile.open(cached) as tar:
        member = tar.getmembers()[len(tar.getmembers()) // 2]
    corrupt_one_byte(cached, member.offset_data + member.size // 2)
    assert list(ds) == expected
    assert ds.stats()["cache_corrupt_refetches"] == 1
    assert cached.read_bytes() == Path(shard).read_bytes()
    assert list(ds) == expected  # the new entry is good
    assert ds.stats()["cache_corrupt_refetches"] == 0


def crc32c_hex(data: bytes) -> str:
    """CRC-32C written out bit by bit, independent of the engine's."""
    crc = 0xFFFFFFFF
    table = []
    for b in range(256):
        r = b
        for _ in range(8):
            r = (r >> 1) ^ (0x82F63B78 if r & 1 else 0)
        table.append(r)
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return f"{crc ^ 0xFFFFFFFF:08x}"


def test_two_readers_of_one_object_download_it_once(object_server: ObjectServer, tmp_path: Path):
    data = payload(8 * R)
    object_server.objects["/one.bin"] = data
    cache = tmp_path / "c"
    with FaultProxy(object_server.port) as proxy:
        # Slow ranges keep the first download going while the second reader arrives.
        for start in range(0, len(data), R):
            proxy.add(Fault("delay", seconds=0.05, range_start=start))
        url = f"{proxy.url}/one.bin"
        with session(cache, max_in_flight=2) as s, s.open(url) as a, s.open(url) as b:
            got_a, got_b = bytearray(), bytearray()
            while True:
                x, y = a.read(R // 3), b.read(R // 2)
                got_a += x
                got_b += y
                if not x and not y:
                    break
            assert bytes(got_a) == data and bytes(got_b) == data
    assert object_server.range_bytes("/one.bin") == len(data)
    assert entry(cache, url).read_bytes() == data


def test_follower_finishes_when_the_downloader_stops(object_server: ObjectServer, tmp_path: Path):
    data = payload(6 * R)
    object_server.objects["/f.bin"] = data
    cache = tmp_path / "c"
    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        url = f"{proxy.url}/f.bin"
        stall = proxy.add(Fault("stall", range_start=2 * R))
        with session(cache, max_in_flight=2, timeout_s=300.0) as s:
            owner = s.open(url)
            assert owner.read(2 * R) == data[: 2 * R]  # its part file holds two ranges
            follower = s.open(url)
            assert follower.read(R) == data[:R]  # read from the owner's part file
            assert stall.hit.wait(60)
            owner.close()  # abandons the download
            assert follower.read() == data[R:]  # the rest fetched directly
            follower.close()
        assert listing(cache) == []  # nothing half-written was published
    # The follower fetched only what the part file lacked.
    starts = [r.range for r in object_server.requests if r.method == "GET"]
    assert starts.count(f"bytes=0-{R - 1}") == 1
    assert starts.count(f"bytes={R}-{2 * R - 1}") == 1


def test_processes_sharing_a_cache_fetch_each_object_once(
    object_server: ObjectServer, tmp_path: Path
):
    objects = {f"/p/shard-{i}.tar": payload(6 * R + i * 1000, seed=i) for i in range(3)}
    object_server.objects.update(objects)
    cache = tmp_path / "shared"
    with FaultProxy(object_server.port) as proxy:
        for path, data in objects.items():
            for start in range(0, len(data), R):
                proxy.add(Fault("delay", seconds=0.03, path_contains=path, range_start=start))
        urls = [f"{proxy.url}{p}" for p in objects]
        script = textwrap.dedent(
            f"""
            import hashlib, sys
            from chute.remote import RemoteOptions, RemoteSession
            opts = RemoteOptions(range_bytes={R}, max_in_flight=2, cache_dir={str(cache)!r},
                                 cache_fsync=False)
            with RemoteSession(opts) as s:
                for url in sys.argv[1:]:
                    print(hashlib.sha256(s.read_bytes(url)).hexdigest())
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
    digests = [hashlib.sha256(d).hexdigest() for d in objects.values()]
    assert outs == [digests, digests[::-1]]
    for path, data in objects.items():
        assert object_server.range_bytes(path) == len(data)


def _age(path: Path, seconds_ago: float) -> None:
    t = path.stat().st_mtime - seconds_ago
    os.utime(path, (t, t))


def test_least_recently_used_is_evicted(object_server: ObjectServer, tmp_path: Path):
    cache = tmp_path / "c"
    for name in "abc":
        object_server.objects[f"/{name}.bin"] = payload(2 * R, seed=ord(name))
    url = {n: f"{object_server.url}/{n}.bin" for n in "abc"}
    with session(cache, cache_limit_bytes=5 * R) as s:
        s.read_bytes(url["a"])
        s.read_bytes(url["b"])
        _age(entry(cache, url["a"]), 100)
        _age(entry(cache, url["b"]), 200)  # b is now the least recently used
        s.read_bytes(url["c"])  # 6 R > 5 R: one must go
        assert not entry(cache, url["b"]).exists()
        assert not (cache / (entry(cache, url["b"]).name + "+meta")).exists()
        assert entry(cache, url["a"]).exists() and entry(cache, url["c"]).exists()
        _age(entry(cache, url["c"]), 300)
        assert s.read_bytes(url["a"]) == payload(2 * R, seed=ord("a"))  # a hit refreshes a
        assert s.read_bytes(url["b"]) == payload(2 * R, seed=ord("b"))
        assert not entry(cache, url["c"]).exists()  # c was the oldest use
        assert entry(cache, url["a"]).exists() and entry(cache, url["b"]).exists()


def test_an_object_being_read_is_never_evicted(object_server: ObjectServer, tmp_path: Path):
    cache = tmp_path / "c"
    for name in "abc":
        object_server.objects[f"/{name}.bin"] = payload(2 * R, seed=ord(name))
    url = {n: f"{object_server.url}/{n}.bin" for n in "abc"}
    with session(cache, cache_limit_bytes=5 * R) as s:
        s.read_bytes(url["a"])
        s.read_bytes(url["b"])
        with s.open(url["a"]) as held:
            assert held.read(100) == payload(100, seed=ord("a"))
            _age(entry(cache, url["a"]), 500)  # the oldest, but in use
            _age(entry(cache, url["b"]), 100)
            s.read_bytes(url["c"])
            assert entry(cache, url["a"]).exists()
            assert not entry(cache, url["b"]).exists()
            with session(cache, cache_limit_bytes=3 * R) as small:
                # Nothing can be evicted for b (a is held, c is held by nobody
                # but that is still not enough room): b is read uncached.
                with small.open(url["c"]) as held_c:
                    assert small.read_bytes(url["b"]) == payload(2 * R, seed=ord("b"))
                    assert held_c.read() == payload(2 * R, seed=ord("c"))
                assert not entry(cache, url["b"]).exists()
            assert held.read() == payload(2 * R, seed=ord("a"))[100:]
        assert entry(cache, url["a"]).exists()


def test_larger_than_the_limit_is_read_uncached(object_server: ObjectServer, tmp_path: Path):
    cache = tmp_path / "c"
    object_server.objects["/big.bin"] = payload(4 * R)
    with session(cache, cache_limit_bytes=3 * R) as s:
        assert s.read_bytes(f"{object_server.url}/big.bin") == payload(4 * R)
    assert listing(cache) == []


def test_pipe_and_remote_entries_share_one_limit(object_server: ObjectServer, tmp_path: Path):
    cache = tmp_path / "c"
    [shard] = write_shards(tmp_path / "src", tiny_samples(100), per_shard=100)
    pipe_url = f"pipe:cat {shard}"
    _core.read_tar_samples(pipe_url, cache_dir=str(cache))
    pipe_entry = cache / _core.tar_cache_file_name(pipe_url)
    assert pipe_entry.exists()
    _age(pipe_entry, 1000)
    size = pipe_entry.stat().st_size
    object_server.objects["/r.bin"] = payload(2 * R)
    with session(cache, cache_limit_bytes=2 * R + size - 1) as s:
        assert s.read_bytes(f"{object_server.url}/r.bin") == payload(2 * R)
    assert not pipe_entry.exists()  # the older pipe: entry made room
    assert entry(cache, f"{object_server.url}/r.bin").exists()


def test_stale_leftovers_are_cleaned(object_server: ObjectServer, tmp_path: Path):
    cache = tmp_path / "c"
    cache.mkdir()
    url = f"{object_server.url}/x.bin"
    object_server.objects["/x.bin"] = payload(R)
    name = entry(cache, url).name
    # A dead downloader's part and lock files and a dead pipe's temporary, long untouched.
    leftovers = [
        cache / (name + "+part"),
        cache / (name + "+lock"),
        cache / ("0123456789abcdef-y.tar+tmp.1.0"),
    ]
    for p in leftovers:
        p.write_bytes(b"junk")
        _age(p, 3600)
    with session(cache, cache_limit_bytes=10 * R) as s:
        assert s.read_bytes(url) == payload(R)
    assert listing(cache) == [name, name + "+meta"]


def test_closing_mid_download_leaves_nothing(object_server: ObjectServer, tmp_path: Path):
    cache = tmp_path / "c"
    object_server.objects["/z.bin"] = payload(8 * R)
    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        proxy.add(Fault("stall", range_start=3 * R))
        with session(cache, max_in_flight=2, timeout_s=300.0) as s:
            f = s.open(f"{proxy.url}/z.bin")
            assert f.read(R) == payload(R)
            f.close()
        assert listing(cache) == []
