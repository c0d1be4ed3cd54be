"""Shutdown paths: every way an iteration can end must stop the native
threads promptly and give back every descriptor and child process.

Native threads are invisible to ``threading``; the tests count the kernel's
view instead (/proc/self/task for threads, /proc/self/fd for descriptors).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import h5py
import numpy as np
import pytest

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

# Each shutdown must finish inside this. It is a hang detector, not a
# benchmark: generous, so that a loaded CI machine never trips it, while a
# thread or command that does not stop (`sleep 30` pipes, say) still does.
PROMPT_S = 25.0


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_names() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used
            out.add(f"{fd}:{os.readlink(f'/proc/self/fd/{fd}')}")
    return out


def children() -> list[str]:
    pid = os.getpid()
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def settle(expected_tasks: int, expected_fds: int, limit: float = PROMPT_S) -> tuple[int, int]:
    """Counts after gc, polling until none is above the expected one (then
    the expected counts) or `limit` passes: a joined thread leaves
    /proc/self/task a moment after join() returns, later still on a busy
    machine. Fewer is no leak: torch lets its intra-op pool thread go when
    the guard around Python stages sets one thread."""
    deadline = time.monotonic() + limit
    while True:
        gc.collect()
        now = (tasks(), fds())
        if now[0] <= expected_tasks and now[1] <= expected_fds:
            return (expected_tasks, expected_fds)
        if time.monotonic() > deadline:
            return now
        time.sleep(0.02)


@pytest.fixture()
def baseline(tiny_shards: list[str], h5_file: Path) -> Iterator[tuple[int, int]]:
    # Warm up what starts lazily and lives for the process (torch's intra-op
    # pool, h5py's state) so that it is not mistaken for a leak.
    list(chute.DataLoader(stream(tiny_shards), batch_size=None, num_workers=2))
    list(chute.DataLoader(chute.H5Dataset(h5_file, {"x": "x"}), batch_size=64, num_workers=2))
    gc.collect()
    before = (tasks(), fds())
    names = fd_names()
    # multiprocessing's forkserver and resource tracker, once an earlier test
    # started them, stay for the life of the process: only new ones leak.
    kids = set(children())
    yield before
    assert settle(*before) == before, f"threads or descriptors leaked: {fd_names() - names}"
    assert set(children()) <= kids


@pytest.fixture(scope="module")
def h5_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("h5") / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "x",
            data=np.arange(20000 * 16, dtype="f4").reshape(20000, 16),
            chunks=(256, 16),
            compression="gzip",
        )
    return path


def stream(urls: list[str], **kw: Any) -> Any:
    return (
        chute.WebDataset(urls, shardshuffle=False, **kw).decode().to_tuple("npy", "cls").batched(16)
    )


def stalled(**kw: Any) -> Any:
    """A shard whose command never produces a byte (no pipe_timeout)."""
    return chute.WebDataset(["pipe:sleep 30"], shardshuffle=False, **kw).to_tuple("__key__")


def timed(fn: Callable[[], Any]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names


def eventually(condition: Callable[[], bool], limit: float = PROMPT_S) -> bool:
    """Whether `condition` holds within `limit` seconds (polled): a thread
    names itself once it runs, which a busy machine may delay."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_engine_threads_are_named_for_top_and_profilers(baseline, tiny_shards, h5_file) -> None:
    before = thread_names()
    it = iter(chute.DataLoader(stream(tiny_shards, repeat=True), batch_size=None, num_workers=3))
    next(it)
    assert eventually(lambda: thread_names().count("chute-decode") == 3), thread_names()
    names = thread_names()
    assert names.count("chute-stream") == 1 and names.count("chute-batch") == 1
    del it
    it2 = iter(chute.DataLoader(chute.H5Dataset(h5_file, {"x": "x"}), batch_size=8, num_workers=2))
    next(it2)
    assert eventually(lambda: thread_names().count("chute-read") == 2), thread_names()
    del it2
    settle(*baseline)
    assert eventually(lambda: not [n for n in thread_names() if n.startswith("chute-")]), before


# ---------------------------------------------------------------- ending early


