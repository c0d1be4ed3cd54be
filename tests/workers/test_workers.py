"""Python stages on worker processes (chute.workers): every guarantee of a
loader without workers holds with them. The batches and their order equal
those of num_workers=0; a position taken with workers resumes without them
and the other way round; DDP ranks agree on batch counts; a worker's
exception reaches the loader as itself, naming the worker; warnings are
issued in the loader; results in flight are bounded; the workers end on
break, del, an exception and Ctrl-C; a worker killed with SIGKILL is a
RuntimeError naming it, and leaves no shared memory behind."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
from chute import wds
from chute.common.errors import MemberDecodeError
from conftest import image_samples, write_shards

# This folder (the test modules a fresh interpreter imports); its parent holds conftest.
HERE = Path(__file__).parent

# -------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Images (jpg, a png every 9th), labels and a json member Python decodes."""
    samples = image_samples(150, seed=4, png_every=9)
    for i, s in enumerate(samples):
        s["json"] = json.dumps({"i": i, "tag": f"t{i % 5}"}).encode()
    return write_shards(tmp_path_factory.mktemp("images"), samples, per_shard=40)


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Sample 50 of 100 has a JPEG cut short."""
    samples = image_samples(100, seed=5)
    samples[50]["jpg"] = bytes(samples[50]["jpg"])[:200]  # type: ignore[index]
    return write_shards(tmp_path_factory.mktemp("broken"), samples, per_shard=25)


# Functions the workers run: defined at module level, so that they pickle.


def normalise(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    image, cls = sample
    return image.float().div(255.0).sub(0.5), cls * 3


def normalise_batch(batch: tuple[torch.Tensor, Any]) -> tuple[torch.Tensor, Any]:
    images, classes = batch
    return images.float().mean(dim=(1, 2, 3)), classes


def float_batch(batch: tuple[torch.Tensor, Any]) -> tuple[torch.Tensor, Any]:
    images, classes = batch
    return images.float().div(255.0), classes


def describe(sample: dict[str, Any]) -> dict[str, Any]:
    image = sample["jpg"] if "jpg" in sample else sample["png"]
    return {"key": sample["__key__"], "pixels": image.sum(), "meta": sample["json"]}


def drop_odd(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int] | None:
    return None if sample[1] % 2 else (sample[0][:, :4, :4], sample[1])


def under_eight(sample: tuple[Any, int]) -> bool:
    return sample[1] < 8


def with_threads(sample: tuple[Any, int]) -> tuple[int, int, int]:
    return sample[1], torch.get_num_threads(), os.getpid()


def fail_at_key(key: str, sample: tuple[str, int]) -> tuple[str, int]:
    if sample[0] == key:
        raise KeyError(f"no rule for {key}")  # a class torch's wrapper special-cases
    return sample


def sleep_at_key(key: str, sample: tuple[str, int]) -> tuple[str, int]:
    if sample[0] == key:
        time.sleep(600)
    return sample


def count_calls(path: str, sample: Any) -> Any:
    with open(path, "a") as f:
        f.write(".")
    return sample


def mark_worker(directory: str, worker_id: int) -> None:
    Path(directory, f"w{worker_id}-{os.getpid()}").touch()


def collate_sum(rows: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    return {"n": len(rows), "x": sum(r["x"] for r in rows), "pid": os.getpid()}


# -------------------------------------------------------------------- helpers


def assert_same(a: Any, b: Any, where: str = "item") -> None:
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, where


def epoch(loader: Any, number: int = 3) -> list[Any]:
    loader.set_epoch(number)
    return list(loader)


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (and is not a zombie of ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids: list[int], limit: float = 60.0) -> bool:
    deadline = time.monotonic() + limit  # a hang guard, not a measure
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


# -------------------------------------------------------------------- the thread rule


def test_a_python_stage_runs_with_one_intraop_thread(images: list[str]) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        ds = chute.WebDataset(images, shardshuffle=False).to_tuple("__key__", "cls")
        seen = []
        for _key, threads, pid in ds.map(with_threads):
            assert torch.get_num_threads() == 3  # the loop body has its own
            seen.append(threads)
            assert pid == os.getpid()
        assert seen and set(seen) == {1}
        # A failure inside the stage restores the caller's value too.
        it = iter(ds.map(functools.partial(fail_at_key, "img000003")))
        with pytest.raises(KeyError):
            for _ in it:
                pass
        assert torch.get_num_threads() == 3
        # Workers run the stage with one thread too.
        loader = chute.DataLoader(ds.map(with_threads), batch_size=None, num_workers=2)
        rows = list(loader)
        assert torch.get_num_threads() == 3
        assert {t for _, t, _ in rows} == {1}
        assert os.getpid() not in {p for _, _, p in rows}
        assert len({p for _, _, p in rows}) == 2
    finally:
        torch.set_num_threads(previous)


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mapped_by_a_large_malloc() -> int:
    """Bytes glibc maps apart from its heap for one 24 MiB block."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(24 << 20)
    after = libc.mallinfo2().hblkhd
    libc.free(ctypes.c_void_p(block))
    return int(after - before)


