"""num_workers="auto": the engine's threads and batches in flight follow
the consumer while the epoch runs, and the batches are exactly those of a
fixed setting."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import chute
import chute.common.autotune as autotune
import numpy as np
import pytest
import torch
from chute.common.autotune import AutoThreads, ThreadTuner, cores_available
from conftest import assert_same_typed, image_samples, write_shards

pytestmark = pytest.mark.native

TWO_CORES = cores_available() >= 2


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(
        tmp_path_factory.mktemp("auto-jpegs"), image_samples(240, seed=6, size=(96, 128)), 60
    )


@pytest.fixture
def restless(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tuner decides after every batch and alternates between 1 and 2
    threads (then the bound): the thread count changes all through the
    epoch. Returns the counts it chose."""
    monkeypatch.setattr(autotune, "WINDOW_SECONDS", 0.0)
    monkeypatch.setattr(autotune, "WINDOW_BATCHES", 1)
    chosen: list[int] = []
    counts = itertools.cycle([1, 2])

    def decide(self: ThreadTuner, threads: int, busy: float, wait: float, span: float) -> int:
        chosen.append(min(self.bound, next(counts)))
        return chosen[-1]

    monkeypatch.setattr(ThreadTuner, "decide", decide)
    return chosen


def shuffled_images(urls: list[str]) -> Any:
    # A shuffle buffer and random crops and flips: order and pixels both
    # come from the plan's seeds.
    return (
        chute.WebDataset(urls, shardshuffle=True, seed=3)
        .shuffle(50)
        .decode("torchrgb8", size=(48, 48), crop="random", flip=True)
        .to_tuple("jpg", "cls")
    )


def test_auto_batches_are_those_of_a_fixed_setting(
    jpeg_shards: list[str], restless: list[int]
) -> None:
    expected = list(chute.DataLoader(shuffled_images(jpeg_shards), batch_size=16, num_workers=1))
    got = list(chute.DataLoader(shuffled_images(jpeg_shards), batch_size=16, num_workers="auto"))
    assert_same_typed(got, expected)
    assert len(restless) >= 10  # the count moved all through the epoch
    two = list(chute.DataLoader(shuffled_images(jpeg_shards), batch_size=16, num_workers=2))
    assert_same_typed(two, expected)


def test_auto_batches_of_a_map_style_dataset_are_those_of_a_fixed_setting(
    restless: list[int],
) -> None:
    ds = chute.ArrayDataset(x=np.arange(5000, dtype=np.float32).reshape(1000, 5))

    def loader(workers: int | str) -> Any:
        return chute.DataLoader(
            ds,
            batch_size=10,
            shuffle=True,
            generator=torch.Generator().manual_seed(5),
            num_workers=workers,
        )

    expected = list(loader(1))
    assert_same_typed(list(loader("auto")), expected)
    assert len(restless) >= 50


def test_auto_batches_of_tar_samples_by_index_are_those_of_a_fixed_setting(
    jpeg_shards: list[str], restless: list[int]
) -> None:
    def loader(workers: int | str) -> Any:
        ds = chute.TarDataset(jpeg_shards, decode="torchrgb8", size=(40, 40), crop="random")
        return chute.DataLoader(
            ds,
            batch_size=12,
            shuffle=True,
            generator=torch.Generator().manual_seed(2),
            num_workers=workers,
        )

    expected = list(loader(1))
    assert_same_typed(list(loader("auto")), expected)
    assert len(restless) >= 10


def test_torch_sees_an_int_and_stats_report_the_choice(jpeg_shards: list[str]) -> None:
    loader = chute.DataLoader(shuffled_images(jpeg_shards), batch_size=16, num_workers="auto")
    assert isinstance(loader.num_workers, int) and loader.num_workers == cores_available()
    for _ in loader:
        pass
    stats = loader.stats()
    assert 1 <= stats["decode_threads"] <= cores_available()
    # Batches in flight follow the threads as a fixed setting's do (2 per thread).
    assert stats["prefetch_batches"] == 2 * stats["decode_threads"]
    assert loader.diagnose()["evidence"]["threads"]["auto"] is True


def test_auto_is_refused_for_a_dataset_torch_runs() -> None:
    with pytest.raises(ValueError) as info:
        chute.DataLoader(list(range(10)), batch_size=2, num_workers="auto")
    assert str(info.value) == (
        "num_workers='auto' tunes chute's engine threads; list is not a chute dataset and "
        "runs on torch's DataLoader, which takes an int"
    )


