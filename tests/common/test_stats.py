"""stats(): the figures add up, and say where the time goes."""

from __future__ import annotations

from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pytest


def corrupted_shards(tmp_path: Any) -> list[str]:
    from conftest import tiny_samples, write_shards

    samples: list[dict[str, object]] = []
    for i, s in enumerate(tiny_samples(300)):
        if i % 50 == 7:
            s["npy"] = b"\x93NUMPY garbage"  # bad header: skipped under the skip policy
        samples.append(s)
    return write_shards(tmp_path, samples, per_shard=100)


@pytest.mark.parametrize("threads", [1, 2])
def test_counts_add_up_with_skips(tmp_path: Any, threads: int) -> None:
    urls = corrupted_shards(tmp_path)
    ds = (
        chute.WebDataset(urls, shardshuffle=False, handler=wds.ignore_and_continue, threads=threads)
        .decode()
        .to_tuple("npy", "cls")
        .batched(32)
    )
    rows = sum(len(cls) for _, cls in ds)
    s = ds.stats()
    assert s["samples_read"] == 300
    assert s["samples_skipped"] == 6
    assert s["samples_yielded"] == rows == 294
    assert s["samples_read"] == s["samples_yielded"] + s["samples_skipped"]
    assert s["batches"] == 10
    assert s["shards_opened"] == 3
    assert s["encoded_bytes"] > 294 * 64 * 4
    assert s["read_seconds"] > 0 and s["decode_seconds"] > 0 and s["wait_seconds"] >= 0
    assert s["python_items"] == 0  # nothing ran on the slow path
    assert s["batch_peak_bytes_in_use"] > 0 and s["queued_batches"] == 0


def test_python_stages_are_counted(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .decode()
        .to_tuple("cls")
        .map_tuple(int)
        .batched(100)
    )
    assert sum(len(b[0]) for b in ds) == 1000
    assert ds.stats()["python_items"] == 1000


def test_live_stats_while_iterating(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=True, seed=1)
        .shuffle(500)
        .decode()
        .to_tuple("npy")
        .batched(50)
    )
    loader = chute.DataLoader(ds, batch_size=None, num_workers=2)
    it = iter(loader)
    next(it)
    live = loader.stats()
    assert live["batches"] == 1 and live["samples_yielded"] == 50
    assert live["shuffle_peak_samples"] >= 100  # the buffer filled before the first batch left
    assert live["shuffle_peak_bytes"] > 100 * 64 * 4
    del it


def test_indexed_stats(tmp_path: Any) -> None:
    ds = chute.ArrayDataset(x=np.arange(1000, dtype=np.float32))
    for _ in chute.DataLoader(ds, batch_size=100, num_workers=2):
        pass
    s = ds.stats()
    assert s["batches"] == 10 and s["samples_yielded"] == 1000 and s["bytes_yielded"] == 4000
    assert s["wait_seconds"] > 0 and s["python_items"] == 0


def test_streams_and_map_style_datasets_report_one_schema(tiny_shards: list[str]) -> None:
    from chute.common.stats import STATS_KEYS

    stream = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy").batched(50)
    table = chute.ArrayDataset(x=np.arange(1000, dtype=np.float32))
    loaders = [
        chute.DataLoader(stream, batch_size=None, num_workers=2),
        chute.DataLoader(table, batch_size=50, num_workers=2),
    ]
    for loader in loaders:
        assert set(STATS_KEYS) <= set(loader.dataset.stats())  # before any iteration too
        it = iter(loader)
        next(it)
        live = loader.stats()
        assert set(STATS_KEYS) <= set(live)
        assert live["batches"] == 1 and live["samples_yielded"] == 50
        assert live["batch_bytes_in_use"] > 0  # the running engine's gauges
        del it


def test_partial_last_batch_reuses_a_full_batch_buffer(tmp_path: Any) -> None:
    from conftest import write_shards

    # 16 rows of 1 KiB fill a 16 KiB buffer; the last batch's 3 KiB alone would
    # take a fresh 4 KiB one. With one batch in flight and each batch dropped
    # before the next is asked for, the first batch's buffer is idle when the
    # last batch is made (the iterator itself holds no batch while it waits).
    rows = [np.full(256, i, np.float32) for i in range(35)]
    samples = [{"__key__": f"r{i:03d}", "npy": r} for i, r in enumerate(rows)]
    urls = write_shards(tmp_path, samples, 35)
    ds = (
        chute.WebDataset(urls, shardshuffle=False, threads=1, prefetch=1)
        .decode()
        .to_tuple("npy")
        .batched(16)
    )
    it = iter(ds)
    got = []
    while (batch := next(it, None)) is not None:
        got.append(batch[0].copy())
        del batch
    assert [len(b) for b in got] == [16, 16, 3]
    assert np.array_equal(np.concatenate(got), np.stack(rows))
    # At most two buffers whatever the timing: either the second batch reused
    # the first one's (then the last batch finds none idle, or finds that one
    # once the consumer let go of it) or the last batch reuses the first
    # batch's, idle by then. Taking only its own size class it would need a
    # third whenever the first two batches have buffers of their own.
    assert ds.stats()["arenas_created"] <= 2
