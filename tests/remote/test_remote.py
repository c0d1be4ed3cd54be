"""Remote reading at the byte-source level: every url kind read through the
native remote source equals the object's bytes; tar shards parse while they
arrive; stores, listing and the error without the optional dependency."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import chute
import pytest
from chute import _core
from conftest import tiny_samples, write_shards
from remote_servers import S3, ObjectServer, tls_pair

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

remote = pytest.importorskip("chute.remote")
pytest.importorskip("obstore")

KiB = 1024


def session(**overrides: object) -> chute.remote.RemoteSession:
    settings: dict[str, object] = {
        "range_bytes": 64 * KiB,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
    }
    settings.update(overrides)
    return remote.RemoteSession(remote.RemoteOptions(**settings))  # type: ignore[arg-type]


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed * 13 + (i >> 9)) % 251 for i in range(n))


SIZES = [0, 1, 64 * KiB - 1, 64 * KiB, 64 * KiB + 1, 5 * 64 * KiB + 123]


@pytest.mark.parametrize("size", SIZES)
def test_http_bytes_equal_and_ranges(object_server: ObjectServer, size: int):
    data = payload(size)
    object_server.objects["/data/obj.bin"] = data
    with session(max_in_flight=3) as s:
        assert s.read_bytes(f"{object_server.url}/data/obj.bin") == data
        assert s.stats()["reserved_bytes"] == 0
    gets = [r for r in object_server.requests if r.method == "GET"]
    assert object_server.count("HEAD") == 1
    # Ranges of exactly range_bytes (the last one shorter), never past the end.
    expected = [f"bytes={o}-{min(o + 64 * KiB, size) - 1}" for o in range(0, size, 64 * KiB)]
    assert sorted(r.range for r in gets if r.range) == sorted(expected)
    assert len(gets) == len(expected)


def test_read_in_odd_pieces(object_server: ObjectServer):
    data = payload(300 * KiB, seed=1)
    object_server.objects["/o"] = data
    with session() as s, s.open(f"{object_server.url}/o") as f:
        got = bytearray()
        step = 1
        while chunk := f.read(step):
            got += chunk
            step = step * 3 % 70001 + 1
        assert bytes(got) == data
        assert f.read() == b""


def test_object_without_etag(tmp_path: Path):
    with ObjectServer(with_etag=False) as server:
        assert isinstance(server, ObjectServer)
        data = payload(200 * KiB)
        server.objects["/x.bin"] = data
        with session(cache_dir=str(tmp_path)) as s:
            assert s.read_bytes(f"{server.url}/x.bin") == data
            assert s.read_bytes(f"{server.url}/x.bin") == data
        assert not any("if-match" in r.headers for r in server.requests)
        assert server.range_bytes("/x.bin") == len(data)  # the second read was a cache hit


def test_object_with_a_weak_etag(tmp_path: Path):
    # A weak ETag cannot be used with If-Match (it never matches), but still
    # tells versions apart for the cache.
    with ObjectServer(weak_etag=True) as server:
        assert isinstance(server, ObjectServer)
        server.objects["/w.bin"] = payload(150 * KiB)
        url = f"{server.url}/w.bin"
        with session(cache_dir=str(tmp_path)) as s:
            assert s.read_bytes(url) == payload(150 * KiB)
            assert s.read_bytes(url) == payload(150 * KiB)
            server.objects["/w.bin"] = payload(150 * KiB, seed=3)
            assert s.read_bytes(url) == payload(150 * KiB, seed=3)
        assert not any("if-match" in r.headers for r in server.requests)
        assert server.range_bytes("/w.bin") == 2 * 150 * KiB


def test_https_with_a_private_ca():
    context, ca_pem = tls_pair()
    with ObjectServer(tls=context) as server:
        assert isinstance(server, ObjectServer)
        data = payload(150 * KiB)
        server.objects["/secure/shard.tar"] = data
        url = f"{server.url}/secure/shard.tar"
        assert url.startswith("https://")
        with session(client_options={"root_certificate": ca_pem}) as s:
            assert s.read_bytes(url) == data
        # Without the CA the certificate is refused (and not retried for ever).
        with session(retries=1) as s, pytest.raises(chute.ReadError, match="secure/shard.tar"):
            s.read_bytes(url)


def test_s3_bytes_equal(moto_s3: S3):
    objects = {f"train/part-{i}.bin": payload(70 * KiB * i + 5, seed=i) for i in range(4)}
    moto_s3.bucket("bytes-equal", objects)
    with session(storage_options=moto_s3.storage_options()) as s:
        for key, data in objects.items():
            assert s.read_bytes(f"s3://bytes-equal/{key}") == data


def test_s3_from_the_standard_environment(moto_s3: S3, monkeypatch: pytest.MonkeyPatch):
    moto_s3.bucket("from-env", {"a/b.bin": payload(100 * KiB)})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with session() as s:
        assert s.read_bytes("s3://from-env/a/b.bin") == payload(100 * KiB)


def test_unknown_storage_option_is_a_usage_error(moto_s3: S3):
    moto_s3.bucket("bad-option", {"k": b"x"})
    options = {**moto_s3.storage_options(), "no_such_option": "1"}
    with session(storage_options=options) as s, pytest.raises(ValueError, match="no_such_option"):
        s.read_bytes("s3://bad-option/k")


@pytest.mark.parametrize("backend", ["http", "s3"])
def test_tar_parsed_while_arriving_equals_local(
    backend: str, object_server: ObjectServer, moto_s3: S3, tmp_path: Path
):
    [path] = write_shards(tmp_path / "src", tiny_samples(200), per_shard=200)
    data = Path(path).read_bytes()
    if backend == "http":
        object_server.objects["/shards/s.tar"] = data
        url, options = f"{object_server.url}/shards/s.tar", {}
    else:
        moto_s3.bucket("tar-equal", {"shards/s.tar": data})
        url, options = "s3://tar-equal/shards/s.tar", {"storage_options": moto_s3.storage_options()}
    expected = _core.read_tar_samples(path)
    with session(range_bytes=16 * KiB, **options) as s:
        assert s.read_tar(url) == expected
        cache = str(tmp_path / "cache")
    with session(range_bytes=16 * KiB, cache_dir=cache, **options) as s:
        assert s.read_tar(url) == expected  # downloaded into the cache while parsed
        assert s.read_tar(url, in_place=True) == expected  # parsed in place from the cache
        with s.open(url) as f:
            assert f.in_place


def test_hf_urls_resolve_like_huggingface_hub(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert (
        remote.resolve_hf("hf://datasets/org/repo/train/shard-000.tar")
        == "http://127.0.0.1:9/datasets/org/repo/resolve/main/train/shard-000.tar"
    )
    assert (
        remote.resolve_hf("hf://datasets/org/repo@v1.0/a.tar")
        == "http://127.0.0.1:9/datasets/org/repo/resolve/v1.0/a.tar"
    )
    assert (
        remote.resolve_hf("hf://org/model/weights.bin")
        == "http://127.0.0.1:9/org/model/resolve/main/weights.bin"
    )
    assert (
        remote.resolve_hf("hf://spaces/org/app/x.txt")
        == "http://127.0.0.1:9/spaces/org/app/resolve/main/x.txt"
    )
    with pytest.raises(ValueError, match="hf://datasets/ORG/REPO/PATH"):
        remote.resolve_hf("hf://datasets/org")


def test_hf_read_with_token_through_a_redirect(
    object_server: ObjectServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HF_ENDPOINT", object_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    data = payload(200 * KiB)
    # The hub answers resolve urls with a redirect to where the file is stored.
    object_server.redirects["/datasets/org/repo/resolve/main/train/s-0.tar"] = "/blobs/abc"
    object_server.objects["/blobs/abc"] = data
    with session() as s:
        assert s.read_bytes("hf://datasets/org/repo/train/s-0.tar") == data
    resolves = [r for r in object_server.requests if "/resolve/main/" in r.path]
    assert resolves and all(
        r.headers.get("authorization") == "Bearer hf_test_token" for r in resolves
    )
    blob_ranges = [r.range for r in object_server.requests if r.path == "/blobs/abc" and r.range]
    assert len(blob_ranges) == 4  # the Range header survived the redirect


def test_list_objects(moto_s3: S3):
    keys = ["train/a-000.tar", "train/a-001.tar", "train/b.txt", "train/sub/c.tar", "val/d.tar"]
    moto_s3.bucket("listing", {k: b"x" for k in keys})
    with session(storage_options=moto_s3.storage_options()) as s:
        assert s.list_objects("s3://listing/train/*.tar") == [
            "s3://listing/train/a-000.tar",
            "s3://listing/train/a-001.tar",
        ]
        assert s.list_objects("s3://listing/train/**.tar") == [
            "s3://listing/train/a-000.tar",
            "s3://listing/train/a-001.tar",
            "s3://listing/train/sub/c.tar",
        ]
        assert s.list_objects("s3://listing/train/a-00[!0].tar") == ["s3://listing/train/a-001.tar"]
        assert s.list_objects("s3://listing/*/?-000.tar") == ["s3://listing/train/a-000.tar"]
        assert s.list_objects("s3://listing/val") == ["s3://listing/val/d.tar"]
        assert s.list_objects("s3://listing/nothing/*.tar") == []
        with pytest.raises(ValueError, match="no listing"):
            s.list_objects("http://127.0.0.1:9/dir/*.tar")


def test_prefetch_budget_is_shared_and_bounded(object_server: ObjectServer):
    r = 64 * KiB
    object_server.objects["/a"] = payload(10 * r, seed=1)
    object_server.objects["/b"] = payload(10 * r, seed=2)
    with session(prefetch_bytes=3 * r, max_in_flight=4) as s:
        fa = s.open(f"{object_server.url}/a")
        assert fa.read(1) == payload(1, seed=1)
        fb = s.open(f"{object_server.url}/b")
        assert fb.read(1) == payload(1, seed=2)
        # a holds the budget (3 ranges); b may still take one range so that it
        # can never be starved: 4 ranges in all, no more.
        assert s.stats()["reserved_bytes"] == 4 * r
        # The reservations are made; the requests reach the server in their
        # own time (later on a busy machine).
        expected = {"/a": 3 * r, "/b": r}
        deadline = time.monotonic() + 30  # a hang guard, not a measure
        while time.monotonic() < deadline and any(
            object_server.range_bytes(path) < n for path, n in expected.items()
        ):
            time.sleep(0.01)
        assert {path: object_server.range_bytes(path) for path in expected} == expected
        assert payload(1, seed=1) + fa.read() == payload(10 * r, seed=1)
        assert payload(1, seed=2) + fb.read() == payload(10 * r, seed=2)
        fa.close()
        fb.close()
        assert s.stats()["reserved_bytes"] == 0


def test_closed_session_stops_its_thread(object_server: ObjectServer):
    object_server.objects["/a"] = b"abc"
    s = session()
    assert s.read_bytes(f"{object_server.url}/a") == b"abc"
    names = {t.name for t in threading.enumerate()}
    assert "chute-fetch" in names
    s.close()
    assert not s._executor.alive
    with pytest.raises(ValueError, match="closed"):
        s.open(f"{object_server.url}/a")


def test_close_waits_for_the_store_threads_to_leave_python(
    object_server: ObjectServer, monkeypatch: pytest.MonkeyPatch
):
    # obstore's own thread hands each result to the fetcher's loop and then
    # still has to return through Python (the loop's wake-up write releases
    # the GIL). Were the process to finalize meanwhile, that thread would be
    # unwound through obstore's frames and the process would abort; so
    # close() returns only after every such thread has left.
    object_server.objects["/a"] = payload(3 * 64 * KiB, seed=3)
    wake = asyncio.selector_events.BaseSelectorEventLoop._write_to_self
    lock = threading.Lock()
    calls = {"entered": 0, "left": 0}
    # Not counted: the loop's own thread, and this one (opening a session
    # wakes the shared fetcher's loop to serve it).
    loop_threads: set[int | None] = {threading.get_ident()}

    def slow_wake(loop: asyncio.AbstractEventLoop) -> None:
        wake(loop)  # type: ignore[arg-type]
        if threading.get_ident() in loop_threads:
            return
        with lock:
            calls["entered"] += 1
        time.sleep(0.2)  # the loop has its result already and carries on
        with lock:
            calls["left"] += 1

    monkeypatch.setattr(asyncio.selector_events.BaseSelectorEventLoop, "_write_to_self", slow_wake)
    with session() as s:
        loop_threads.add(s._executor._thread.ident)
        assert s.read_bytes(f"{object_server.url}/a") == payload(3 * 64 * KiB, seed=3)
    with lock:
        assert calls["entered"] == 7  # the HEAD; each of three ranges: its GET, its body
        assert calls["left"] == calls["entered"]
    assert s._executor.store_outstanding_at_exit == 0


@pytest.mark.parametrize("closed", [True, False])
def test_a_process_exits_cleanly_while_store_threads_return(
    object_server: ObjectServer, closed: bool
):
    # As above, with obstore's threads made slow to leave Python after each
    # answer: a process that exits right after its reads must not abort
    # (SIGABRT when one of them touches the GIL while the interpreter
    # finalizes), whether it closed its session or left that to exit.
    object_server.objects["/a"] = b"abc"
    script = textwrap.dedent(
        f"""
        import asyncio, threading, time
        from chute.remote import RemoteSession
        from asyncio.selector_events import BaseSelectorEventLoop
        wake = BaseSelectorEventLoop._write_to_self
        def slow_wake(loop):
            wake(loop)
            if threading.current_thread().name != "chute-fetch":
                until = time.monotonic() + 0.5
                while time.monotonic() < until:
                    time.sleep(0.001)
        BaseSelectorEventLoop._write_to_self = slow_wake
        s = RemoteSession()
        assert s.read_bytes("{object_server.url}/a") == b"abc"
        if {closed}:
            s.close()
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_shared_sessions_per_options(object_server: ObjectServer):
    object_server.objects["/a"] = b"abc"
    opts = remote.RemoteOptions(range_bytes=64 * KiB)
    assert remote.get_session(opts) is remote.get_session(
        remote.RemoteOptions(range_bytes=64 * KiB)
    )
    assert remote.get_session(opts) is not remote.get_session(remote.RemoteOptions())
    with remote.open_url(f"{object_server.url}/a", opts) as f:
        assert f.read() == b"abc"