@pytest.mark.parametrize("kind", ["stream", "h5"])
def test_break_mid_epoch(baseline, tiny_shards, h5_file, kind: str) -> None:
    if kind == "stream":
        dl = chute.DataLoader(stream(tiny_shards, repeat=True), batch_size=None, num_workers=2)
    else:
        dl = chute.DataLoader(chute.H5Dataset(h5_file, {"x": "x"}), batch_size=8, num_workers=2)
    seen = 0
    start = time.monotonic()
    for _ in dl:
        seen += 1
        if seen == 5:
            break
    assert time.monotonic() - start < PROMPT_S
    assert seen == 5
    # The threads are gone as soon as the loop is left; the dataset itself
    # may keep its files open until it dies.
    assert settle(baseline[0], fds())[0] == baseline[0]
    del dl
    assert settle(*baseline) == baseline


@pytest.mark.parametrize("kind", ["stream", "stalled-pipe", "h5"])
def test_delete_loader_and_iterator_mid_epoch(baseline, tiny_shards, h5_file, kind: str) -> None:
    if kind == "stream":
        dl = chute.DataLoader(stream(tiny_shards, repeat=True), batch_size=None, num_workers=2)
    elif kind == "stalled-pipe":
        # Threads blocked in a pipe that will not speak for 30 s must still stop now.
        dl = chute.DataLoader(stalled(), batch_size=None, num_workers=2, timeout=0.3)
    else:
        dl = chute.DataLoader(chute.H5Dataset(h5_file, {"x": "x"}), batch_size=8, num_workers=2)
    it = iter(dl)
    if kind == "stalled-pipe":
        with pytest.raises(TimeoutError):
            next(it)
    else:
        next(it)
    assert tasks() > baseline[0] or kind == "stalled-pipe"

    def drop() -> None:
        nonlocal it, dl
        del it, dl
        gc.collect()

    assert timed(drop) < PROMPT_S
    assert settle(*baseline) == baseline


def test_exception_in_user_map(baseline, tiny_shards) -> None:
    calls = 0

    def boom(sample: tuple[Any, Any]) -> tuple[Any, Any]:
        nonlocal calls
        calls += 1
        if calls == 37:
            raise ZeroDivisionError("user code failed on sample 37")
        return sample

    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls").map(boom)
    got = 0
    with pytest.raises(ZeroDivisionError, match="sample 37"):
        for _ in chute.DataLoader(ds, batch_size=4, num_workers=2):
            got += 1
    assert got == 9  # 36 good samples = 9 batches of 4, then the error
    assert settle(*baseline) == baseline