def with_malloc_probe(sample: tuple[Any, int]) -> tuple[Any, int, int]:
    return sample[0], sample[1], mapped_by_a_large_malloc()


def test_workers_keep_freed_memory_for_the_next_items(images: list[str]) -> None:
    """A worker serves large blocks from its heap and keeps what they free
    (glibc's defaults map each anew, so its pages fault again)."""
    if os.environ.get("CHUTE_SANITIZER"):
        pytest.skip("a sanitizer's allocator stands in for glibc's malloc")
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    # A new process that imports what a worker imports maps such a block.
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import test_workers; print(test_workers.mapped_by_a_large_malloc())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path])),
    )
    assert int(fresh.stdout) >= 24 << 20, fresh.stderr
    ds = chute.WebDataset(images, shardshuffle=False).to_tuple("__key__", "cls")
    # spawn: the workers start from a new interpreter, not from this process's heap.
    loader = chute.DataLoader(
        ds.map(with_malloc_probe), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    assert {mapped for _, _, mapped in loader} == {0}


def test_the_thread_rule_covers_a_collate_fn_of_a_map_style_dataset() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []

        def collate(rows: list[dict[str, torch.Tensor]]) -> int:
            seen.append(torch.get_num_threads())
            return len(rows)

        ds = chute.ArrayDataset(x=np.arange(10))
        assert list(chute.DataLoader(ds, batch_size=4, collate_fn=collate)) == [4, 4, 2]
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


# -------------------------------------------------------------------- order


def _tuple(urls: list[str]) -> Any:
    return chute.WebDataset(urls, shardshuffle=False).decode("torchrgb8").to_tuple("jpg;png", "cls")


PIPELINES = {
    "tuple": (lambda u: _tuple(u).map(normalise), {"batch_size": 16}),
    "shuffled": (
        lambda u: (
            chute.WebDataset(u, shardshuffle=True, seed=7)
            .shuffle(40)
            .decode("torchrgb8")
            .to_tuple("jpg;png", "cls")
            .map(normalise)
        ),
        {"batch_size": 10, "drop_last": True},
    ),
    "dict": (
        lambda u: chute.WebDataset(u, shardshuffle=False).decode("torchrgb8").map(describe),
        {"batch_size": 8},
    ),
    "batched_then_map": (
        lambda u: _tuple(u).batched(12).map(normalise_batch),
        {"batch_size": None},
    ),
    "drops": (
        lambda u: _tuple(u).map(drop_odd).select(under_eight),
        {"batch_size": 7},
    ),
    "python_decode": (
        lambda u: chute.WebDataset(u, shardshuffle=False).decode().to_tuple("__key__", "json"),
        {"batch_size": 9},
    ),
    "stateful_after": (
        lambda u: _tuple(u).map(normalise).shuffle(20, seed=3).batched(6),
        {"batch_size": None},
    ),
    "two_passes": (
        lambda u: _tuple(u).map(normalise).repeat(2),
        {"batch_size": 32},
    ),
    "streams": (
        lambda u: (
            chute.WebDataset(u, shardshuffle=False, streams=2)
            .decode("torchrgb8")
            .to_tuple("jpg;png", "cls")
            .map(normalise)
        ),
        {"batch_size": None},
    ),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_workers_yield_the_single_process_batches(images: list[str], name: str) -> None:
    build, kwargs = PIPELINES[name]
    expected = epoch(chute.DataLoader(build(images), num_workers=0, **kwargs))
    got = epoch(chute.DataLoader(build(images), num_workers=2, **kwargs))
    assert len(expected) > 3
    assert_same(got, expected)


def test_persistent_workers_reach_the_next_epoch(images: list[str]) -> None:
    ds = _tuple(images).map(normalise).map(lambda_free_pid)
    loader = chute.DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)
    single = chute.DataLoader(ds, batch_size=16, num_workers=0)
    pids = []
    for number in (1, 2):
        got = epoch(loader, number)
        expected = epoch(single, number)
        assert_same([b[:2] for b in got], [b[:2] for b in expected])
        pids.append({int(p) for b in got for p in b[2]})
    assert pids[0] == pids[1] and len(pids[0]) == 2 and os.getpid() not in pids[0]
    # Each epoch shuffles anew: set_epoch reaches the workers.
    shuffled = (
        chute.WebDataset(images, shardshuffle=True, seed=2)
        .to_tuple("__key__", "cls")
        .map(lambda_free_pid)
    )
    loader = chute.DataLoader(shuffled, batch_size=None, num_workers=2, persistent_workers=True)
    single = chute.DataLoader(shuffled, batch_size=None)
    orders = []
    for number in (0, 1):
        got = [r[:2] for r in epoch(loader, number)]
        assert got == [r[:2] for r in epoch(single, number)]
        orders.append(got)
    assert orders[0] != orders[1]
    loader.close_workers()


def lambda_free_pid(sample: tuple[Any, int]) -> tuple[Any, int, int]:
    return sample[0], sample[1], os.getpid()


def test_tar_dataset_with_python_decoded_fields(images: list[str]) -> None:
    ds = chute.TarDataset(images, decode="torchrgb8", fields=("jpg;png", "cls", "json"))
    kwargs = {"batch_size": 7, "shuffle": True}
    expected = list(
        chute.DataLoader(ds, generator=torch.Generator().manual_seed(5), num_workers=0, **kwargs)
    )
    got = list(
        chute.DataLoader(ds, generator=torch.Generator().manual_seed(5), num_workers=2, **kwargs)
    )
    assert_same(got, expected)


def test_a_collate_fn_of_a_map_style_dataset_runs_in_the_workers() -> None:
    ds = chute.ArrayDataset(x=np.arange(40, dtype=np.int64))
    got = list(chute.DataLoader(ds, batch_size=6, num_workers=2, collate_fn=collate_sum))
    assert [(b["n"], int(b["x"])) for b in got] == [
        (len(c), sum(c)) for c in (list(range(i, min(i + 6, 40))) for i in range(0, 40, 6))
    ]
    assert len({b["pid"] for b in got}) == 2 and os.getpid() not in {b["pid"] for b in got}


def test_webloader_and_data_pipeline_run_on_workers(images: list[str]) -> None:
    ds = _tuple(images).map(normalise)
    expected = list(wds.WebLoader(ds, batch_size=None, num_workers=0).batched(5))
    got = list(wds.WebLoader(ds, batch_size=None, num_workers=2).batched(5))
    assert_same(got, expected)
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(images),
        wds.tarfile_to_samples(),
        wds.decode("torchrgb8"),
        wds.to_tuple("jpg;png", "cls"),
        wds.map(normalise),
    )
    assert_same(
        list(chute.DataLoader(pipeline, batch_size=10, num_workers=2)),
        list(chute.DataLoader(pipeline, batch_size=10, num_workers=0)),
    )


