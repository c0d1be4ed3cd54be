"""Per-batch weighted mixing of streams: `MixedStream` (what ``chute.mix``
returns for WebDataset pipelines, TarDatasets and other sources that are
not mixed per sample).

Each source yields batches (a ``WebDataset`` pipeline that batches, a
``chute.DataLoader``); step s of an epoch takes the next batch of the
source that ``_core.mix_schedule`` names for s. The weights of the epoch
are taken as fractions with denominators up to 10,000 and turned into
integer counts c_i (``[0.7, 0.3]`` → 7 and 3): every period of sum(c_i)
steps takes exactly c_i batches from source i, and every prefix of an epoch
is within one batch of its share (Tijdeman's chairman assignment). The
epoch ends at the first step whose source has no batch left, so no source
is ever read past its own epoch, and the ratio holds up to that step.

Under DDP the schedule is the same on every rank, so the mix yields equal
batch counts on every rank exactly when each source does
(``WebDataset(elastic=True)`` or ``even_batches``, ``chute.DataLoader(...,
distributed=True)``), and every rank takes its batch from the same source
at the same step. The state is the epoch, the steps taken and each
source's own state: resumable mid-epoch, and on another world size when
the sources are elastic (each then re-deals its remaining samples; the mix
continues its schedule at the same step).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import IterableDataset

from chute import _core
from chute.datasets.curriculum import GroupKey, Schedule, normalized_weights
from chute.loader.frameworks import check_foreign_read
from chute.loader.protocol import EngineDataset, LoaderSettings

_MAX_DENOMINATOR = 10_000
# The layout of a mix state; a state of another version is refused.
STATE_VERSION = 1
_SCHEDULE_CHUNK = 1024  # steps of the schedule computed at once


def rational_counts(shares: Sequence[float]) -> list[int]:
    """Smallest integer counts in the ratio of `shares` (each taken as a
    fraction with a denominator up to 10,000)."""
    fractions = [Fraction(s).limit_denominator(_MAX_DENOMINATOR) for s in shares]
    lost = [i for i, (s, f) in enumerate(zip(shares, fractions, strict=True)) if s > 0 and f == 0]
    if lost:
        raise ValueError(f"mix weight of source #{lost[0]} is below 1/{_MAX_DENOMINATOR}")
    common = math.lcm(*(f.denominator for f in fractions))
    counts = [int(f * common) for f in fractions]
    divisor = math.gcd(*counts)
    return [c // divisor for c in counts]


class MixedStream(IterableDataset[Any], EngineDataset):
    """Batches of several sources, mixed per batch by per-epoch weights (see
    the module doc). A source is anything with ``set_epoch``,
    ``state_dict``, ``load_state_dict`` and ``iter()`` yielding batches.

    Use it as a dataset of batches: ``chute.DataLoader(mixed,
    batch_size=None)`` or a plain ``for batch in mixed``. Without
    ``set_epoch`` each iteration advances the epoch by one.
    """

    index_driven: ClassVar[bool] = False

    def __init__(self, sources: Mapping[GroupKey, Any] | Sequence[Any], weights: Schedule) -> None:
        super().__init__()
        if isinstance(sources, Mapping):
            self.names: list[GroupKey] = list(sources)
            self.sources = [sources[n] for n in self.names]
        else:
            self.sources = list(sources)
            self.names = list(range(len(self.sources)))
        if not self.sources:
            raise ValueError("a mix needs at least one source")
        for name, source in zip(self.names, self.sources, strict=True):
            missing = [
                m
                for m in ("set_epoch", "state_dict", "load_state_dict", "__iter__")
                if not callable(getattr(source, m, None))
            ]
            if missing:
                raise TypeError(
                    f"mix source {name!r} ({type(source).__name__}) has no {', '.join(missing)}: "
                    "give chute datasets, WebDataset pipelines or chute.DataLoaders"
                )
        self.weights = weights
        self._epoch = 0
        self._epoch_set = False
        self._resume: dict[str, Any] | None = None
        self._iterations: list[weakref.ref[MixIteration]] = []
        self.counts(0)  # a bad schedule fails here

    def __getstate__(self) -> dict[str, Any]:
        # Live iterations stay in the process that runs them.
        state = self.__dict__.copy()
        state["_iterations"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def counts(self, epoch: int) -> list[int]:
        """Batches per period of the schedule from each source in `epoch`."""
        shares = normalized_weights(self.weights, self.names, epoch, "source")
        return rational_counts(list(shares.values()))

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        self._epoch_set = True

    def __iter__(self) -> Iterator[Any]:
        check_foreign_read(self, "__iter__")  # chute's loader calls loader_batches
        return self.iterate()

    def iterate(self) -> MixIteration:
        """One epoch of the mix."""
        resume, self._resume = self._resume, None
        epoch = int(resume["epoch"]) if resume is not None else self._epoch
        if resume is not None or not self._epoch_set:
            self._epoch = epoch + 1
        self._epoch_set = False
        if resume is None or resume["sources"] is None:
            for source in self.sources:
                source.set_epoch(epoch)
        # else each source loaded its own state in load_state_dict.
        steps = int(resume["steps"]) if resume is not None else 0
        it = MixIteration(self, epoch, self.counts(epoch), steps)
        self._iterations.append(weakref.ref(it))
        return it

    def _live(self) -> list[MixIteration]:
        live = [it for ref in self._iterations if (it := ref()) is not None and it.running]
        self._iterations = [weakref.ref(it) for it in live]
        return live

    def state_dict(self) -> dict[str, Any]:
        """The oldest running iteration's position, else the start of the
        next epoch."""
        live = self._live()
        if live:
            return live[0].state()
        return {
            "kind": "mix",
            "version": STATE_VERSION,
            "names": _state_names(self.names),
            "epoch": self._epoch,
            "steps": 0,
            "sources": None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration resumes at `state`. ValueError when it is not
        a state of a mix of these sources with these weights; each source
        checks (and loads) its own state now."""
        if not isinstance(state, dict) or state.get("kind") != "mix":
            raise ValueError("a mix state must be a dict from MixedStream.state_dict()")
        version = state.get("version")
        if isinstance(version, bool) or version != STATE_VERSION:
            raise ValueError(
                f"mix state has version {version!r}; this chute reads version {STATE_VERSION}"
            )
        for key in ("epoch", "steps"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"mix state: {key!r} must be an int >= 0, not {value!r}")
        names = _state_names(self.names)
        if state.get("names") != names:
            raise ValueError(
                f"mix state is of a mix of the sources {state.get('names')!r}; this mix has "
                f"{names!r}"
            )
        sources = state.get("sources")
        if sources is None:
            if state["steps"]:
                # Without them every source would start its epoch again
                # while the schedule goes on: seen batches delivered again.
                raise ValueError(
                    f"mix state is {state['steps']} batches into epoch {state['epoch']} but holds "
                    "no source states (its 'sources' is missing): it cannot resume there"
                )
        else:
            if not isinstance(sources, list) or len(sources) != len(self.sources):
                raise ValueError(
                    f"mix state holds {len(sources) if isinstance(sources, list) else sources!r} "
                    f"source states; this mix has {len(self.sources)} sources"
                )
            counts = self.counts(state["epoch"])
            if state.get("counts") != counts:
                raise ValueError(
                    f"mix state was taken with weights {state.get('counts')!r} at epoch "
                    f"{state['epoch']}; this mix weighs its sources {counts!r}"
                )
            for name, source, recorded in zip(self.names, self.sources, sources, strict=True):
                try:
                    source.load_state_dict(recorded)
                except ValueError as exc:
                    raise ValueError(f"mix state of source {name!r}: {exc}") from exc
        self._resume = {"epoch": state["epoch"], "steps": state["steps"], "sources": sources}

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        if settings.batch_size is not None:
            raise ValueError(
                "a mixed stream yields its sources' batches: give chute.DataLoader batch_size=None"
            )
        return self.iterate()

    def loader_state(self, running: Iterator[Any] | None = None) -> dict[str, Any]:
        if isinstance(running, MixIteration) and running.running:
            return running.state()
        return self.state_dict()

    def load_loader_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return f"MixedStream(sources={self.names!r}, weights={self.weights!r})"