def fetch_threads() -> int:
    return sum(t.name == "chute-fetch" for t in threading.enumerate())


def test_datasets_with_distinct_options_share_one_fetch_thread(
    object_server: ObjectServer, tmp_path: Path
):
    # Each distinct set of options has its own session (its own queue and
    # byte budget), for the life of the process; they do not each add a
    # thread, so a job that opens many datasets does not grow without bound.
    shard = write_shards(tmp_path / "shards", tiny_samples(8), per_shard=8)[0]
    object_server.objects["/shard.tar"] = Path(shard).read_bytes()
    url = f"{object_server.url}/shard.tar"
    local = chute.TarDataset(shard)[5]
    for i in range(6):
        options = remote.RemoteOptions(range_bytes=64 * KiB + i, backoff_s=0.01)
        ds = chute.TarDataset(url, index=tmp_path / "index", remote=options)
        assert ds[5]["__key__"] == local["__key__"]
        assert fetch_threads() == 1
        del ds
    # A session opened and closed on the side ends nothing the others use.
    with session(range_bytes=32 * KiB) as s:
        assert s.read_bytes(url) == Path(shard).read_bytes()
    assert fetch_threads() == 1
    assert chute.TarDataset(url, index=tmp_path / "index", remote=options)[5]["cls"] == local["cls"]