def test_worker_init_fn_runs_in_each_worker_without_a_warning(
    images: list[str], tmp_path: Path
) -> None:
    ds = _tuple(images).map(normalise)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = chute.DataLoader(
            ds,
            batch_size=16,
            num_workers=2,
            worker_init_fn=functools.partial(mark_worker, str(tmp_path)),
        )
        assert len(list(loader)) == 10
    marks = sorted(p.name.split("-") for p in tmp_path.iterdir())
    assert [m[0] for m in marks] == ["w0", "w1"]
    assert all(int(m[1]) != os.getpid() for m in marks)


def test_a_dataset_that_does_not_pickle_runs_in_this_process(images: list[str]) -> None:
    ds = _tuple(images).map(lambda s: (s[0][:, 0, 0], s[1]))
    expected = list(chute.DataLoader(ds, batch_size=8))
    loader = chute.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    with pytest.warns(chute.WorkerFallbackWarning, match="cannot be sent to worker processes"):
        got = list(loader)
    assert_same(got, expected)
    assert loader._pool is None


_FORK_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import chute
from chute.workers.pool import native_threads_running, resolve_context

def main():
    ds = chute.WebDataset({urls!r}, shardshuffle=False).to_tuple("__key__", "cls")
    assert not native_threads_running()
    assert resolve_context(None).get_start_method() == "fork"
    # Forked workers inherit what does not pickle (a lambda).
    rows = list(chute.DataLoader(ds.map(lambda s: (s[0], os.getpid())), batch_size=None,
                                 num_workers=2))
    assert [r[0] for r in rows] == [k for k, _ in ds]
    assert len({{r[1] for r in rows}}) == 2 and os.getpid() not in {{r[1] for r in rows}}
    # While an engine's threads run here, workers start from the forkserver.
    # The running engine reads more samples than its queues hold, so its
    # threads still wait on them after next() (a small dataset's engine may
    # finish and end its threads before the check).
    running = iter(chute.WebDataset({urls!r} * 200, shardshuffle=False).to_tuple("__key__"))
    next(running)
    assert native_threads_running()
    assert resolve_context(None).get_start_method() == "forkserver"
    mapped = ds.map(normalise_key)
    got = [tuple(r) for r in chute.DataLoader(mapped, batch_size=None, num_workers=2)]
    assert got == list(mapped)
    del running
    assert not native_threads_running()
    print("ok")

