"""Every epoch invariant of docs/epochs.md over every data kind of the
registry, with settings drawn by hypothesis (factories.py: one factory per
kind; rank_runs.py: the ranks and the documented rules).

Per kind and setting (world size 1-4, threads 0/1/2, a Python stage on
worker processes, shuffle buffers from none to more than a rank's share,
batch sizes, partial or dropped last batches, even_batches modes, elastic
streams, shard counts that do and do not divide the world size, epochs 0-2):

1. an epoch delivers the documented samples: a map-style kind exactly the
   batches of DistributedSampler's partition of its reference order; a
   stream each sample once (or the documented repetition, counted), with
   equal batch counts where even_batches or elastic promise them;
2. the same batches for the same seed whatever the thread count, and with
   the Python stage on worker processes;
3. a state taken at a random batch resumes with exactly the rest;
4. a state taken on one world size resumes on another with every sample of
   the epoch once (the documented padding aside), equal counts per rank.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories import EVEN_MODES, FACTORIES, Factory, Setting, all_factories
from hypothesis import example, given
from hypothesis import strategies as st
from rank_runs import (
    Ranks,
    check_batch_mix_epoch,
    check_map_elastic,
    check_stream_epoch,
    counts,
    data_fixture,
    map_epoch,
)

# scripts/sanitize.sh runs the suite's default profile under ASan and TSan.
pytestmark = pytest.mark.native

written = data_fixture()

CASES = [pytest.param(f, id=f.name) for f in all_factories()]


def settings_of(factory: Factory, even: tuple[str, ...] = ("off",)) -> st.SearchStrategy[Setting]:
    """Settings of `factory`'s kind; streams on several ranks count their
    batches with one of the `even` modes (the others apply to one rank
    only, where they change nothing)."""

    def even_on_ranks(s: Setting) -> Setting:
        return s if s.world == 1 or s.even in even else s.replace(even=even[0])

    return (
        st.builds(
            Setting,
            world=st.integers(1, 4),
            threads=st.sampled_from([0, 1, 2]),
            # Worker processes cost a start each: one example in four.
            python=st.integers(0, 3).map(lambda k: k == 0),
            batch=st.integers(1, 6),
            drop_last=st.booleans(),
            shuffle=st.booleans(),
            # From none to more than any rank's share of the samples.
            buffer=st.sampled_from([0, 0, 3, 10, 50]),
            even=st.sampled_from(EVEN_MODES),
            elastic=st.booleans(),
            shards=st.sampled_from(factory.shard_counts),
            seed=st.integers(0, 3),
        )
        .map(even_on_ranks)
        .map(factory.adapt)
    )


def epoch_check(factory: Factory, data: Any, s: Setting, epoch: int, got: list[Any]) -> str:
    """Checks one epoch against its kind's documented rule; what it repeated."""
    if factory.semantics == "map":
        expected = map_epoch(factory.global_order(data, s, epoch), s, s.world)
        assert got == expected, f"epoch {epoch}: the batches are not DistributedSampler's"
        return "padding" if len(counts(got)) < sum(len(b) for r in got for b in r) else "none"
    if factory.semantics == "stream":
        return check_stream_epoch(got, factory.shard_ids(data), s)
    return check_batch_mix_epoch(got, s)


@pytest.mark.parametrize("factory", CASES)
@given(data=st.data())
def test_epochs_deliver_the_documented_samples(factory: Factory, written, data) -> None:
    s = data.draw(settings_of(factory), "setting")
    first = data.draw(st.integers(0, 2), "first epoch")
    epochs = data.draw(st.integers(1, 2), "epochs")
    files = written(factory, s.shards)
    ranks = Ranks(factory, files, s, s.world)
    for epoch in range(first, first + epochs):
        got, _ = ranks.epoch(epoch)
        epoch_check(factory, files, s, epoch, got)


STREAMS = [c for c in CASES if c.values[0].semantics == "stream"]


