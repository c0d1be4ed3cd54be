"""HTTP servers that ignore ``Range`` (Python's own http.server, many static
hosts): they answer a ranged GET with status 200 and the whole object.
Shards read as streams come from one plain GET each and equal webdataset's
read of the same urls; readers that need random access are refused with a
message that says why."""

from __future__ import annotations

import functools
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import chute
import pytest
from conftest import same_values, tiny_samples, write_shards
from helpers import remote_test_options

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
        urls = [f"{server.url}/{Path(p).name}" for p in shards]
        # What these tests are about: a ranged GET answered with the whole body.
        request = urllib.request.Request(urls[0], headers={"Range": "bytes=0-99"})
        with urllib.request.urlopen(request) as response:
            assert response.status == 200
            assert response.read() == Path(shards[0]).read_bytes()
        server.gets.clear()
        yield server, urls, shards


def options(**overrides: Any) -> Any:
    return remote_test_options(R, **overrides)


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
    assert same_values(list(ds), expected)
    decoded = chute.WebDataset(urls, shardshuffle=False, remote=options())
    reference = webdataset.WebDataset(urls, shardshuffle=False)
    assert same_values(
        list(decoded.decode().to_tuple("__key__", "npy", "cls").batched(16)),
        list(reference.decode().to_tuple("__key__", "npy", "cls").batched(16)),
    )
    if cached:
        gets = len(server.gets)
        assert same_values(list(ds), expected)  # from the cache, checked: no GET
        assert len(server.gets) == gets


def test_random_access_reads_a_kept_copy(served: tuple[PlainServer, list[str], list[str]]):
    server, urls, shards = served
    data = Path(shards[0]).read_bytes()
    with remote.RemoteSession(options()) as session:
        ranges = session.ranges(urls[0])
        assert ranges.size == len(data)
        for offset, size in [(3 * R + 5, 100), (10, 2 * R), (len(data) - 7, 7), (0, 1)]:
            assert ranges.read(offset, size) == data[offset : offset + size]
    # One ranged GET answered whole (refused), then one download of the object.
    assert server.gets == [f"bytes={3 * R + 5}-{3 * R + 104}", None]


def test_tar_dataset_equals_the_local_one(served: tuple[PlainServer, list[str], list[str]]):
    server, urls, shards = served
    ds = chute.TarDataset(urls, remote=options())
    local = chute.TarDataset(shards)
    assert len(ds) == len(local) == 450
    order = [449, 0, 151, 300, 2, 448]
    for i in order:
        assert same_values(without_url(ds[i]), without_url(local[i]))
    got = list(chute.DataLoader(ds, batch_size=16, shuffle=True, generator=seeded()))
    want = list(chute.DataLoader(local, batch_size=16, shuffle=True, generator=seeded()))
    assert same_values([without_url(b) for b in got], [without_url(b) for b in want])


def test_random_access_past_the_bound_is_refused_clearly(
    served: tuple[PlainServer, list[str], list[str]],
):
    server, urls, shards = served
    limit = Path(shards[0]).stat().st_size - 1
    with remote.RemoteSession(options(retries=0, prefetch_bytes=limit)) as session:
        ranges = session.ranges(urls[0])
        with pytest.raises(ValueError) as info:
            ranges.read(R, 100)
    message = str(info.value)
    assert message.startswith(f"cannot read '{urls[0]}' (bytes {R}-{R + 99} of ")
    assert "ignores Range requests" in message
    assert f"larger than the {limit} bytes (prefetch_bytes)" in message


def seeded() -> Any:
    import torch

    return torch.Generator().manual_seed(5)


def without_url(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: v for k, v in x.items() if k not in ("__url__", "__local_path__")}
    return x