@pytest.mark.skipif(not TWO_CORES, reason="needs room for more than one thread")
def test_auto_backs_down_when_the_consumer_is_the_bottleneck(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=25, num_workers="auto")
    for _ in loader:
        time.sleep(0.02)  # 40 steps: three windows or more
    assert loader.stats()["decode_threads"] == 1
    assert loader.diagnose()["bottleneck"] == "consumer"


@pytest.mark.skipif(not TWO_CORES, reason="needs room for more than one thread")
def test_auto_adds_threads_while_the_consumer_waits_on_busy_ones(tmp_path: Path) -> None:
    # About a second of decoding on one thread: several windows.
    urls = write_shards(tmp_path, image_samples(240, seed=6, size=(192, 256)), 60)
    ds = chute.WebDataset(urls * 8, shardshuffle=False).decode("torchrgb8").to_tuple("jpg")
    loader = chute.DataLoader(ds, batch_size=8, num_workers="auto")
    assert loader._auto_threads is not None
    loader._auto_threads.last = 1  # start low, as after a consumer-bound epoch
    counts = []
    for _ in loader:
        counts.append(loader.stats()["decode_threads"])
    assert counts[0] == 1
    assert max(counts) == cores_available()


def test_the_next_epoch_starts_where_the_last_one_ended() -> None:
    auto = AutoThreads(8)
    assert int(auto) == 8 and auto.last == 8
    tuner = ThreadTuner(auto, prefetch=16)
    assert tuner.threads == 8 and tuner.per_thread == 2
    auto.last = 3
    assert ThreadTuner(auto, prefetch=16).threads == 3


class Engine:
    """Stands in for an engine: records what the tuner set."""

    def __init__(self) -> None:
        self.settings: list[tuple[int, int]] = []
        self.busy = 0.0

    def set_active_threads(self, threads: int, in_flight: int) -> None:
        self.settings.append((threads, in_flight))

    def stats(self) -> dict[str, Any]:
        return {"decode_seconds": self.busy}


def test_decide_up_down_and_hold() -> None:
    tuner = ThreadTuner(AutoThreads(8), prefetch=16)
    # Busy threads and a waiting consumer: enough more that it would not wait.
    assert tuner.decide(2, busy=2 * 0.9, wait_share=0.5, span=1.0) == 4
    assert tuner.decide(2, busy=2 * 0.9, wait_share=0.06, span=1.0) == 3
    assert tuner.decide(7, busy=7 * 0.9, wait_share=0.9, span=1.0) == 8  # the bound
    assert tuner.decide(8, busy=8 * 0.9, wait_share=0.9, span=1.0) == 8
    # Idle threads and a consumer that did not wait: what the work needs.
    assert tuner.decide(8, busy=1.0, wait_share=0.0, span=1.0) == 2
    assert tuner.decide(2, busy=1.5, wait_share=0.0, span=1.0) == 2  # needs 3: stays
    # Threads waiting for samples (storage): fewer, the consumer waits either way.
    assert tuner.decide(4, busy=0.4, wait_share=0.8, span=1.0) == 1
    # Balanced: nothing moves.
    assert tuner.decide(4, busy=4 * 0.75, wait_share=0.03, span=1.0) == 4
    assert tuner.decide(1, busy=0.1, wait_share=0.0, span=1.0) == 1


def test_a_step_down_undone_at_once_waits_longer_next_time() -> None:
    now = [0.0]
    engine = Engine()
    tuner = ThreadTuner(AutoThreads(4), prefetch=8, clock=lambda: now[0])
    tuner.attach(engine)

    def window(busy: float, waited: float) -> None:
        # A window of four batches over a second.
        for _ in range(4):
            now[0] += 0.25
            engine.busy += busy / 4
            tuner.observe(waited / 4)

    window(busy=0.5, waited=0.0)  # the work fits one thread: 4 -> 1
    window(busy=0.95, waited=0.5)  # it is busy and the consumer waits: -> 2
    window(busy=0.1, waited=0.0)  # one would do again, but the last step down
    window(busy=0.1, waited=0.0)  # was undone at once: it waits two windows
    window(busy=0.1, waited=0.0)  # -> 1
    assert engine.settings == [(4, 8), (1, 2), (2, 4), (1, 2)]
    assert tuner.changes == 3
    tuner.detach()
    assert engine.settings[-1] == (4, 8)  # all threads back for a reused engine
    assert tuner.auto.last == 1
