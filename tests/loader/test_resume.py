"""state_dict()/load_state_dict(): a resumed run yields exactly the batches
the uninterrupted run would have."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
from conftest import tiny_samples, write_shards

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def shuffled_pipeline(urls: list[str]) -> chute.WebDataset:
    return (
        chute.WebDataset(urls, shardshuffle=True, seed=11)
        .shuffle(300, initial=100)
        .decode()
        .to_tuple("__key__", "npy", "cls")
        .batched(48)
    )


def as_keys(batches: list[Any]) -> list[list[str]]:
    return [list(b[0]) for b in batches]


@pytest.mark.parametrize("stop_after", [0, 1, 7, 20])
def test_stream_resume_mid_epoch(tiny_shards: list[str], stop_after: int) -> None:
    full = list(shuffled_pipeline(tiny_shards))
    interrupted = shuffled_pipeline(tiny_shards)
    it = iter(interrupted)
    seen = list(islice(it, stop_after))
    state = interrupted.state_dict()
    del it
    resumed = shuffled_pipeline(tiny_shards)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert as_keys(seen + rest) == as_keys(full)
    np.testing.assert_array_equal(
        np.concatenate([b[1] for b in seen + rest]), np.concatenate([b[1] for b in full])
    )


def test_stream_resume_unbatched_rows(tiny_shards: list[str]) -> None:
    def build() -> chute.WebDataset:
        return (
            chute.WebDataset(tiny_shards, shardshuffle=False, seed=3)
            .shuffle(100)
            .to_tuple("__key__")
        )

    full = [k for (k,) in build()]
    first = build()
    it = iter(first)
    head = [k for (k,) in islice(it, 101)]  # stops inside the engine's second chunk
    state = first.state_dict()
    second = build()
    second.load_state_dict(state)
    assert head + [k for (k,) in second] == full


def test_stream_resume_through_dataloader(tiny_shards: list[str]) -> None:
    def loader() -> chute.DataLoader:
        return chute.DataLoader(shuffled_pipeline(tiny_shards), batch_size=None, num_workers=2)

    full = as_keys(list(loader()))
    a = loader()
    it = iter(a)
    head = as_keys(list(islice(it, 5)))
    state = a.state_dict()
    b = loader()
    b.load_state_dict(state)
    assert head + as_keys(list(b)) == full


def test_stream_state_names_the_next_epoch_between_epochs(tiny_shards: list[str]) -> None:
    ds = shuffled_pipeline(tiny_shards)
    list(ds)
    state = ds.state_dict()
    second_epoch = as_keys(list(ds))
    other = shuffled_pipeline(tiny_shards)
    other.load_state_dict(state)
    assert as_keys(list(other)) == second_epoch


def test_python_batching_cannot_checkpoint_mid_epoch(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False)
        .to_tuple("__key__")
        .map(lambda s: s)
        .batched(10)
    )
    it = iter(ds)
    next(it)
    with pytest.raises(ValueError, match="batched"):
        ds.state_dict()


@pytest.mark.parametrize("stop_after", [0, 3, 9])
def test_indexed_resume_matches_torch_order(stop_after: int) -> None:
    values = np.arange(1000, dtype=np.int64)
    ds = chute.ArrayDataset(x=values)

    def loader() -> chute.DataLoader:
        return chute.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(5)
        )

    full = [b["x"].tolist() for b in loader()]
    reference = [
        b["x"].tolist()
        for b in torch.utils.data.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(5)
        )
    ]
    assert full == reference
    a = loader()
    it = iter(a)
    head = [b["x"].tolist() for b in islice(it, stop_after)]
    state = a.state_dict()
    b = loader()
    b.load_state_dict(state)
    assert head + [x["x"].tolist() for x in b] == full


def test_resume_state_kind_mismatch(tiny_shards: list[str]) -> None:
    ds = chute.ArrayDataset(x=np.zeros((4, 2)))
    loader = chute.DataLoader(ds, batch_size=2)
    with pytest.raises(ValueError, match="stream"):
        loader.load_state_dict({"kind": "stream", "dataset": {}})


# ---------------------------------------------------------------- stream states that do not belong


def _stopped_state(ds: chute.WebDataset, batches: int) -> dict[str, Any]:
    it = iter(ds)
    for _ in range(batches):
        next(it)
    state = ds.state_dict()
    del it
    return state


def test_stream_state_past_the_end_of_the_epoch_is_refused(tiny_shards: list[str]) -> None:
    state = _stopped_state(shuffled_pipeline(tiny_shards), 1)
    state["batches"] = 10**6
    resumed = shuffled_pipeline(tiny_shards)
    resumed.load_state_dict(state)
    with pytest.raises(
        ValueError,
        match=r"resumes after batch 1000000 of its pass, but the pass "
        r"has only 21 batches",
    ):
        list(resumed)


def test_stream_state_past_the_end_of_unbatched_rows_is_refused(tiny_shards: list[str]) -> None:
    def build() -> chute.WebDataset:
        return chute.WebDataset(tiny_shards, shardshuffle=False, seed=3).to_tuple("__key__")

    state = _stopped_state(build(), 3)
    state["batches"] = 10**6
    resumed = build()
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="resumes after batch 1000000"):
        list(resumed)


def test_stream_state_past_the_indexed_end_is_refused_before_reading(tmp_path: Path) -> None:
    from chute.sources.tarindex import write_index

    urls = write_shards(tmp_path, tiny_samples(100), per_shard=25)

    def build() -> chute.WebDataset:
        return chute.WebDataset(urls, shardshuffle=False, seed=3).to_tuple("__key__").batched(8)

    state = _stopped_state(build(), 2)
    state["batches"] = 14  # 100 samples make 13 batches of 8
    resumed = build()
    resumed.load_state_dict(state)
    it = iter(resumed)  # without indexes, the pass is read to find its end
    with pytest.raises(
        ValueError, match="resumes after batch 14 of its pass, but the pass has only 13 batches"
    ):
        next(it)
    for url in urls:
        write_index(url)
    resumed.load_state_dict(state)
    with pytest.raises(
        ValueError, match="resumes after batch 14 of its pass, but the pass has only 13 batches"
    ):
        iter(resumed)
    at_end = build()
    at_end.load_state_dict(dict(state, batches=13))
    assert list(at_end) == []


def _same(batch: Any) -> Any:
    return batch


def test_stream_state_past_the_end_is_refused_in_worker_processes(tiny_shards: list[str]) -> None:
    def loader() -> chute.DataLoader:
        ds = chute.WebDataset(tiny_shards, shardshuffle=False, seed=3)
        pipeline = ds.to_tuple("__key__", "cls").batched(50).map(_same)
        return chute.DataLoader(pipeline, batch_size=None, num_workers=2)

    a = loader()
    it = iter(a)
    next(it)
    state = a.state_dict()
    del it
    state["dataset"]["batches"] = 10**6
    b = loader()
    b.load_state_dict(state)
    with pytest.raises(
        ValueError,
        match=r"resumes after batch 1000000 of its pass, but the pass "
        r"has only 20 batches",
    ):
        list(b)


def test_stream_state_past_the_last_pass_is_refused(tiny_shards: list[str]) -> None:
    state = _stopped_state(shuffled_pipeline(tiny_shards), 1)
    for position, words in [
        ({"pass": 10**6}, r"resumes in pass 1000000, but an epoch of this pipeline makes 1"),
        ({"pass": 1, "batches": 1}, r"resumes in pass 1 after batch 1, but an epoch of"),
    ]:
        resumed = shuffled_pipeline(tiny_shards)
        resumed.load_state_dict({**state, **position})
        with pytest.raises(ValueError, match=words):
            list(resumed)


def test_stream_state_at_the_end_of_the_epoch_resumes_into_nothing(tiny_shards: list[str]) -> None:
    ds = shuffled_pipeline(tiny_shards)
    state = _stopped_state(ds, 21)  # the last batch, before the end is seen
    assert (state["pass"], state["batches"]) == (0, 21)
    resumed = shuffled_pipeline(tiny_shards)
    resumed.load_state_dict(state)
    assert list(resumed) == []


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s: s.update(version=2), r"has version 2; this chute reads version 1"),
        (lambda s: s.pop("version"), r"has version None; this chute reads version 1"),
        (lambda s: s.pop("pipeline"), r"has no pipeline fingerprint"),
        (lambda s: s.pop("seed"), r"'seed' is missing"),
    ],
    ids=["unknown version", "no version", "no fingerprint", "no seed"],
)
def test_stream_states_without_version_or_fingerprint_are_refused(
    tiny_shards: list[str], change: Any, words: str
) -> None:
    state = _stopped_state(shuffled_pipeline(tiny_shards), 2)
    change(state)
    with pytest.raises(ValueError, match=words):
        shuffled_pipeline(tiny_shards).load_state_dict(state)


def test_stream_state_of_other_order_settings_is_refused(tiny_shards: list[str]) -> None:
    state = _stopped_state(shuffled_pipeline(tiny_shards), 2)

    def other(initial: int = 100, **settings: Any) -> Any:
        return (
            chute.WebDataset(tiny_shards, seed=11, **settings)
            .shuffle(300, initial=initial)
            .decode()
            .to_tuple("__key__", "npy", "cls")
            .batched(48)
        )

    with pytest.raises(ValueError, match=r"decide the order: streams=1 in the state, 2 here"):
        other(shardshuffle=True, streams=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"shardshuffle=True in the state, False here"):
        other(shardshuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="another pipeline"):
        other(initial=50, shardshuffle=True).load_state_dict(state)


def test_a_resumed_dataset_takes_the_states_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a seed each dataset draws its own: the resumed one must follow
    the interrupted run's shard order, not its own draw."""
    monkeypatch.delenv("WDS_SEED", raising=False)
    urls = write_shards(tmp_path, tiny_samples(240), per_shard=20)

    def build() -> chute.WebDataset:
        return chute.WebDataset(urls, shardshuffle=True).to_tuple("__key__").batched(10)

    first = build()
    first.set_epoch(4)
    full = as_keys(list(first))
    first.set_epoch(4)
    state = _stopped_state(first, 3)
    resumed = build()
    assert resumed.seed != first.seed
    resumed.load_state_dict(state)
    assert as_keys(list(resumed)) == full[3:]
    assert resumed.seed == first.seed
    # A seed given explicitly is never overridden: another one is refused.
    with pytest.raises(ValueError, match=r"taken with seed \d+; this dataset has seed 7"):
        chute.WebDataset(urls, shardshuffle=True, seed=7).to_tuple("__key__").batched(
            10
        ).load_state_dict(state)