def test_error_on_native_thread_stops_everything(baseline, tiny_shards, tmp_path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(Path(tiny_shards[0]).read_bytes()[:5000])
    urls = [tiny_shards[1], str(bad), tiny_shards[2]]
    with pytest.raises(chute.DataError, match="bad.tar"):
        list(chute.DataLoader(stream(urls), batch_size=None, num_workers=2))
    assert settle(*baseline) == baseline


# ---------------------------------------------------------------- waiting


def _interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_keyboard_interrupt_while_waiting(baseline) -> None:
    dl = chute.DataLoader(stalled(), batch_size=None, num_workers=2)
    assert threading.current_thread() is threading.main_thread()
    timer = _interrupt_after(0.5)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in dl:
                pass
    finally:
        timer.cancel()
    assert time.monotonic() - start < 0.5 + PROMPT_S
    assert settle(*baseline) == baseline


def big_batches(count: int) -> list[np.ndarray]:
    """Index batches of a million rows each: the engine, not Python, is slow."""
    return [np.arange(1_000_000) % 20000] * count


def test_keyboard_interrupt_while_waiting_indexed(baseline, h5_file) -> None:
    ds = chute.H5Dataset(h5_file, {"x": "x"})
    dl = chute.DataLoader(ds, batch_sampler=big_batches(200), num_workers=1, prefetch_factor=1)
    timer = _interrupt_after(0.3)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in dl:
                pass
    finally:
        timer.cancel()
    assert time.monotonic() - start < 0.3 + PROMPT_S
    assert settle(baseline[0], fds())[0] == baseline[0]
    del dl, ds  # the dataset keeps its file open while it lives
    assert settle(*baseline) == baseline


@pytest.mark.parametrize("kind", ["stream", "h5"])
def test_timeout_expires(baseline, h5_file, kind: str) -> None:
    if kind == "stream":
        dl = chute.DataLoader(stalled(), batch_size=None, num_workers=2, timeout=0.5)
        low = 0.4
    else:
        dl = chute.DataLoader(
            chute.H5Dataset(h5_file, {"x": "x"}),
            batch_sampler=big_batches(4),
            num_workers=1,
            prefetch_factor=1,
            timeout=0.001,
        )
        low = 0.0
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        list(dl)
    elapsed = time.monotonic() - start
    assert low < elapsed < 0.5 + PROMPT_S
    assert settle(baseline[0], fds())[0] == baseline[0]
    del dl  # an H5Dataset keeps its file open while it lives
    assert settle(*baseline) == baseline


# ---------------------------------------------------------------- interpreter exit

EXIT_SCRIPT = """
import sys, time
sys.path.insert(0, {python!r})
import chute
kind = {kind!r}
if kind == "stream":
    ds = (chute.WebDataset({urls!r}, shardshuffle=False, repeat=True)
          .decode().to_tuple("npy", "cls").batched(8))
    it = iter(chute.DataLoader(ds, batch_size=None, num_workers=2))
    next(it)
elif kind == "stalled":
    ds = chute.WebDataset(["pipe:sleep 60"], shardshuffle=False).to_tuple("__key__")
    it = iter(chute.DataLoader(ds, batch_size=None, num_workers=2, timeout=0.2))
    try:
        next(it)
    except TimeoutError:
        pass
else:
    ds = chute.H5Dataset({h5!r}, {{"x": "x"}})
    it = iter(chute.DataLoader(ds, batch_size=8, num_workers=2))
    next(it)
print("started", flush=True)
"""


@pytest.mark.parametrize("kind", ["stream", "stalled", "h5"])
def test_interpreter_exit_with_live_iterator(tiny_shards, h5_file, kind: str) -> None:
    python_dir = str(Path(chute.__file__).parent.parent)
    script = textwrap.dedent(
        EXIT_SCRIPT.format(python=python_dir, kind=kind, urls=tiny_shards, h5=str(h5_file))
    )
    # The `sleep 60` child must not hold the exit: the timeout says so, and
    # leaves a busy machine room for starting Python and importing torch.
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=55
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "started"
    assert "Traceback" not in proc.stderr, proc.stderr


DAEMON_EXIT_SCRIPT = """
import sys, threading, time
sys.path.insert(0, {python!r})
import chute.wds as wds
first = threading.Event()
def consume():
    if {kind!r} == "jpeg":
        ds = wds.WebDataset({urls!r}, shardshuffle=False, repeat=True).decode("rgb")
        ds = ds.to_tuple("jpg", "cls")
    else:
        ds = wds.WebDataset(["pipe:sleep 100"], shardshuffle=False).to_tuple("__key__")
        first.set()  # it never yields: the thread waits in next() from now on
    for _ in ds:
        first.set()
threading.Thread(target=consume, daemon=True).start()
first.wait()
time.sleep(0.5)  # the thread is inside chute's next() when the interpreter exits
print("exiting", flush=True)
"""


@pytest.mark.parametrize("kind", ["jpeg", "stalled_pipe"])
def test_interpreter_exit_while_a_daemon_thread_waits_in_next(tmp_path, kind: str) -> None:
    # Python ends a daemon thread that takes the GIL back after finalizing
    # with pthread_exit: unwinding the native wait's frames aborted the
    # process ("terminate called without an active exception").
    from conftest import image_samples, write_shards

    urls = write_shards(tmp_path, image_samples(64, size=(96, 96)), per_shard=64)
    python_dir = str(Path(chute.__file__).parent.parent)
    script = textwrap.dedent(DAEMON_EXIT_SCRIPT.format(python=python_dir, kind=kind, urls=urls))
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in runs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        assert out.strip() == "exiting"
        assert "terminate called" not in err
        assert "Traceback" not in err, err


# ---------------------------------------------------------------- stress


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_many_loaders_concurrently_and_repeatedly(baseline, tiny_shards, h5_file) -> None:
    errors: list[BaseException] = []
    counts: list[int] = []

    def worker(seed: int, rounds: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for r in range(rounds):
                choice = int(rng.integers(0, 3))
                if choice == 0:
                    urls = list(rng.permutation(tiny_shards))
                    dl = chute.DataLoader(stream(urls), batch_size=None, num_workers=2)
                elif choice == 1:
                    ds = chute.H5Dataset(h5_file, {"x": "x"})
                    dl = chute.DataLoader(ds, batch_size=128, shuffle=True, num_workers=2)
                else:
                    ds = (
                        chute.WebDataset(tiny_shards, shardshuffle=True, seed=seed * 100 + r)
                        .shuffle(200)
                        .decode()
                        .to_tuple("npy", "cls")
                    )
                    dl = chute.DataLoader(ds, batch_size=32, num_workers=2)
                stop = int(rng.integers(1, 40)) if r % 2 else None
                n = 0
                for _ in dl:
                    n += 1
                    if stop is not None and n == stop:
                        break
                counts.append(n)
        except BaseException as exn:  # reported in the main thread
            errors.append(exn)

    def run_all(rounds: int) -> None:
        threads = [threading.Thread(target=worker, args=(s, rounds)) for s in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 240  # a deadlock detector, generous for busy machines
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "deadlock: loader threads did not finish"
        assert not errors, errors

    run_all(2)  # warm up: allocator arenas, torch pools, page cache
    rss_before = _rss_kib()
    run_all(6)
    assert len(counts) == 4 * 8
    assert all(c > 0 for c in counts)
    assert settle(*baseline) == baseline
    growth = _rss_kib() - rss_before
    if os.environ.get("CHUTE_SANITIZER"):
        return  # a sanitizer's quarantine keeps freed memory resident by design
    assert growth < 64 * 1024, f"RSS grew by {growth} KiB over 24 loader runs"


def test_skip_handler_under_stress_keeps_counting(baseline, tiny_shards, tmp_path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(Path(tiny_shards[0]).read_bytes()[:7000])
    urls = [tiny_shards[1], str(bad), tiny_shards[2], str(bad)]
    for _ in range(5):
        # The skip handler covers the cut shard and the sample it cut short.
        skip = wds.ignore_and_continue
        ds = (
            chute.WebDataset(urls, shardshuffle=False, handler=skip)
            .decode()
            .to_tuple("npy", "cls", handler=skip)
            .batched(16)
        )
        batches = list(chute.DataLoader(ds, batch_size=None, num_workers=2))
        assert sum(len(b[1]) for b in batches) >= 500
        assert ds.stats()["samples_skipped"] == 2
    assert settle(*baseline) == baseline


# ---------------------------------------------------------------- fork

FORK_SCRIPT = """
import gc, sys
sys.path.insert(0, {python!r})
import numpy as np, torch
import chute

stream = (chute.WebDataset({urls!r}, shardshuffle=False).decode().to_tuple("npy", "cls")
          .batched(16))
table = chute.ArrayDataset(x=np.arange(4000, dtype=np.float32))
iterators = [iter(stream), table.iter_batches(([i] * 16 for i in range(100)), 2, 2)]
for it in iterators:
    next(it)
# Mid-epoch iterators, their engines' threads running, reachable only
# through a cycle: garbage that a forked worker's collector finds.
class Cycle:
    pass
holder = Cycle()
holder.self = holder
holder.iterators = iterators
inherited = iterators[0]
del iterators, holder
gc.disable()

class Collecting(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        gc.collect()
        if i == 0:
            try:
                next(inherited)
            except ValueError as e:
                return str(e) + " | where: " + str(getattr(e, "where", None))
        return ""

loader = torch.utils.data.DataLoader(
    Collecting(), batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60
)
print(repr(list(loader)))
"""


def test_forked_workers_inherit_engines_safely(tiny_shards) -> None:
    # torch's DataLoader forks its workers from a process that may hold chute
    # iterators: a worker that collects one, or uses it, must not crash.
    python_dir = str(Path(chute.__file__).parent.parent)
    script = textwrap.dedent(FORK_SCRIPT.format(python=python_dir, urls=tiny_shards))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    messages = eval(proc.stdout.strip().splitlines()[-1])
    assert "through fork(), without its threads: iterate the dataset anew here" in messages[0]
    assert re.search(r" \| where: process_owned\.h:\d+\Z", messages[0]), messages[0]
    assert messages[1:] == ["", "", ""]