def test_options_are_checked():
    with pytest.raises(ValueError, match="range_bytes"):
        remote.RemoteOptions(range_bytes=0)
    with pytest.raises(ValueError, match="retries"):
        remote.RemoteOptions(retries=-1)


def test_remote_url_without_a_session_names_the_extra():
    with pytest.raises(ValueError, match=r"chute\[remote\]"):
        _core.read_tar_samples("s3://bucket/shard.tar")


def test_missing_obstore_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(remote.RemoteDependencyError, match=r"chute\[remote\]") as info:
        remote.RemoteSession()
    assert isinstance(info.value, ImportError)


def test_a_forked_child_fails_clearly(object_server: ObjectServer):
    # obstore's runtime does not survive a fork: a child that uses it hangs.
    object_server.objects["/a"] = b"abc"
    script = textwrap.dedent(
        f"""
        import os, sys
        from chute.remote import RemoteForkError, RemoteOptions, RemoteSession
        with RemoteSession(RemoteOptions()) as s:
            assert s.read_bytes("{object_server.url}/a") == b"abc"
        pid = os.fork()
        if pid == 0:
            try:
                RemoteSession(RemoteOptions())
            except RemoteForkError as e:
                os._exit(0 if "spawn" in str(e) else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60)
    assert done.returncode == 0


def test_an_unknown_scheme_lists_the_schemes_read():
    # The list is the engine's own (remote_schemes), the one place that decides.
    schemes = ", ".join(
        f"{name}://" for scheme in _core.remote_schemes() for name in (scheme.name, *scheme.aliases)
    )
    assert schemes.startswith("http://, https://, s3://, s3a://, gs://") and "hf://" in schemes
    expected = (
        "unsupported url 'ftp://host/shard.tar': chute reads local files, pipe: commands and "
        f"{schemes} urls; for others use a pipe, e.g. 'pipe:curl -sf ftp://host/shard.tar'"
    )
    with pytest.raises(ValueError) as info:
        list(chute.WebDataset("ftp://host/shard.tar", shardshuffle=False))
    assert expected in str(info.value)
    with pytest.raises(ValueError) as info:
        chute.TarDataset("ftp://host/shard.tar")
    assert str(info.value) == (
        f"TarDataset reads local shards and {schemes} urls; 'ftp://host/shard.tar' is neither"
    )


def test_a_refused_connection_asks_whether_the_server_runs():
    import socket

    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/shard-000000.tar"
        with session(retries=1) as s, pytest.raises(chute.ReadError) as info:
            s.read_bytes(url)
    message = str(info.value)
    assert message.startswith(f"cannot read '{url}': ")
    assert "(connection refused: is the server running?)" in message
    assert "gave up after 2 attempts" in message