class MixIteration(Iterator[Any]):
    """One epoch of a `MixedStream`."""

    def __init__(self, mix: MixedStream, epoch: int, counts: list[int], steps: int) -> None:
        self.mix = mix
        self.epoch = epoch
        self.counts = counts
        self.steps = steps  # batches yielded this epoch
        self.iterators: list[Iterator[Any]] = []
        self.running = True
        try:
            for source in mix.sources:
                self.iterators.append(iter(source))
        except BaseException:
            # A source that cannot start: the ones started before it stop now.
            self.close()
            raise
        self._schedule = np.zeros(0, dtype=np.int32)
        self._scheduled_from = steps

    def __next__(self) -> Any:
        if not self.running:
            raise StopIteration
        offset = self.steps - self._scheduled_from
        if offset >= self._schedule.size:
            self._scheduled_from = self.steps
            self._schedule = _core.mix_schedule(
                self.counts, self.steps, self.steps + _SCHEDULE_CHUNK
            )
            offset = 0
        source = int(self._schedule[offset])
        try:
            batch = next(self.iterators[source])
        except BaseException:
            # Its source ran out (the epoch ends here) or failed.
            self.close()
            raise
        self.steps += 1
        return batch

    def state(self) -> dict[str, Any]:
        return {
            "kind": "mix",
            "version": STATE_VERSION,
            "names": _state_names(self.mix.names),
            "epoch": self.epoch,
            "steps": self.steps,
            "counts": self.counts,
            "sources": [s.state_dict() for s in self.mix.sources],
        }

    def close(self) -> None:
        """Ends the epoch now: every source's iteration stops."""
        if not self.running:
            return
        self.running = False
        for it in self.iterators:
            close = getattr(it, "close", None)
            if callable(close):
                close()

    def __del__(self) -> None:
        self.close()


def _state_names(names: list[GroupKey]) -> list[str]:
    """The sources' names as a state records them."""
    return [str(n) for n in names]
