"""Remote reading under faults, injected by a proxy in front of the object
server or the S3 server: retries recover transient faults with the bytes
intact, permanent ones raise chute.ReadError naming the url, the status and
the byte range, a cut response is never taken for the end of a tar, and
closing stops stalled requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
R = 64 * KiB  # range_bytes in these tests


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 11 + seed * 17 + (i >> 10)) % 253 for i in range(n))


def session(**overrides: object) -> chute.remote.RemoteSession:
    settings: dict[str, object] = {
        "range_bytes": R,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "retries": 3,
        "timeout_s": 10.0,
    }
    settings.update(overrides)
    return remote.RemoteSession(remote.RemoteOptions(**settings))  # type: ignore[arg-type]


@dataclass
class Target:
    """An object behind the fault proxy."""

    proxy: FaultProxy
    url: str
    data: bytes
    options: dict[str, object]

    def session(self, **overrides: object) -> chute.remote.RemoteSession:
        return session(**{**self.options, **overrides})

    def gets(self, range_start: int | None = None) -> int:
        """GETs of the object seen by the proxy (of one range, if given)."""
        key = self.url.split("://", 1)[1].split("/", 1)[1]
        return sum(
            1
            for r in self.proxy.requests
            if r.method == "GET"
            and r.path.endswith(key)
            and (range_start is None or (r.range or "").startswith(f"bytes={range_start}-"))
        )


@pytest.fixture(params=["http", "s3"])
def target(request: pytest.FixtureRequest, object_server: ObjectServer) -> Iterator[Target]:
    data = payload(4 * R + 1000)
    if request.param == "http":
        object_server.objects["/d/obj.bin"] = data
        with FaultProxy(object_server.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield Target(proxy, f"{proxy.url}/d/obj.bin", data, {})
    else:
        s3: S3 = request.getfixturevalue("moto_s3")
        bucket = f"faults-{request.node.name.split('[')[0].replace('_', '-')[:40]}"
        s3.bucket(bucket, {"d/obj.bin": data})
        with FaultProxy(s3.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield Target(
                proxy,
                f"s3://{bucket}/d/obj.bin",
                data,
                {"storage_options": s3.storage_options(proxy.url)},
            )


@pytest.mark.parametrize("kind", ["drop", "short", "status-500", "status-503", "delay"])
def test_transient_fault_is_retried(target: Target, kind: str):
    fault = Fault(kind.split("-")[0], range_start=R, seconds=0.2)
    if kind.startswith("status"):
        fault.status = int(kind.split("-")[1])
    target.proxy.add(fault)
    with target.session() as s:
        assert s.read_bytes(target.url) == target.data
        retries = s.stats()["retries"]
    assert fault.hit.is_set()
    expected = 0 if kind == "delay" else 1
    assert retries == expected
    assert target.gets(range_start=R) == 1 + expected


def test_fault_on_the_head_is_retried(target: Target):
    target.proxy.add(Fault("status", method="HEAD", status=502))
    with target.session() as s:
        assert s.read_bytes(target.url) == target.data
        assert s.stats()["retries"] == 1


@pytest.mark.parametrize("status", [403, 404])
def test_forbidden_and_missing_are_not_retried(target: Target, status: int):
    target.proxy.add(Fault("status", status=status, range_start=2 * R))
    with target.session() as s, s.open(target.url) as f:
        # The bytes before the failing range are delivered, then the error.
        assert f.read(2 * R) == target.data[: 2 * R]
        with pytest.raises(chute.ReadError) as info:
            f.read()
        assert s.stats()["retries"] == 0
    message = str(info.value)
    assert target.url in message and f"HTTP {status}" in message
    assert f"bytes {2 * R}-{3 * R - 1}" in message
    assert target.gets(range_start=2 * R) == 1


@pytest.mark.parametrize("status", [403, 404])
def test_head_refused(target: Target, status: int):
    target.proxy.add(Fault("status", method="HEAD", status=status))
    with target.session() as s, pytest.raises(chute.ReadError) as info:
        s.read_bytes(target.url)
    assert target.url in str(info.value) and f"HTTP {status}" in str(info.value)
    assert target.proxy.count("HEAD") == 1


def test_persistent_5xx_gives_up_after_the_retries(target: Target):
    target.proxy.add(Fault("status", status=503, range_start=R, times=100))
    with target.session(retries=2) as s, pytest.raises(chute.ReadError) as info:
        s.read_bytes(target.url)
    message = str(info.value)
    assert "HTTP 503" in message and "gave up after 3 attempts" in message
    assert target.url in message
    assert target.gets(range_start=R) == 3


def test_persistent_short_response_is_an_error_not_an_end(target: Target):
    target.proxy.add(Fault("short", range_start=R, times=100))
    with target.session(retries=1) as s, pytest.raises(chute.ReadError) as info:
        s.read_bytes(target.url)
    assert f"bytes {R}-{2 * R - 1}" in str(info.value)
    assert target.url in str(info.value)


def test_cut_tar_shard_raises_instead_of_ending_early(object_server: ObjectServer, tmp_path: Path):
    [path] = write_shards(tmp_path, tiny_samples(300), per_shard=300)
    data = Path(path).read_bytes()
    object_server.objects["/s.tar"] = data
    with FaultProxy(object_server.port) as proxy:
        # Every attempt at the second range is cut short; the first 64 KiB
        # alone would parse as a valid prefix of samples.
        proxy.add(Fault("drop", range_start=R, times=100))
        with session(retries=2) as s, pytest.raises(chute.ReadError, match="bytes 65536-"):
            s.read_tar(f"{proxy.url}/s.tar")
    assert _core.read_tar_samples(path)  # the shard itself is fine


def test_object_changed_while_read(object_server: ObjectServer):
    data = payload(4 * R)
    object_server.objects["/c.bin"] = data
    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        hold = proxy.add(Fault("stall", range_start=2 * R))
        with session(max_in_flight=1) as s, s.open(f"{proxy.url}/c.bin") as f:
            assert f.read(2 * R) == data[: 2 * R]
            assert hold.hit.wait(60)
            object_server.objects["/c.bin"] = payload(4 * R, seed=5)  # a new version
            hold.release.set()
            with pytest.raises(chute.ReadError, match="changed while it was being read"):
                f.read()
            assert s.stats()["retries"] == 0


def test_timeouts_are_retried_then_fail(object_server: ObjectServer):
    object_server.objects["/t.bin"] = payload(2 * R)
    with FaultProxy(object_server.port) as proxy:
        proxy.add(Fault("stall", range_start=0, times=100))
        with session(timeout_s=0.3, retries=1) as s, pytest.raises(chute.ReadError) as info:
            s.read_bytes(f"{proxy.url}/t.bin")
        assert "gave up after 2 attempts" in str(info.value)
        assert s.stats()["retries"] == 1


def _read_in_thread(f: chute.remote.RemoteFile) -> tuple[threading.Thread, list[BaseException]]:
    """Starts f.read() in a thread and returns once the read holds the
    reader (a read that had not begun before close() would rightly fail as a
    read of a closed file instead)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            f.read()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert _wait_for(lambda: f._reader.reading or not t.is_alive())
    return t, errors


