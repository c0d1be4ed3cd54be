"""Shared test data: small, seeded shards written by the real tools."""

from __future__ import annotations

import gc
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from remote_servers import moto_s3, object_server  # noqa: F401  (fixtures)

# chute_testing holds the test-only entry points, in a module that the wheel
# does not ship: scripts/dev_build.sh links it into python/ (beside the
# package), scripts/sanitize.sh into build/<variant>/pkg/, and scripts/test.sh
# builds it and puts it alone on PYTHONPATH beside the installed wheel.
try:
    import chute_testing  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "the tests need chute_testing, chute's test-only extension module: build it with "
        "scripts/dev_build.sh and run with PYTHONPATH=python (scripts/test.sh and "
        "scripts/sanitize.sh build and find their own)"
    ) from exc

os.environ.setdefault("WDS_SEED", "0")  # webdataset's own seed, for reproducible references

# Hypothesis profiles (tests/conformance/): "ci", the default, runs a fixed,
# derandomized set of examples per invariant and kind, sized for the whole
# suite to take a few minutes on two cores; "long" (--hypothesis-profile=long)
# draws many more afresh each run, for hunting locally.
_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
hypothesis_settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("CHUTE_CONFORMANCE_EXAMPLES", "4")),
    derandomize=True,
    database=None,
    deadline=None,
    # A failure is reported as found, not shrunk: shrinking runs loaders by
    # the hundred (the long profile shrinks).
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=_SLOW_DATA,
    print_blob=True,
)
hypothesis_settings.register_profile(
    "long", max_examples=150, deadline=None, suppress_health_check=_SLOW_DATA, print_blob=True
)
hypothesis_settings.load_profile("ci")

# Under AddressSanitizer (scripts/sanitize.sh), a process forked while
# another of its threads is inside malloc can hang for good: GCC's libasan
# takes no allocator lock around fork(), so the child (a torch or chute
# DataLoader worker) waits on a lock that no thread of it will release. A
# test still running after this many seconds has its children that hang so
# (one thread, waiting on a futex) killed, which its loader reports as a
# dead worker, and the test is reported as skipped for that reason rather
# than failed, or the whole run left hanging.
SANITIZER_FORK_WATCH_S = float(os.environ.get("CHUTE_SANITIZER_FORK_WATCH_S", "120"))


def _children_hung_in_a_futex() -> list[int]:
    """This process's children (and theirs) that have one thread, asleep
    on a futex: a lock that nothing in them can release."""
    hung = []
    pending = [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            pending.append(kid)
            try:
                threads = os.listdir(f"/proc/{kid}/task")
                wchan = Path(f"/proc/{kid}/wchan").read_text()
            except OSError:
                continue
            if len(threads) == 1 and "futex" in wchan:
                hung.append(kid)
    return hung


_killed_for_fork_hang: dict[str, list[int]] = {}

if os.environ.get("CHUTE_SANITIZER") == "address":
    # The test running now and when it started. One watching thread for the
    # whole session, started before any test: a thread per test would be
    # counted by the tests that check that no thread outlives a loader.
    _running: dict[str, tuple[str, float]] = {}

    def _watch_for_fork_hangs() -> None:
        while True:
            time.sleep(1.0)
            current = _running.get("test")
            if current is None or time.monotonic() - current[1] < SANITIZER_FORK_WATCH_S:
                continue
            for pid in _children_hung_in_a_futex():
                _killed_for_fork_hang.setdefault(current[0], []).append(pid)
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=_watch_for_fork_hangs, name="fork-hang-watch", daemon=True).start()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
        _running["test"] = (item.nodeid, time.monotonic())
        try:
            yield
        finally:
            _running.pop("test", None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        outcome = yield
        report = outcome.get_result()
        killed = _killed_for_fork_hang.get(item.nodeid)
        if killed and call.when == "call" and report.failed:
            report.outcome = "skipped"
            report.longrepr = (
                str(item.path),
                item.location[1] or 0,
                f"Skipped: forked children {killed} hung on libasan's allocator lock "
                "(GCC's libasan takes no lock around fork); killed after "
                f"{SANITIZER_FORK_WATCH_S:.0f} s",
            )


@pytest.fixture(autouse=True, scope="session")
def forkserver_started_with_a_clean_environment() -> None:
    """multiprocessing's forkserver is one process per session, and every
    worker it forks inherits the environment it was started with: started
    first by a test that simulates ranks (RANK/WORLD_SIZE set), it would
    make later tests' forkserver workers see several ranks."""
    import multiprocessing.forkserver

    multiprocessing.forkserver.ensure_running()


@pytest.fixture(autouse=True, scope="module")
def _earlier_modules_garbage_collected() -> None:
    """Datasets that earlier test modules dropped in reference cycles are
    freed (their engines' threads ended) before a module's tests run: a
    loader forks its workers only while no chute thread runs
    (``resolve_context``), so what a module's tests see must not depend on
    which modules ran before it, nor on when Python last collected.

    chute's datasets hold nothing that holds them back (see
    dataset_kinds/test_dataset_lifetimes.py); what still makes such cycles
    is a raised error: its traceback holds the frames it passed through,
    among them a method's (whose ``self`` is the dataset) and one that holds
    the error itself (a ``pytest.raises`` block's ``info``, a handler's
    ``raise error`` of a local), so the dataset lives until a collection."""
    gc.collect()


def same_values(a: object, b: object) -> bool:
    """Nested samples or batches hold equal values (arrays and tensors by
    value, whatever their type)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (np.ndarray, torch.Tensor)):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return bool(a == b)


def assert_same_typed(a: object, b: object) -> None:
    """Nested batches are equal in type, dtype, shape and value (tensors
    compared on the CPU, wherever they live)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_typed(x, y)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same_typed(a[k], b[k])
    else:
        assert a == b


def jpeg_bytes(rng: np.random.Generator, height: int, width: int, quality: int = 90) -> bytes:
    from PIL import Image

    # Smooth gradients plus noise: compresses like a photo, not like static.
    y = np.linspace(0, 1, height)[:, None, None]
    x = np.linspace(0, 1, width)[None, :, None]
    base = (y * rng.uniform(50, 200, 3) + x * rng.uniform(0, 50, 3)).astype(np.float32)
    pixels = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def png_bytes(rng: np.random.Generator, height: int, width: int) -> bytes:
    from PIL import Image

    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def write_shards(
    directory: Path, samples: list[dict[str, object]], per_shard: int, prefix: str = "shard"
) -> list[str]:
    """Writes samples with webdataset's ShardWriter-compatible TarWriter, one
    tar per `per_shard` samples; returns the shard paths in order."""
    import webdataset

    directory.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    for start in range(0, len(samples), per_shard):
        path = directory / f"{prefix}-{start // per_shard:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for sample in samples[start : start + per_shard]:
                sink.write(sample)
        paths.append(str(path))
    return paths


def tiny_samples(n: int, seed: int = 0, dim: int = 64) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "__key__": f"sample{i:07d}",
            "npy": rng.standard_normal(dim).astype(np.float32),
            "cls": int(rng.integers(0, 1000)),
        }
        for i in range(n)
    ]


