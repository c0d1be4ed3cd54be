"""HTTP servers that ignore ``Range`` (Python's own http.server, many static
hosts): they answer a ranged GET with status 200 and the whole object.
Shards read as streams come from one plain GET each and equal webdataset's
read of the same urls; readers that need random access are refused with a
message that says why."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
from conftest import tiny_samples, write_shards

remote = pytest.importorskip("chute.remote")
pytest.importorskip("obstore")
webdataset = pytest.importorskip("webdataset")

R = 64 * 1024


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class PlainServer:
    """``python -m http.server`` on 127.0.0.1, serving `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gets: list[str | None] = []  # the Range header of every GET

        server = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                server.gets.append(self.headers.get("Range"))
                super().do_GET()

        self._server = ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> PlainServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[PlainServer, list[str], list[str]]]:
    """Three shards of several ranges each: the server, their urls, the local paths."""
    shards = write_shards(tmp_path / "local", tiny_samples(450, seed=3), per_shard=150)
    root = tmp_path / "www"
    root.mkdir()
    for path in shards:
        shutil.copy(path, root / Path(path).name)
    with PlainServer(root) as server:
        yield server, [f"{server.url}/{Path(p).name}" for p in shards], shards


def options(**overrides: Any) -> Any:
    settings: dict[str, Any] = {"range_bytes": R, "backoff_s": 0.01, "max_backoff_s": 0.05}
    settings.update(overrides)
    return remote.RemoteOptions(**settings)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def test_the_server_ignores_range(served: tuple[PlainServer, list[str], list[str]]):
    import urllib.request

    server, urls, shards = served
    request = urllib.request.Request(urls[0], headers={"Range": "bytes=0-99"})
    with urllib.request.urlopen(request) as response:
        assert response.status == 200
        assert response.read() == Path(shards[0]).read_bytes()


@pytest.mark.parametrize("cached", [False, True])
def test_webdataset_reads_it_as_webdataset_does(
    served: tuple[PlainServer, list[str], list[str]], tmp_path: Path, cached: bool
):
    server, urls, shards = served
    assert all(Path(p).stat().st_size > 3 * R for p in shards)  # several ranges each
    expected = list(webdataset.WebDataset(urls, shardshuffle=False))  # curl, as a stream
    cache = str(tmp_path / "cache") if cached else None
    if cache is not None:
        Path(cache).mkdir()
    ds = chute.WebDataset(urls, shardshuffle=False, cache_dir=cache, remote=options())
    assert same(list(ds), expected)
    decoded = chute.WebDataset(urls, shardshuffle=False, remote=options())
    reference = webdataset.WebDataset(urls, shardshuffle=False)
    assert same(
        list(decoded.decode().to_tuple("__key__", "npy", "cls").batched(16)),
        list(reference.decode().to_tuple("__key__", "npy", "cls").batched(16)),
    )
    if cached:
        gets = len(server.gets)
        assert same(list(ds), expected)  # from the cache, checked: no GET
        assert len(server.gets) == gets


def test_random_access_is_refused_clearly(served: tuple[PlainServer, list[str], list[str]]):
    server, urls, shards = served
    with remote.RemoteSession(options(retries=0)) as session:
        ranges = session.ranges(urls[0])
        assert ranges.size == Path(shards[0]).stat().st_size
        with pytest.raises(Exception, match="ignores Range requests") as info:
            ranges.read(R, 100)
    assert urls[0] in str(info.value)
    assert "cannot be read at random" in str(info.value)
