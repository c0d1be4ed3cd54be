"""Checks several test folders share: webdataset outputs compared exactly,
ranks of a distributed run simulated in turn in one process, what the
tar fault tests build and assert, and streaming's modules (MDS writer and
reader) imported."""

from __future__ import annotations

import collections
import importlib
import importlib.machinery
import importlib.util
import itertools
import os
import re
import struct
import sys
import tarfile
import types
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Exact equality of nested webdataset outputs, types included."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {set(a)} != {set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def run_ranks(
    monkeypatch: pytest.MonkeyPatch,
    world: int,
    make: Callable[[], Any],
    ids: Callable[[Any], list[Any]],
    state: dict[str, Any] | None = None,
    batches: int | None = None,
) -> tuple[list[list[list[Any]]], list[dict[str, Any]]]:
    """Each rank of `world`: a fresh loader from `make()`, `state` loaded,
    `batches` batches (all when None); its batches (as sample ids) and its
    state after them."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    delivered, states = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        loader = make()
        loader.set_epoch(2)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        delivered.append([ids(b) for b in (itertools.islice(it, batches) if batches else it)])
        states.append(loader.state_dict())
    return delivered, states


def assert_resume_mid_epoch_is_exact(
    make: Callable[[], Any], fields: list[str], head_batches: int = 3
) -> dict[str, Any]:
    """Epoch 1 of a fresh loader from `make()`, stopped after `head_batches`
    and resumed from its state in another fresh loader, gives the batches of
    the whole epoch read at once, each of `fields` equal; returns the state."""
    whole = make()
    whole.set_epoch(1)
    expected = list(whole)
    first = make()
    first.set_epoch(1)
    it = iter(first)
    head = [next(it) for _ in range(head_batches)]
    state: dict[str, Any] = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    for a, b in zip(head + list(resumed), expected, strict=True):
        for field in fields:
            assert_same(a[field], b[field], field)
    return state


def batch_ids(batch: Any) -> list[Any]:
    """A batch's ``"id"`` column, as the ids `run_ranks` collects."""
    ids: list[Any] = batch["id"].tolist()
    return ids


def remote_test_options(range_bytes: int, /, **overrides: Any) -> Any:
    """``RemoteOptions`` for reads from the tests' local object servers:
    ranged reads of `range_bytes`, retries that back off briefly, then
    `overrides`."""
    from chute.remote import RemoteOptions

    settings: dict[str, Any] = {
        "range_bytes": range_bytes,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
        **overrides,
    }
    return RemoteOptions(**settings)


def counts(*parts: list[list[list[Any]]]) -> collections.Counter[Any]:
    return collections.Counter(i for part in parts for rank in part for b in rank for i in b)


def assert_equal_batch_counts(part: list[list[list[Any]]], expected: int) -> None:
    assert [len(rank) for rank in part] == [expected] * len(part)


def keys(batch: Any) -> list[str]:
    return list(batch[0])


def member_offsets(path: Path) -> dict[str, int]:
    with tarfile.open(path) as tf:
        return {m.name: m.offset for m in tf.getmembers()}


def assert_names(message: str, shard: str, where: str | None = None) -> None:
    assert f"'{shard}'" in message, message
    assert re.search(r"offset \d+", message), message
    if where is not None:
        assert where in message, message


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(height: int, width: int) -> bytes:
    """A valid little PNG whose IHDR (with a correct CRC) declares another size."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" + b"\x00" * 6 + b"\x00" + b"\x00" * 6)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", pixels)
        + _png_chunk(b"IEND", b"")
    )


def rewrite_with_its_times_set_back(path: Path, write: Callable[[], None]) -> None:
    """Runs `write`, which rewrites `path` in place (same inode), once the
    file system's clock has moved past `path`'s change time (file times
    tick coarsely), then sets its access and modification times back: what
    is left to tell the rewrite from the file is its change time."""
    before = path.stat()
    probe = path.with_name(path.name + ".probe")
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns != before.st_ctime_ns:
            probe.unlink()
            break
    write()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


class CollectingHandler:
    """A webdataset handler that keeps the errors it is handed and skips
    their samples."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def __call__(self, error: BaseException) -> bool:
        self.errors.append(error)
        return True


def refusing_handler(error: BaseException) -> bool:
    """A handler no error may reach: one routed to it fails the test."""
    raise AssertionError(f"the wrong handler got {type(error).__name__}: {error}")


def streaming_module(name: str) -> Any:
    """A module of streaming (streaming-community), imported without running
    the package's ``__init__``, which imports torchvision for its vision
    datasets (neither its writer nor its reader uses it)."""
    for needed in ("brotli", "snappy", "zstd", "xxhash", "catalogue"):
        pytest.importorskip(needed)
    if not getattr(sys.modules.get("streaming"), "_chute_stub", False):
        spec = importlib.util.find_spec("streaming")
        if spec is None or spec.origin is None:
            pytest.skip("streaming (streaming-community) is not installed")
        root = os.path.dirname(spec.origin)
        for package, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
            stub = types.ModuleType(package)
            stub.__path__ = [path]
            stub.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
            stub._chute_stub = True  # type: ignore[attr-defined]
            sys.modules[package] = stub
    return importlib.import_module(name)


def child_env() -> dict[str, str]:
    """The environment of a child interpreter that imports the same chute
    as this one (the dev tree or the installed wheel)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))


def run_json_probe(script: str, *args: str, timeout: float = 300) -> Any:
    """Runs `script` in a fresh interpreter (`child_env`) with `args` and
    returns the JSON its last line of output holds; a failing script fails
    the test with its output."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
