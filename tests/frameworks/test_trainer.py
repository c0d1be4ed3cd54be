"""chute's loaders inside the transformers Trainer (runs/trainer_run.py),
two ranks under torchrun (gloo): a get_train_dataloader override returning
the chute.DataLoader and ChuteStateCallback give each sample once per epoch
over the ranks and resume mid-epoch and at an epoch's end as the
uninterrupted run; the paths that bypass chute or give every rank the same
data are reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_runs import SAMPLES, assert_exactly_once_per_epoch, run

pytest.importorskip("transformers")

EPOCH_STEPS = 16


@pytest.fixture(scope="module")
def two_ranks(framework_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    out = tmp_path_factory.mktemp("trainer-2")
    return run("trainer_run.py", out, str(framework_data), ranks=2)


def by_epoch(steps: list[list[int]]) -> dict[int, list[int]]:
    """The ids of a run's steps by epoch (EPOCH_STEPS steps an epoch)."""
    epochs: dict[int, list[int]] = {}
    for step, ids in enumerate(steps):
        epochs.setdefault(step // EPOCH_STEPS, []).extend(ids)
    return epochs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_exactly_once_and_resume_as_the_uninterrupted_run(two_ranks, kind):
    full = [r[kind]["full"] for r in two_ranks]
    assert_exactly_once_per_epoch([by_epoch(f) for f in full], 2)
    for rank, record in enumerate(two_ranks):
        runs = record[kind]
        mid = runs["mid_a"] + runs["mid_b"]
        assert len(runs["mid_a"]) == EPOCH_STEPS + 10
        assert mid == full[rank], f"rank {rank}, mid-epoch resume: {len(sum(mid, []))} ids"
        end = runs["end_a"] + runs["end_b"]
        assert len(runs["end_a"]) == EPOCH_STEPS
        assert end == full[rank], f"rank {rank}, epoch-end resume: {len(sum(end, []))} ids"
        assert record["warnings"] == []


@pytest.mark.slow
def test_a_loader_the_trainer_builds_over_a_chute_dataset_is_reported(two_ranks):
    for record in two_ranks:
        assert record["trainer_built"]["warnings"] == ["ForeignLoaderWarning"]
    # accelerate's sharding: every sample, the last batch padded from the start.
    seen = [i for r in two_ranks for b in r["trainer_built"]["seen"] for i in b]
    assert set(seen) == set(range(SAMPLES))


@pytest.mark.slow
def test_a_loader_without_partition_warns_that_ranks_see_the_same_data(two_ranks):
    rank0, rank1 = (r["not_distributed"] for r in two_ranks)
    assert rank0["seen"] == rank1["seen"]
    assert rank0["warnings"] == rank1["warnings"] == ["SameDataOnEveryRankWarning"]


@pytest.mark.slow
def test_a_mid_epoch_resume_without_the_callback_is_refused(two_ranks):
    # The skipping loader is refused for what it is (it would also be a part
    # of a part here), with the callback that makes the resume exact.
    for record in two_ranks:
        error = record["resume_without_callback"]["error"]
        assert "skip_first_batches rebuilt" in error and "ChuteStateCallback" in error
