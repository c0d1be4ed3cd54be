"""``WebDataset(even_batches=...)`` over DDP ranks simulated in-process
(RANK/WORLD_SIZE with ``split_by_node``): the exact multiset of sample ids
each rank and all ranks deliver per epoch, as docs/epochs.md states it.

The data are the issue's (issue 30): ten tar shards of 100 samples whose
``cls`` is the sample's id, batched by 32; 2 ranks read 500 samples each,
3 ranks 400/300/300."""

from __future__ import annotations

import collections
import copy
import functools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pytest
import torch
import webdataset

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

SHARDS, PER_SHARD, BATCH = 10, 100, 32


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("even")
    out = []
    for shard in range(SHARDS):
        path = root / f"shard-{shard:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                sink.write({"__key__": f"s{i:05d}", "npy": np.full(4, i, np.float32), "cls": i})
        out.append(str(path))
    return out


def rank_ids(urls: list[str], rank: int, world: int) -> set[int]:
    """The ids of rank `rank`'s shards (split_by_node)."""
    shards = range(SHARDS)[rank::world]
    return {i for s in shards for i in range(s * PER_SHARD, (s + 1) * PER_SHARD)}


def make(
    urls: list[str],
    mode: str,
    buffer: int,
    partial: bool = True,
    *,
    tail: Callable[[Any], Any] | None = None,
    **kw: Any,
) -> Any:
    ds = wds.WebDataset(
        urls, shardshuffle=100, seed=0, nodesplitter=wds.split_by_node, even_batches=mode, **kw
    )
    if buffer:
        ds = ds.shuffle(buffer)
    ds = ds.decode().to_tuple("npy", "cls")
    return tail(ds) if tail is not None else ds.batched(BATCH, partial=partial)


def ids_of(batches: Iterator[Any]) -> list[list[int]]:
    return [[int(c) for c in cls] for _, cls in batches]


def each_rank(monkeypatch: pytest.MonkeyPatch, world: int, run: Callable[[int], Any]) -> list[Any]:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    out = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        out.append(run(rank))
    return out


def epoch(
    monkeypatch: pytest.MonkeyPatch, world: int, build: Callable[[], Any], threads: int, e: int
) -> list[tuple[list[list[int]], dict[str, Any]]]:
    """Each rank's batches (as ids) and stats in epoch `e`."""

    def run(rank: int) -> tuple[list[list[int]], dict[str, Any]]:
        loader = chute.DataLoader(build(), batch_size=None, num_workers=threads)
        loader.set_epoch(e)
        return ids_of(iter(loader)), loader.stats()

    return each_rank(monkeypatch, world, run)