@pytest.mark.parametrize("factory", STREAMS)
@given(setting=settings_of(STREAMS[0].values[0], even=("cap", "repeat")))
# The cases of issue 30 first (the explicit phase runs them in CI too).
@example(Setting(world=2, batch=4, buffer=10, even="cap", shuffle=False, shards=5))
@example(Setting(world=3, batch=4, buffer=0, even="cap", shuffle=False, shards=5))
@example(Setting(world=2, threads=2, python=True, batch=2, even="repeat", shards=3))
def test_even_batches_deliver_the_documented_samples(
    factory: Factory, written, setting: Setting
) -> None:
    s = factory.adapt(setting.replace(world=max(2, setting.world), elastic=False))
    files = written(factory, s.shards)
    ranks = Ranks(factory, files, s, s.world)
    for epoch in range(2):
        got, _ = ranks.epoch(epoch)
        check_stream_epoch(got, factory.shard_ids(files), s)


@pytest.mark.parametrize("factory", CASES)
@given(data=st.data())
def test_same_batches_whatever_the_threads(factory: Factory, written, data) -> None:
    s = data.draw(settings_of(factory), "setting")
    other = data.draw(
        st.tuples(st.sampled_from([0, 1, 2]), st.booleans()).filter(
            lambda t: t != (s.threads, s.python)
        ),
        "other threads, python",
    )
    files = written(factory, s.shards)
    one, _ = Ranks(factory, files, s, s.world).epoch(1)
    changed = s.replace(threads=other[0], python=other[1])
    two, _ = Ranks(factory, files, changed, s.world).epoch(1)
    assert one == two


@pytest.mark.parametrize("factory", CASES)
@given(data=st.data())
def test_resume_continues_with_exactly_the_rest(factory: Factory, written, data) -> None:
    # A Python stage before a stream's batching refuses mid-epoch states
    # (docs/epochs.md): here it maps batches.
    s = data.draw(settings_of(factory), "setting").replace(python_on_batches=True)
    files = written(factory, s.shards)
    whole, _ = Ranks(factory, files, s, s.world).epoch(1)
    length = min(len(rank) for rank in whole)
    at = data.draw(st.integers(0, length), "resume at batch")
    first, states = Ranks(factory, files, s, s.world).epoch(1, batches=at)
    rest, _ = Ranks(factory, files, s, s.world).epoch(1, states=states)
    assert [a + b for a, b in zip(first, rest, strict=True)] == whole


def _elastic(factory: Factory) -> bool:
    return factory.elastic_resume


@pytest.mark.parametrize("factory", [c for c in CASES if _elastic(c.values[0])])
@given(data=st.data())
def test_elastic_resume_on_another_world_size(factory: Factory, written, data) -> None:
    s = data.draw(settings_of(factory), "setting").replace(python_on_batches=True)
    if factory.semantics == "stream":
        s = factory.adapt(s.replace(elastic=True))
    later = data.draw(st.integers(1, 4).filter(lambda w: w != s.world), "resumed on")
    files = written(factory, s.shards)
    whole, _ = Ranks(factory, files, s, s.world).epoch(1)
    # A position inside the samples (not the padding DistributedSampler adds).
    length = min(len(rank) for rank in whole)
    inside = min(length, sum(map(len, whole[0])) // max(1, s.batch))
    at = data.draw(st.integers(0, max(0, inside - 1)), "resume at batch")
    first, states = Ranks(factory, files, s, s.world).epoch(1, batches=at)
    second, _ = Ranks(factory, files, s, later).epoch(1, states=[states[0]] * later)
    if factory.semantics == "map":
        order = factory.global_order(files, s, 1)
        assert len(set(order)) == len(order)
        if at == 0:  # a state of an epoch not begun: DistributedSampler's partition
            assert second == map_epoch(order, s, later)
        else:
            check_map_elastic(first, second, s, len(order))
    elif factory.semantics == "stream":
        both = counts(first, second)
        assert sorted(both) == sorted(i for shard in factory.shard_ids(files) for i in shard) or (
            s.drop_last
        )
        per_rank = [len(rank) for rank in second]
        assert len(set(per_rank)) == 1, per_rank
        assert sum(both.values()) - len(both) < later + s.world
    else:
        check_batch_mix_epoch(second, s)
        both = counts(first, second)
        assert sum(both.values()) - len(both) < 2 * (later + s.world)


def test_every_kind_has_a_factory() -> None:
    from chute.kinds import registered_kinds

    names = {k.name for k in registered_kinds()}
    assert sorted(names - set(FACTORIES)) == [], "a registered kind without a conformance factory"
    assert sorted(set(FACTORIES) - names) == [], "a factory of no registered kind"