def _wait_for(predicate: object, limit_s: float = 60.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_close_during_a_stalled_request(object_server: ObjectServer):
    object_server.objects["/stall.bin"] = payload(3 * R)
    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        stall = proxy.add(Fault("stall", range_start=R))
        with session(timeout_s=300.0) as s:
            f = s.open(f"{proxy.url}/stall.bin")
            assert f.read(R) == payload(3 * R)[:R]
            t, errors = _read_in_thread(f)
            assert stall.hit.wait(60)
            f.close()
            t.join(10)
            assert not t.is_alive()
            assert len(errors) == 1 and isinstance(errors[0], chute.ReadError)
            assert "stopped" in str(errors[0])
            # The request itself was cancelled: the proxy saw the client go.
            assert _wait_for(lambda: proxy.abandoned == 1)
            assert _wait_for(lambda: s.stats()["in_flight"] == 0)


def test_session_close_during_a_stalled_request(object_server: ObjectServer):
    object_server.objects["/stall.bin"] = payload(R)
    with FaultProxy(object_server.port) as proxy:
        assert isinstance(proxy, FaultProxy)
        stall = proxy.add(Fault("stall", range_start=0))
        s = session(timeout_s=300.0)
        f = s.open(f"{proxy.url}/stall.bin")
        t, errors = _read_in_thread(f)
        assert stall.hit.wait(60)
        s.close()
        t.join(10)
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], chute.ReadError)
        assert not s._executor.alive
        # obstore's thread saw the cancelled request before the fetcher left.
        assert s._executor.store_outstanding_at_exit == 0
        assert _wait_for(lambda: proxy.abandoned == 1)
        f.close()