def pass_sizes(samples: int, partial: bool) -> list[int]:
    """The batch sizes one pass over `samples` samples forms."""
    sizes = [BATCH] * (samples // BATCH)
    if partial and samples % BATCH:
        sizes.append(samples % BATCH)
    return sizes


def expected_sizes(samples: int, target: int, partial: bool, repeat: bool) -> list[int]:
    """A rank's batch sizes: its passes (one unless `repeat`) cut at `target` batches."""
    sizes = pass_sizes(samples, partial)
    while repeat and len(sizes) < target:
        sizes += pass_sizes(samples, partial)
    return sizes[:target]


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("partial", [True, False])
@pytest.mark.parametrize("buffer", [0, 200, 1000])
@pytest.mark.parametrize("mode", ["cap", "repeat", "off"])
@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_delivers_its_pass_once_then_the_documented_repeats(
    monkeypatch: pytest.MonkeyPatch,
    urls: list[str],
    world: int,
    mode: str,
    buffer: int,
    partial: bool,
    threads: int,
) -> None:
    samples = [len(rank_ids(urls, r, world)) for r in range(world)]
    counts = [math.ceil(n / BATCH) if partial else n // BATCH for n in samples]
    target = {"cap": min(counts), "repeat": max(counts)}.get(mode)
    for e in (0, 1):
        ranks = epoch(monkeypatch, world, lambda: make(urls, mode, buffer, partial), threads, e)
        every: collections.Counter[int] = collections.Counter()
        for rank, (batches, stats) in enumerate(ranks):
            n = samples[rank]
            want = expected_sizes(n, target or counts[rank], partial, mode == "repeat")
            assert [len(b) for b in batches] == want, (rank, e)
            first = len(pass_sizes(n, partial))
            once = [i for b in batches[:first] for i in b]
            again = [i for b in batches[first:] for i in b]
            # The first pass: distinct samples of this rank's own shards,
            # all of them unless cut by the cap or the last batch's drop.
            assert len(set(once)) == len(once) and set(once) <= rank_ids(urls, rank, world)
            assert len(once) == min(n - (0 if partial else n % BATCH), sum(want))
            # The repeats: a second pass, begun after the first was delivered.
            assert len(set(again)) == len(again) and set(again) <= rank_ids(urls, rank, world)
            assert stats["samples_repeated"] == len(again)
            every.update(once + again)
        if partial and (mode == "off" or world == 2):
            # Every rank's samples whole (500 on each of 2 ranks): every id once.
            assert every == collections.Counter(range(SHARDS * PER_SHARD))


def test_the_issues_counts(monkeypatch: pytest.MonkeyPatch, urls: list[str]) -> None:
    """The figures docs/epochs.md quotes (shuffle buffer 200, two threads)."""
    figures = {}
    for world in (2, 3):
        for mode in ("cap", "repeat", "off"):
            ranks = epoch(monkeypatch, world, functools.partial(make, urls, mode, 200), 2, 0)
            delivered = [sum(map(len, b)) for b, _ in ranks]
            distinct = len({i for b, _ in ranks for batch in b for i in batch})
            repeated = [s["samples_repeated"] for _, s in ranks]
            figures[world, mode] = (delivered, [len(b) for b, _ in ranks], distinct, repeated)
    assert figures == {
        (2, "cap"): ([500, 500], [16, 16], 1000, [0, 0]),
        (2, "repeat"): ([500, 500], [16, 16], 1000, [0, 0]),
        (2, "off"): ([500, 500], [16, 16], 1000, [0, 0]),
        (3, "cap"): ([320, 300, 300], [10, 10, 10], 920, [0, 0, 0]),
        (3, "repeat"): ([400, 396, 396], [13, 13, 13], 1000, [0, 96, 96]),
        (3, "off"): ([400, 300, 300], [13, 10, 10], 1000, [0, 0, 0]),
    }


@pytest.mark.parametrize("mode", ["cap", "repeat"])
def test_the_same_batches_whatever_the_thread_count(
    monkeypatch: pytest.MonkeyPatch, urls: list[str], mode: str
) -> None:
    runs = [
        [b for b, _ in epoch(monkeypatch, 3, lambda: make(urls, mode, 200), threads, 1)]
        for threads in (0, 1, 2)
    ]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("mode", ["cap", "repeat"])
@pytest.mark.parametrize("at", [4, 11])  # in the first pass, and in the second (repeat)
def test_a_resumed_rank_continues_with_exactly_the_rest(
    monkeypatch: pytest.MonkeyPatch, urls: list[str], mode: str, at: int
) -> None:
    def run(rank: int) -> None:
        whole = chute.DataLoader(make(urls, mode, 200), batch_size=None, num_workers=2)
        whole.set_epoch(3)
        expected = ids_of(iter(whole))
        first = chute.DataLoader(make(urls, mode, 200), batch_size=None, num_workers=2)
        first.set_epoch(3)
        it = iter(first)
        head = ids_of(next(it) for _ in range(min(at, len(expected))))
        state = first.state_dict()
        del it
        again = chute.DataLoader(make(urls, mode, 200), batch_size=None, num_workers=2)
        again.load_state_dict(state)
        assert head + ids_of(iter(again)) == expected, rank

    each_rank(monkeypatch, 3, run)


def test_a_state_of_another_mode_is_refused(
    monkeypatch: pytest.MonkeyPatch, urls: list[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    loader = chute.DataLoader(make(urls, "repeat", 200), batch_size=None)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = chute.DataLoader(make(urls, "cap", 200), batch_size=None)
    with pytest.raises(ValueError, match="even_batches='repeat' in the state, 'cap' here"):
        other.load_state_dict(state)
    # A state from before the passes were drained (they formed other
    # batches near each pass's end) is refused too.
    older = copy.deepcopy(state)
    del _find_order(older)["even_passes"]
    same = chute.DataLoader(make(urls, "repeat", 200), batch_size=None)
    with pytest.raises(ValueError, match="even_passes=None in the state, 'drained' here"):
        same.load_state_dict(older)
    same.load_state_dict(state)


def _find_order(state: Any) -> dict[str, Any]:
    """The order settings in a (nested) loader state."""
    if isinstance(state, dict):
        if "even_batches" in state:
            return state
        for value in state.values():
            found = _find_order(value)
            if found:
                return found
    return {}


def double(x: Any) -> Any:
    return x * 2


def python_batched(ds: Any) -> Any:
    # A Python stage before .batched: Python forms the batches.
    return ds.map_tuple(double, double).batched(BATCH)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["cap", "repeat"])
def test_a_python_stage_before_batching_still_gets_equal_counts(
    monkeypatch: pytest.MonkeyPatch, urls: list[str], mode: str, workers: int
) -> None:
    """The engine then hands samples over: every rank yields the fewest
    (most) samples a rank has, so Python batches them alike; with
    `workers` the stage runs in chute's worker processes."""
    ranks = epoch(monkeypatch, 3, lambda: make(urls, mode, 200, tail=python_batched), workers, 0)
    target = {"cap": 300, "repeat": 400}[mode]
    for rank, (batches, stats) in enumerate(ranks):
        assert [len(b) for b in batches] == pass_sizes(target, True)
        got = [i // 2 for b in batches for i in b]
        n = len(rank_ids(urls, rank, 3))
        once, again = got[: min(n, target)], got[min(n, target) :]
        assert len(set(once)) == len(once) and set(once) <= rank_ids(urls, rank, 3)
        assert len(set(again)) == len(again) == stats["samples_repeated"] == target - min(n, target)


def test_a_loader_batching_after_a_python_stage_gets_equal_counts(
    monkeypatch: pytest.MonkeyPatch, urls: list[str]
) -> None:
    def run(rank: int) -> list[int]:
        ds = make(urls, "cap", 200, tail=lambda ds: ds.map_tuple(double, double))
        loader = chute.DataLoader(ds, batch_size=BATCH, num_workers=2)
        return [len(cls) for _, cls in loader]

    assert each_rank(monkeypatch, 3, run) == [pass_sizes(300, True)] * 3


def test_a_python_stage_that_counts_nothing_is_refused_under_ddp(
    monkeypatch: pytest.MonkeyPatch, urls: list[str]
) -> None:
    def selected(ds: Any) -> Any:
        return ds.select(lambda sample: int(sample[1]) % 3 != 0).batched(BATCH)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"rank 0 of 2: even_batches='cap'.*\.select\(\)"):
        next(iter(make(urls, "cap", 0, tail=selected)))
    # With the counts left to the user, with a fixed epoch length, or
    # without DDP, it runs.
    kept = sum(1 for i in rank_ids(urls, 0, 2) if i % 3 != 0)
    assert len(list(make(urls, "off", 0, tail=selected))) == math.ceil(kept / BATCH)
    epoch_of = make(urls, "cap", 0, tail=lambda ds: selected(ds).with_epoch(20))
    assert len(list(epoch_of)) == 20
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert len(list(make(urls, "cap", 0, tail=selected))) == math.ceil(666 / BATCH)


@pytest.mark.parametrize("mode", ["cap", "repeat"])
def test_torch_worker_processes_agree_per_worker(
    monkeypatch: pytest.MonkeyPatch, urls: list[str], mode: str
) -> None:
    """torch's own DataLoader over a chute WebDataset: worker w of every rank
    yields the count of worker w of the rank with the fewest (most) samples."""

    def run(rank: int) -> tuple[list[list[int]], list[int]]:
        loader = torch.utils.data.DataLoader(make(urls, mode, 200), batch_size=None, num_workers=2)
        return ids_of(iter(loader)), []

    ranks = each_rank(monkeypatch, 3, run)
    # Shards per worker (split_by_node, then split_by_worker): rank 0 has
    # 2 + 2, ranks 1 and 2 have 2 + 1.
    per_worker = [[200, 200], [200, 100], [200, 100]]
    pick = min if mode == "cap" else max
    targets = [math.ceil(pick(w[k] for w in per_worker) / BATCH) for k in (0, 1)]
    for rank, (batches, _) in enumerate(ranks):
        assert len(batches) == sum(targets)
        got = [i for b in batches for i in b]
        assert set(got) <= rank_ids(urls, rank, 3)
        if mode == "cap":
            assert len(set(got)) == len(got)  # nobody reads a shard twice
            assert len(got) == sum(
                min(n, t * BATCH) for n, t in zip(per_worker[rank], targets, strict=True)
            )
        else:
            assert set(got) == rank_ids(urls, rank, 3)  # every sample, then repeats


@pytest.mark.parametrize("partial", [True, False])
def test_several_streams_yield_equal_counts_and_count_their_repeats(
    monkeypatch: pytest.MonkeyPatch, urls: list[str], partial: bool
) -> None:
    ranks = epoch(monkeypatch, 3, lambda: make(urls, "cap", 200, partial, streams=2), 2, 0)
    assert len({len(b) for b, _ in ranks}) == 1
    for batches, stats in ranks:
        got = collections.Counter(i for b in batches for i in b)
        assert sum(got.values()) - len(got) == stats["samples_repeated"]
        if partial:
            assert stats["samples_repeated"] == 0


def test_a_rank_short_of_the_cap_by_skipped_samples_fills_from_a_second_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rank 1 of 3 (shards 1, 4, 7) loses 20 samples whose npy header is
    not one: 280 samples make 9 batches, short of the 10 every rank must
    yield. Rather than hang its peers it reads a tenth from a second pass,
    counted; the other ranks read nothing twice."""
    urls = []
    for shard in range(SHARDS):
        path = tmp_path / f"shard-{shard:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                bad = shard == 1 and i % PER_SHARD < 20
                npy = b"not an npy" if bad else np.full(4, i, np.float32)
                sink.write({"__key__": f"s{i:05d}", "npy": npy, "cls": i})
        urls.append(str(path))

    def run(rank: int) -> tuple[list[int], int]:
        ds = make(urls, "cap", 0, handler=wds.ignore_and_continue)
        loader = chute.DataLoader(ds, batch_size=None, num_workers=2)
        return [len(b) for b in ids_of(iter(loader))], loader.stats()["samples_repeated"]

    sizes = each_rank(monkeypatch, 3, run)
    assert sizes == [([32] * 10, 0), ([32] * 8 + [24, 32], 32), ([32] * 9 + [12], 0)]