def normalise_key(s):
    return s[0].upper(), s[1]

if __name__ == "__main__":
    main()
"""


def test_workers_fork_unless_an_engine_runs_in_this_process(
    images: list[str], tmp_path: Path
) -> None:
    script = tmp_path / "fork_check.py"
    script.write_text(_FORK_SCRIPT.format(tests=str(HERE), urls=images))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


_REMOTE_THEN_WORKERS = """
import sys
import warnings
import chute

def main():
    ds = chute.WebDataset([{remote!r}], shardshuffle=False).to_tuple("__key__", "cls")
    assert len(list(ds)) == 40
    mapped = ds.map(normalise_key)
    got = [tuple(r) for r in chute.DataLoader(mapped, batch_size=None, num_workers=2)]
    assert got == list(mapped)
    # Workers over local shards still start by fork, as torch's: a function
    # only fork can hand over (a lambda) runs in them, with no fallback
    # warning (warnings are errors here).
    warnings.simplefilter("error")
    local = chute.WebDataset([{local!r}], shardshuffle=False).to_tuple("__key__", "cls")
    lowered = local.map(lambda s: (s[0].lower(), s[1]))
    got = [tuple(r) for r in chute.DataLoader(lowered, batch_size=None, num_workers=2)]
    assert got == list(lowered) and len(got) == 40
    print("ok")

def normalise_key(s):
    return s[0].upper(), s[1]

if __name__ == "__main__":
    main()
