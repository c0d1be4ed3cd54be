"""chute's loaders inside Hugging Face Accelerate (runs/accelerate_run.py),
in one process and two (torchrun, gloo): ``accelerator.prepare`` keeps a
chute loader that partitions itself (or runs in one process) as it is, so
chute's engine runs, each sample comes once per epoch over the ranks, and
save_state/load_state (register_for_checkpointing) resume mid-epoch and at
an epoch's end as the uninterrupted run. A loader accelerate rebuilds, and
skip_first_batches, are reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_runs import (
    SAMPLES,
    assert_exactly_once_per_epoch,
    by_epoch,
    counts,
    run,
)

pytest.importorskip("accelerate")

EPOCHS = 2


@pytest.fixture(scope="module")
def one_process(framework_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    return run("accelerate_run.py", tmp_path_factory.mktemp("accelerate-1"), str(framework_data))


@pytest.fixture(scope="module")
def two_processes(framework_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    out = tmp_path_factory.mktemp("accelerate-2")
    return run("accelerate_run.py", out, str(framework_data), ranks=2)


def check_kept_and_resumed(records: list, kind: str) -> None:
    world = len(records)
    full = [by_epoch(r[kind]["full"]["seen"]) for r in records]
    assert [counts(f)[0][0] for f in full] == [SAMPLES // world] * world
    assert_exactly_once_per_epoch(full, EPOCHS)
    for rank, record in enumerate(records):
        runs = record[kind]
        assert runs["full"]["kept"], "accelerate replaced chute's loader"
        assert runs["full"]["engine_batches"] > 0, "chute's engine did not run"
        mid = by_epoch(runs["mid_a"]["seen"], runs["mid_b"]["seen"])
        assert mid == full[rank], f"rank {rank}, mid-epoch resume: {counts(mid)}"
        end = by_epoch(runs["end_a"]["seen"], runs["end_b"]["seen"])
        assert end == full[rank], f"rank {rank}, epoch-end resume: {counts(end)}"
        assert record["warnings"] == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_one_process_keeps_chute_and_resumes(one_process, kind):
    check_kept_and_resumed(one_process, kind)
    (record,) = one_process
    assert record["map_rebuilt"]["kept"]  # one process: nothing to shard
    # One process: accelerate's torch loader over the dataset is exact.
    assert record["skip_first_batches"] == {"batches": 32 - 3, "warnings": []}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_two_ranks_keep_chute_exactly_once_and_resume(two_processes, kind):
    check_kept_and_resumed(two_processes, kind)


@pytest.mark.slow
def test_two_ranks_stream_without_dispatch_is_kept(two_processes):
    seen = [by_epoch([(e, i) for e, i in r["stream_no_dispatch"]["seen"]]) for r in two_processes]
    assert all(r["stream_no_dispatch"]["kept"] for r in two_processes)
    assert_exactly_once_per_epoch(seen, 1)


@pytest.mark.slow
def test_two_ranks_a_rebuilt_loader_and_skip_first_batches_are_reported(two_processes):
    for record in two_processes:
        rebuilt = record["map_rebuilt"]
        assert not rebuilt["kept"] and rebuilt["engine_batches"] == 0
        assert rebuilt["warnings"] == ["ForeignLoaderWarning"]
        assert "a part of a part" in record["skip_first_batches"]["error"]
