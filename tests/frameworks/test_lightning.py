"""chute's loaders inside PyTorch Lightning (runs/lightning_run.py): one
device and two (ddp under torchrun, gloo), map-style (shuffle=True with a
seeded generator) and a stream: every epoch delivers each sample once over
the ranks, and resuming from a mid-epoch or an end-of-epoch checkpoint
gives the uninterrupted run's batches."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_runs import assert_exactly_once_per_epoch, by_epoch, counts, run

pytest.importorskip("lightning")

EPOCHS = 2


@pytest.fixture(scope="module")
def one_device(framework_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    out = tmp_path_factory.mktemp("lightning-1")
    return run("lightning_run.py", out, str(framework_data), "1")


@pytest.fixture(scope="module")
def two_devices(framework_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    out = tmp_path_factory.mktemp("lightning-2")
    return run("lightning_run.py", out, str(framework_data), "2", ranks=2)


def check_resumes(records: list, kind: str) -> None:
    full = [by_epoch(r[kind]["full"]) for r in records]
    assert_exactly_once_per_epoch(full, EPOCHS)
    assert full[0][0] != full[0][1]  # the epochs' orders differ
    for rank, record in enumerate(records):
        runs = record[kind]
        # Mid-epoch (a stream has no len(): Lightning pulls a batch ahead).
        mid = by_epoch(runs["mid_a"], runs["mid_b"])
        assert mid == full[rank], f"rank {rank}, mid-epoch resume: {counts(mid)}"
        # End of epoch 0 (Lightning loads no loader state there).
        end = by_epoch(runs["end_a"], runs["end_b"])
        assert end == full[rank], f"rank {rank}, epoch-end resume: {counts(end)}"
    assert all(r["warnings"] == [] for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_one_device_resumes_as_the_uninterrupted_run(one_device, kind):
    check_resumes(one_device, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_two_ddp_ranks_exactly_once_and_resume_as_the_uninterrupted_run(two_devices, kind):
    check_resumes(two_devices, kind)