"""


def test_workers_start_by_themselves_after_a_remote_read(
    images: list[str], tmp_path: Path, object_server: Any
) -> None:
    # The remote client's runtime cannot run in a child forked after it
    # ran: the workers used to fork, and fail with RemoteForkError when
    # they read a remote shard.
    object_server.objects["/data/shard.tar"] = Path(images[0]).read_bytes()
    script = tmp_path / "remote_then_workers.py"
    script.write_text(
        _REMOTE_THEN_WORKERS.format(remote=f"{object_server.url}/data/shard.tar", local=images[0])
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_stats_add_up_over_the_workers(images: list[str]) -> None:
    ds = _tuple(images).map(normalise)
    expected = epoch(chute.DataLoader(ds, batch_size=16))
    theirs = ds.stats()
    got = epoch(chute.DataLoader(ds, batch_size=16, num_workers=2))
    ours = ds.stats()
    assert_same(got, expected)
    figures = {
        "samples_read": 150,
        "samples_yielded": 150,
        "batches": 3,  # engine batches of 64 rows
        "python_items": 150,
        "shards_opened": 4,
    }
    for key, value in figures.items():
        assert ours[key] == theirs[key] == value, key


# -------------------------------------------------------------------- resume and DDP


def test_a_position_taken_with_workers_resumes_with_or_without_them(images: list[str]) -> None:
    build, kwargs = PIPELINES["shuffled"]
    ds = build(images)
    expected = epoch(chute.DataLoader(ds, num_workers=0, **kwargs))
    loader = chute.DataLoader(ds, num_workers=2, **kwargs)
    loader.set_epoch(3)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    state = loader.state_dict()
    del it
    for workers in (0, 2):
        again = chute.DataLoader(ds, num_workers=workers, **kwargs)
        again.load_state_dict(state)
        assert_same(head + list(again), expected)
    # And a position taken without workers resumes with them.
    loader = chute.DataLoader(ds, num_workers=0, **kwargs)
    loader.set_epoch(3)
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()
    del it
    again = chute.DataLoader(ds, num_workers=2, **kwargs)
    again.load_state_dict(state)
    assert_same(head + list(again), expected)


def test_a_tar_dataset_position_resumes_on_workers(images: list[str]) -> None:
    ds = chute.TarDataset(images, decode="torchrgb8", fields=("jpg;png", "cls", "json"))

    def loader(workers: int) -> chute.DataLoader[Any]:
        g = torch.Generator().manual_seed(11)
        return chute.DataLoader(ds, batch_size=8, shuffle=True, generator=g, num_workers=workers)

    expected = list(loader(0))
    first = loader(2)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    again = loader(2)
    again.load_state_dict(state)
    assert_same(head + list(again), expected)


def test_ddp_ranks_yield_equal_batch_counts_on_workers(
    images: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 shards of 40, 40, 40, 30 samples: rank 0 gets 80, rank 1 70.
    monkeypatch.setenv("WORLD_SIZE", "2")
    counts = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        ds = (
            chute.WebDataset(images, shardshuffle=False, nodesplitter=wds.split_by_node)
            .decode()
            .to_tuple("__key__", "json")
            .batched(6)
        )
        expected = list(chute.DataLoader(ds, batch_size=None))
        got = list(chute.DataLoader(ds, batch_size=None, num_workers=2))
        assert_same(got, expected)
        counts[rank] = len(got)
    assert counts == {0: 12, 1: 12}  # ceil(70 / 6): every rank stops at the shorter one's


def upper_keys(batch: tuple[list[str], Any]) -> tuple[list[str], Any]:
    return [k.upper() for k in batch[0]], batch[1]


def test_an_elastic_resume_on_workers_equals_one_without(
    images: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def make(workers: int) -> chute.DataLoader[Any]:
        ds = chute.WebDataset(images, shardshuffle=True, seed=5, elastic=True).shuffle(10)
        # Elastic streams are batched by the engine, before Python stages.
        ds = ds.to_tuple("__key__", "cls").batched(4).map(upper_keys)
        loader = chute.DataLoader(ds, batch_size=None, num_workers=workers)
        loader.set_epoch(2)
        return loader

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    states = []
    for workers in (0, 2):
        loader = make(workers)
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        states.append(loader.state_dict())
        del it
    assert states[0] == states[1]
    # Three ranks resume it, with and without workers alike.
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        rest = []
        for workers in (0, 2):
            loader = make(workers)
            loader.load_state_dict(states[0])
            rest.append(list(loader))
        assert len(rest[0]) > 3
        assert_same(rest[1], rest[0])
    assert head


# -------------------------------------------------------------------- errors


def test_an_exception_in_a_worker_reaches_the_loader_as_itself(images: list[str]) -> None:
    ds = chute.WebDataset(images, shardshuffle=False).to_tuple("__key__", "cls")
    failing = ds.map(functools.partial(fail_at_key, "img000070"))
    loader = chute.DataLoader(failing, batch_size=None, num_workers=2)
    got = []
    with pytest.raises(KeyError) as info:
        for item in loader:
            got.append(item)
    assert got == [list(s) for s in list(ds)[:70]]  # everything before it, in order
    assert info.value.args == ("no rule for img000070",)
    notes = "\n".join(info.value.__notes__)
    assert "chute DataLoader worker 1 (pid " in notes  # engine batch 1 (rows 64..127)
    assert "in fail_at_key" in notes and 'raise KeyError(f"no rule for {key}")' in notes
    assert f"at shard {images[1]}, sample key 'img000070'" in notes
    assert loader._pool is None  # the workers were ended


def failing_init(worker: int) -> None:
    raise ValueError(f"no device for worker {worker}")


@pytest.mark.parametrize("workers_gone_first", [False, True])
def test_a_worker_init_fn_error_reaches_the_loader_as_itself(
    images: list[str], monkeypatch: pytest.MonkeyPatch, workers_gone_first: bool
) -> None:
    """Also when the first task is sent after the workers that could not
    start reported why and exited: it meets a closed socket, and the loader
    raises the reported error, not 'exited unexpectedly'."""
    if workers_gone_first:
        from chute.workers.pool import WorkerPool

        new_task = WorkerPool.new_task

        def after_the_workers_exited(self: WorkerPool, *args: Any) -> int:
            for process in self.processes:
                process.join(60)
                assert process.exitcode == 0
            return new_task(self, *args)

        monkeypatch.setattr(WorkerPool, "new_task", after_the_workers_exited)
    ds = chute.WebDataset(images, shardshuffle=False).to_tuple("__key__", "cls").map(str)
    loader = chute.DataLoader(ds, batch_size=None, num_workers=2, worker_init_fn=failing_init)
    with pytest.raises(ValueError, match=r"no device for worker \d") as info:
        next(iter(loader))
    assert re.search(
        r"chute DataLoader worker \d \(pid \d+\) while starting", "\n".join(info.value.__notes__)
    )
    assert loader._pool is None  # the workers were ended


def lock_at_key(key: str, sample: tuple[str, int]) -> Any:
    import threading

    return threading.Lock() if sample[0] == key else sample


def test_a_tar_dataset_member_error_in_a_worker_keeps_its_scope_and_place(
    broken: list[str],
) -> None:
    ds = chute.TarDataset(broken, decode="rgb8", fields=("jpg", "cls"))
    # A collate_fn of its own puts the engine in the workers.
    loader = chute.DataLoader(
        ds, batch_size=10, num_workers=2, collate_fn=torch.utils.data.default_collate
    )
    with pytest.raises(MemberDecodeError) as info:
        for _ in loader:
            pass
    error = info.value
    assert re.search(r"raised in chute DataLoader worker \d \(pid \d+\)", error.__notes__[0])
    assert error.failure_scope == "member" and error.url == broken[2]
    assert (error.member, error.sample_key, error.k) == ("img000050.jpg", "img000050", "jpg")


def test_a_result_that_does_not_pickle_raises_its_error_in_the_loader(images: list[str]) -> None:
    # It used to end the worker ("exited unexpectedly with code 1"), its
    # TypeError only on the worker's stderr.
    ds = chute.WebDataset(images, shardshuffle=False).to_tuple("__key__", "cls")
    loader = chute.DataLoader(
        ds.map(functools.partial(lock_at_key, "img000045")), batch_size=None, num_workers=2
    )
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object") as info:
        for _ in loader:
            pass
    notes = "\n".join(info.value.__notes__)
    assert re.search(r"chute DataLoader worker 0 \(pid \d+\) sending its result", notes)
    assert f"(the item of shard {images[1]}, sample key 'img000045')" in notes
    assert loader._pool is None


def test_a_data_error_in_a_worker_keeps_its_class_and_message(broken: list[str]) -> None:
    ds = _tuple(broken).map(normalise)
    before: dict[int, list[Any]] = {0: [], 2: []}
    with pytest.raises(MemberDecodeError) as single:
        for batch in chute.DataLoader(ds, batch_size=10):
            before[0].append(batch)
    with pytest.raises(MemberDecodeError) as workers:
        for batch in chute.DataLoader(ds, batch_size=10, num_workers=2):
            before[2].append(batch)
    assert str(workers.value) == str(single.value)
    assert "img000050.jpg" in str(workers.value)
    assert workers.value.key == single.value.key == "img000050"
    # What it is about and where, as data, survive the process boundary.
    for error in (single.value, workers.value):
        assert error.failure_scope == "member" and error.url == broken[2]
        assert (error.member, error.sample_key) == ("img000050.jpg", "img000050")
    # The samples before the bad one arrive first, as without workers.
    assert len(before[0]) == 5
    assert_same(before[2], before[0])
    assert re.search(
        r"raised in chute DataLoader worker \d \(pid \d+\)", workers.value.__notes__[0]
    )


def test_warnings_of_a_worker_are_issued_in_the_loader(broken: list[str]) -> None:
    ds = (
        chute.WebDataset(broken, shardshuffle=False, handler=wds.warn_and_continue)
        .decode("torchrgb8")
        .to_tuple("jpg", "cls")
        .map(normalise)
    )
    with pytest.warns(chute.SkippedSampleWarning, match="img000050") as single:
        expected = list(chute.DataLoader(ds, batch_size=10))
    with pytest.warns(chute.SkippedSampleWarning, match="img000050") as workers:
        got = list(chute.DataLoader(ds, batch_size=10, num_workers=2))
    assert_same(got, expected)
    assert sum(len(b[1]) for b in got) == 99
    assert [str(w.message) for w in workers] == [str(w.message) for w in single]


def test_timeout_bounds_the_wait_for_a_worker(images: list[str]) -> None:
    ds = chute.WebDataset(images, shardshuffle=False).to_tuple("__key__", "cls")
    loader = chute.DataLoader(
        ds.map(functools.partial(sleep_at_key, "img000001")),
        batch_size=None,
        num_workers=2,
        timeout=1.0,
    )
    with pytest.raises(TimeoutError, match="worker 0 sent no batch within 1.0 s"):
        list(loader)


# -------------------------------------------------------------------- memory and shutdown


def test_results_in_flight_are_bounded(tiny_shards: list[str], tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    calls.touch()
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).to_tuple("npy", "cls")
    loader = chute.DataLoader(
        ds.map(functools.partial(count_calls, str(calls))),
        batch_size=None,
        num_workers=2,
        prefetch_factor=2,
    )
    it = iter(loader)
    next(it)
    # Engine batches of 64 rows: the one taken, and per worker the two in
    # flight plus the one waiting for a credit.
    bound = (1 + 2 * 3) * 64
    deadline = time.monotonic() + 5  # time for unbounded workers to run past it
    while time.monotonic() < deadline and len(calls.read_text()) <= bound:
        time.sleep(0.1)
    assert len(calls.read_text()) <= bound < 1000
    del it


def _mapped_arenas() -> set[int]:
    """The inodes of the worker arenas this process maps now."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {int(line.split()[4]) for line in maps if "memfd:chute-batch" in line}