def image_samples(
    n: int, seed: int = 0, size: tuple[int, int] = (32, 40), png_every: int = 0
) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    out: list[dict[str, object]] = []
    for i in range(n):
        sample: dict[str, object] = {"__key__": f"img{i:06d}", "cls": int(rng.integers(0, 10))}
        if png_every and i % png_every == 0:
            sample["png"] = png_bytes(rng, *size)
        else:
            sample["jpg"] = jpeg_bytes(rng, *size)
        out.append(sample)
    return out


def shard_with_a_cut_jpeg(folder: Path, bad: int, n: int = 8) -> str:
    """One shard of `n` image samples (jpg, cls) whose sample `bad` has its
    JPEG cut in half: its header reads, its body does not."""
    samples = image_samples(n, seed=5)
    data = samples[bad]["jpg"]
    assert isinstance(data, bytes)
    samples[bad]["jpg"] = data[: len(data) // 2]
    return write_shards(folder, samples, per_shard=n)[0]


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("tiny"), tiny_samples(1000), per_shard=250)


@pytest.fixture(scope="session")
def image_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(
        tmp_path_factory.mktemp("images"), image_samples(120, png_every=7), per_shard=40
    )


@pytest.fixture(scope="session")
def fmri_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The layout of our users' fMRI shards: image + voxels + trial per sample."""
    rng = np.random.default_rng(3)
    samples: list[dict[str, object]] = []
    for i in range(90):
        samples.append(
            {
                "__key__": f"trial{i:05d}",
                "jpg": jpeg_bytes(rng, 24, 24),
                "nsdgeneral.npy": npy_bytes(rng.standard_normal(300).astype(np.float32)),
                "trial.npy": npy_bytes(np.array([i], dtype=np.int64)),
            }
        )
    return write_shards(tmp_path_factory.mktemp("fmri"), samples, per_shard=30)


FRAMEWORK_SAMPLES = 1000


@pytest.fixture(scope="session")
def framework_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What tests/frameworks/ train on: 1,000 samples with an id as x.npy
    and id.npy, and as 10 tar shards of 100 (members x.npy and id.cls)."""
    import webdataset

    data = tmp_path_factory.mktemp("framework-data")
    x = np.random.default_rng(0).standard_normal((FRAMEWORK_SAMPLES, 4)).astype(np.float32)
    np.save(data / "x.npy", x)
    np.save(data / "id.npy", np.arange(FRAMEWORK_SAMPLES, dtype=np.int64))
    for shard in range(10):
        with webdataset.TarWriter(str(data / f"shard-{shard:06d}.tar")) as sink:
            for i in range(shard * 100, (shard + 1) * 100):
                sink.write({"__key__": f"s{i:06d}", "x.npy": x[i], "id.cls": i})
    return data
