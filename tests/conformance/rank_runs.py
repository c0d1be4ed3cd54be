"""Running a kind's loaders on simulated ranks, and what docs/epochs.md says
they must deliver.

Ranks run in turn in this process, each with its own loader and its own
RANK/WORLD_SIZE (set while it is built and while it is iterated, as
torch.distributed would give them). A run's result is, per rank, its
batches as lists of sample ids.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories import Factory, N, Setting

Batches = list[list[int]]  # one rank's batches, as sample ids


@contextmanager
def as_rank(rank: int, world: int) -> Iterator[None]:
    """RANK and WORLD_SIZE of one simulated rank (restored after)."""
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def data_fixture() -> Any:
    """A session fixture `written(factory, shards)`: the factory's data in
    `shards` files, written on first use and kept for the session."""

    @pytest.fixture(scope="session")
    def written(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Factory, int], Any]:
        root = tmp_path_factory.mktemp("conformance")
        cache: dict[tuple[str, int], Any] = {}

        def get(factory: Factory, shards: int) -> Any:
            key = (factory.name, shards)
            if key not in cache:
                folder = root / factory.name.replace("[", "-").rstrip("]") / str(shards)
                cache[key] = factory.write(Path(folder), shards)
            return cache[key]

        return get

    return written


@dataclass
class Ranks:
    """One loader per simulated rank, kept across epochs and resumes."""

    factory: Factory
    data: Any
    setting: Setting
    world: int

    def __post_init__(self) -> None:
        self.loaders = []
        for rank in range(self.world):
            with as_rank(rank, self.world):
                self.loaders.append(self.factory.loader(self.data, self.setting))

    def epoch(
        self,
        epoch: int,
        batches: int | None = None,
        states: Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[list[Batches], list[dict[str, Any]]]:
        """Each rank's epoch `epoch` (its first `batches` batches when
        given), resumed from its entry of `states` when given, and its
        state after."""
        out: list[Batches] = []
        after = []
        for rank, loader in enumerate(self.loaders):
            with as_rank(rank, self.world):
                loader.set_epoch(epoch)
                if states is not None and states[rank] is not None:
                    loader.load_state_dict(states[rank])
                it = iter(loader)
                taken = it if batches is None else itertools.islice(it, batches)
                out.append([self.factory.ids(b) for b in taken])
                after.append(loader.state_dict())
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        return out, after


def counts(*parts: list[Batches]) -> collections.Counter[int]:
    return collections.Counter(i for part in parts for rank in part for b in rank for i in b)


def dealt(order: list[int], world: int, rank: int, drop_last: bool) -> list[int]:
    """DistributedSampler's part of `order` for `rank`: the order padded by
    repeating its start to a multiple of `world` (or cut to one, with
    `drop_last`), every `world`-th position from `rank`."""
    if drop_last:
        order = order[: len(order) - len(order) % world]
    else:
        padded = list(order)
        while len(padded) % world:
            padded += order[: world - len(padded) % world]
        order = padded
    return order[rank::world]


def batched(ids: list[int], size: int, drop_last: bool) -> Batches:
    out = [ids[i : i + size] for i in range(0, len(ids), size)]
    if drop_last and out and len(out[-1]) < size:
        out.pop()
    return out


def map_epoch(order: list[int], s: Setting, world: int) -> list[Batches]:
    """What every rank of a map-style loader delivers: its dealt part, batched."""
    return [
        batched(dealt(order, world, r, s.drop_last), s.batch, s.drop_last) for r in range(world)
    ]


def check_stream_epoch(got: list[Batches], shards: list[list[int]], s: Setting) -> str:
    """The documented rule a stream's epoch obeys for `s` (docs/epochs.md);
    AssertionError naming what broke. Returns what repetition it had."""
    world = len(got)
    delivered = counts(got)
    sizes = [len(b) for rank in got for b in rank]
    assert all(0 < n <= s.batch for n in sizes), sizes
    if s.drop_last:
        assert all(n == s.batch for n in sizes), f"partial=False left a partial batch: {sizes}"
    every = sorted(i for shard in shards for i in shard)
    if s.elastic:
        per_rank = [len(rank) for rank in got]
        assert len(set(per_rank)) == 1, f"elastic ranks yield unequal batch counts {per_rank}"
        if s.drop_last:
            assert max(delivered.values(), default=1) == 1, "elastic drop_last repeated a sample"
            assert per_rank[0] == N // (world * s.batch), per_rank
            return "none"
        assert sorted(delivered) == every, "elastic epoch lost samples"
        repeats = sum(delivered.values()) - len(every)
        # Only a rank whose last batch would be empty reads one sample again.
        assert 0 <= repeats < world, f"{repeats} repeated samples on {world} ranks"
        assert per_rank[0] == -(-N // (world * s.batch)), per_rank
        return f"{repeats} repeated"
    if world == 1 or s.even == "off":
        assert max(delivered.values(), default=1) == 1, (
            f"repeated: {sorted(i for i, c in delivered.items() if c > 1)}"
        )
        if not s.drop_last:
            assert sorted(delivered) == every, f"lost: {sorted(set(every) - set(delivered))}"
        else:
            assert len(delivered) >= N - world * (s.batch - 1)
        return "none"
    # cap and repeat: the ranks' shards are the split of the shards in order.
    own = [sorted(i for shard in shards[r::world] for i in shard) for r in range(world)]
    full = [len(o) // s.batch if s.drop_last else -(-len(o) // s.batch) for o in own]
    expected = min(full) if s.even == "cap" else max(full)
    per_rank = [len(rank) for rank in got]
    assert per_rank == [expected] * world, (
        f"even_batches={s.even!r}: batch counts {per_rank}, the ranks' own {full}"
    )
    for r in range(world):
        mine = counts([got[r]])
        assert set(mine) <= set(own[r]), f"rank {r} delivered another rank's samples"
    if s.even == "cap":
        assert max(delivered.values(), default=1) == 1, (
            f"cap repeated: {sorted(i for i, c in delivered.items() if c > 1)}"
        )
        return "none"
    repeats = 0
    for r in range(world):
        mine = counts([got[r]])
        if not s.drop_last:
            assert set(mine) == set(own[r]), f"rank {r} under repeat lost samples"
        repeats += sum(mine.values()) - len(mine)
    return f"{repeats} repeated"


def check_batch_mix_epoch(got: list[Batches], s: Setting, sources: int = 2) -> str:
    """A per-batch mix of elastic streams: the same batch count on every
    rank, every batch from one source, a source's samples only as often as
    the source itself repeats them (fewer than the world size)."""
    world = len(got)
    per_rank = [len(rank) for rank in got]
    assert len(set(per_rank)) == 1, f"a per-batch mix of elastic streams: counts {per_rank}"
    for rank in got:
        for b in rank:
            assert len({i // 100 for i in b}) == 1, f"a batch of several sources: {b}"
    delivered = counts(got)
    repeats = sum(delivered.values()) - len(delivered)
    assert repeats < sources * world, f"{repeats} repeats"
    return f"{repeats} repeated"


def check_map_elastic(first: list[Batches], second: list[Batches], s: Setting, total: int) -> None:
    """A map-style epoch resumed on another world size (docs/epochs.md,
    "Elastic resume"): the ranks of the second part share the R positions
    left, T batches each; every sample once but where the last round has
    fewer positions than ranks (or B = 1), whose padding repeats positions."""
    world, later = len(first), len(second)
    consumed = sum(len(b) for rank in first for b in rank)
    remaining = total - consumed
    per_rank = [len(rank) for rank in second]
    if s.drop_last:
        rounds = remaining // (later * s.batch)
        assert per_rank == [rounds] * later, (per_rank, rounds)
        assert all(len(b) == s.batch for rank in second for b in rank)
    else:
        rounds = -(-remaining // (later * s.batch))
        assert per_rank == [rounds] * later, (per_rank, rounds)
    both = counts(first, second)
    assert max(both.values(), default=1) >= 1
    delivered = sum(both.values())
    if s.drop_last:
        assert max(both.values(), default=1) == 1, "drop_last resume repeated a sample"
        assert delivered == consumed + rounds * later * s.batch
        return
    short = remaining % later
    padded = remaining > 0 and short and (remaining < later or s.batch == 1)
    pad = (later - short) if padded else 0
    assert delivered == total + pad, (delivered, total, pad, world, later)
    assert len(both) == total, "a resumed epoch lost samples"