def test_workers_reuse_arenas_the_loader_no_longer_views(images: list[str]) -> None:
    # A message (and an arena) per batch of 4.
    ds = _tuple(images).batched(4).map(float_batch)
    expected = list(chute.DataLoader(ds, batch_size=None, num_workers=0))
    seen: set[int] = set()
    kept: list[tuple[int, Any]] = []
    count = 0
    for i, batch in enumerate(chute.DataLoader(ds, batch_size=None, num_workers=2)):
        seen |= _mapped_arenas()
        assert_same(batch, expected[i], f"batch {i}")
        if i % 5 == 0:
            kept.append((i, batch))  # viewed to the end: never written again
        count += 1
        del batch  # released at once: no garbage collection needed
    assert count == len(expected) > 30
    for i, batch in kept:
        assert_same(batch, expected[i], f"kept batch {i}")
    # Arenas dropped by the loader were written again: far fewer arenas
    # than batches (each worker keeps its in-flight ones, the kept ones and
    # a few released ones).
    assert len(seen) < count - len(kept)


def _worker_pids(loader: Any) -> list[int]:
    assert loader._pool is not None
    return [p.pid for p in loader._pool.processes]


def test_workers_end_on_break_del_and_exceptions(images: list[str]) -> None:
    ds = _tuple(images).map(normalise)
    loader = chute.DataLoader(ds, batch_size=4, num_workers=2)
    for _ in loader:
        pids = _worker_pids(loader)
        break
    assert wait_gone(pids)
    persistent = chute.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    assert len(list(persistent)) == 38
    pids = _worker_pids(persistent)
    assert not any(gone(p) for p in pids)
    del persistent
    assert wait_gone(pids)
    loader = chute.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.raises(ZeroDivisionError):
        for _ in loader:
            pids = _worker_pids(loader)
            _ = 1 / 0
    del loader
    assert wait_gone(pids)


