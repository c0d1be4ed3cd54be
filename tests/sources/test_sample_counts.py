"""Stream sample counting asks the shard's format (chute.sources.sample_counts):
even batch counts, with_length() and elastic resume all go through the
counter registered for the url, a format registered later is asked before
tar, and tar claims every url no other format claims."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import chute
import pytest
from chute.sources import sample_counts
from chute.sources.sample_counts import (
    CountSettings,
    ShardSamples,
    TarCounter,
    register_sample_counter,
    sample_counter,
)
from conftest import tiny_samples, write_shards
from helpers import counts, keys, run_ranks

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


class RecordingCounter:
    """Counts the tar shards of a folder named 'counted' as tar does, and
    records what it was asked."""

    def __init__(self) -> None:
        self.tar = TarCounter()
        self.asked: collections.Counter[str] = collections.Counter()

    def claims(self, url: str) -> bool:
        return "/counted/" in url

    def indexed_count(self, url: str) -> int | None:
        self.asked["indexed_count"] += 1
        return self.tar.indexed_count(url)

    def count(self, url: str, where: CountSettings) -> int:
        self.asked["count"] += 1
        return self.tar.count(url, where)

    def layouts(self, urls: list[str], where: CountSettings) -> list[ShardSamples]:
        self.asked["layouts"] += 1
        return self.tar.layouts(urls, where)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> RecordingCounter:
    monkeypatch.setattr(sample_counts, "_COUNTERS", dict(sample_counts._COUNTERS))
    counter = RecordingCounter()
    register_sample_counter("recording", counter)
    return counter


def test_the_counter_registered_last_that_claims_a_url_counts_it(recording: RecordingCounter):
    assert sample_counter("/data/counted/shard-000000.tar") is recording
    assert isinstance(sample_counter("/data/other/shard-000000.tar"), TarCounter)
    assert isinstance(sample_counter("s3://bucket/shard-000000.tar"), TarCounter)
    # Registering under a name already taken replaces that counter.
    register_sample_counter("recording", TarCounter())
    assert isinstance(sample_counter("/data/counted/shard-000000.tar"), TarCounter)


def test_stream_counts_are_asked_of_the_registered_format(
    recording: RecordingCounter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from chute.sources.shards import split_by_node
    from chute.sources.tarindex import write_index
    from chute.wds.even import even_samples

    urls = write_shards(tmp_path / "counted", tiny_samples(45, dim=4), per_shard=15)
    for url in urls:
        write_index(url)
    assert len(chute.WebDataset(urls, shardshuffle=False).with_length()) == 45
    assert recording.asked["indexed_count"] == 3
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # Rank 0: shards 0 and 2 (30 samples), rank 1: shard 1 (15): "cap" takes 15.
    assert even_samples("cap", urls[::2], urls, split_by_node, "", 0.0) == 15
    assert recording.asked["count"] == 3

    def make() -> Any:
        ds = chute.WebDataset(urls, shardshuffle=True, seed=3, elastic=True)
        return ds.to_tuple("__key__").batched(4)

    delivered, _ = run_ranks(monkeypatch, 2, make, keys)
    assert len(counts(delivered)) == 45
    assert recording.asked["layouts"] == 2  # once per rank, every shard in one call