_SCRIPT_HEAD = """
import os, signal, sys, time
sys.path[:0] = {tests!r}
import chute, torch
from test_workers import normalise
ds = (chute.WebDataset({urls!r}, shardshuffle=False, repeat=True)
      .decode("torchrgb8").to_tuple("jpg;png", "cls").map(normalise))
loader = chute.DataLoader(ds, batch_size=4, num_workers=2)
it = iter(loader)
next(it)
pids = [p.pid for p in loader._pool.processes]
print("pids", *pids, flush=True)
"""


def _run_script(body: str, urls: list[str]) -> subprocess.Popen[str]:
    source = _SCRIPT_HEAD.format(tests=[str(HERE), str(HERE.parent)], urls=urls) + body
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _shm_of(pids: list[int]) -> list[str]:
    """Entries of /dev/shm that name one of `pids` (torch names its
    segments after the creating process)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return [n for n in names if any(f"_{p}_" in n or n.endswith(f"_{p}") for p in pids)]


def test_a_worker_killed_with_sigkill_is_an_error_naming_it(images: list[str]) -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc = _run_script(
        """
os.kill(pids[1], signal.SIGKILL)
try:
    for _ in it:
        pass
except RuntimeError as e:
    print("error", e, flush=True)
""",
        images,
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    pids = [int(p) for p in out.split("\n")[0].split()[1:]]
    assert (
        f"error chute DataLoader worker 1 (pid {pids[1]}) was killed by signal 9 (SIGKILL)" in out
    )
    assert "leaked" not in err and "Traceback" not in err, err
    assert wait_gone(pids)
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not _shm_of([proc.pid, *pids])
    assert not [n for n in after - before if "chute" in n]


def test_ctrl_c_in_the_loader_ends_it_and_its_workers(images: list[str]) -> None:
    proc = _run_script(
        """
print("ready", flush=True)
for _ in it:
    pass
""",
        images,
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()[1:]]
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert "leaked" not in err
    assert wait_gone(pids)
