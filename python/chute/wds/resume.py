"""Where a WebDataset iteration stands, as a state dict, and the checks that
keep a state from resuming the wrong pipeline.

A state names the epoch, the shuffle seed, the pass over the shards (epochs
of ``with_epoch``/``repeat`` make several), the engine batches and rows
handed out in that pass, and the items the epoch has yielded. It also
carries a version, the dataset's seed (a resumed dataset takes it: the
shard shuffle and the buffers follow the interrupted run's draws) and a
fingerprint of the pipeline it came from (the shard list, the stages with
their batch and buffer sizes, and the settings that decide the order):
resuming another dataset, another pipeline or another batch size raises
ValueError naming the difference, never a silent wrong position, and so does
a state without a version or a fingerprint, or one whose position lies past
the end of the epoch's data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chute.stream.stages import Stage
from chute.wds.elastic_stream import ElasticRun

# The layout of the state dicts this module writes and reads.
STATE_VERSION = 1


@dataclass
class StreamPosition:
    epoch: int
    shuffle_seed: int | None
    pass_index: int = 0
    batches: int = 0  # engine batches of this pass fully handed out
    rows: int = 0  # rows handed out of the next one (unbatched pipelines)
    items: int = 0  # items the epoch has yielded (for its cap)
    seed: int | None = None  # the dataset's seed (None: not recorded yet)
    # elastic=True: the global position a loaded state recorded, and the
    # running iteration's segment (chute.wds.elastic_stream).
    recorded_elastic: dict[str, Any] | None = None
    elastic: ElasticRun | None = None

    def next_pass(self) -> None:
        self.pass_index += 1
        self.batches = 0
        self.rows = 0

    def as_state(self, pipeline: dict[str, Any]) -> dict[str, Any]:
        state = {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "shuffle_seed": self.shuffle_seed,
            "pass": self.pass_index,
            "batches": self.batches,
            "rows": self.rows,
            "items": self.items,
            "pipeline": pipeline,
        }
        if self.elastic is not None:
            state["elastic"] = self.elastic.state(self.batches)
        return state


def fingerprint(
    urls: Sequence[str],
    stages: Sequence[Stage],
    elastic: bool = False,
    order: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a state must match: the shard list (count and digest), the
    stages, whether positions are global (elastic), and `order`: the
    dataset's settings that decide the order of its samples."""
    digest = hashlib.sha256("\n".join(urls).encode("utf-8", "surrogateescape")).hexdigest()
    out: dict[str, Any] = {
        "num_shards": len(urls),
        "shards": digest[:16],
        "stages": [s.describe() for s in stages],
        "order": dict(order or {}),
    }
    if elastic:
        out["elastic"] = True
    return out


def _count(state: dict[str, Any], key: str, default: int | None = None) -> int:
    value = state.get(key, default)
    if value is None:
        raise ValueError(f"WebDataset state: {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"WebDataset state: {key!r} must be a count (an int >= 0), not {value!r}")
    return value


def check_fingerprint(recorded: dict[str, Any], expected: dict[str, Any]) -> None:
    """ValueError naming the first difference between the pipeline a state
    was taken from (`recorded`) and this one (`expected`)."""
    if (recorded.get("num_shards"), recorded.get("shards")) != (
        expected["num_shards"],
        expected["shards"],
    ):
        raise ValueError(
            "WebDataset state is from another dataset: its shard list differs "
            f"({recorded.get('num_shards')} shards, digest {recorded.get('shards')}; "
            f"this one has {expected['num_shards']} shards, digest {expected['shards']})"
        )
    if bool(recorded.get("elastic")) != bool(expected.get("elastic")):
        raise ValueError(
            "WebDataset state was taken with elastic="
            f"{bool(recorded.get('elastic'))}, this pipeline has elastic="
            f"{bool(expected.get('elastic'))}: their positions do not translate"
        )
    theirs_order, ours_order = recorded.get("order"), expected["order"]
    if theirs_order != ours_order:
        if not isinstance(theirs_order, dict):
            raise ValueError(f"WebDataset state: 'order' must be a dict, not {theirs_order!r}")
        differ = [
            f"{k}={theirs_order.get(k)!r} in the state, {ours_order.get(k)!r} here"
            for k in sorted(set(theirs_order) | set(ours_order))
            if theirs_order.get(k) != ours_order.get(k)
        ]
        raise ValueError(
            "WebDataset state was taken with other settings that decide the order: "
            + "; ".join(differ)
        )
    theirs, ours = recorded.get("stages"), expected["stages"]
    if theirs == ours:
        return
    if not isinstance(theirs, list):
        raise ValueError(f"WebDataset state: 'stages' must be a list, not {theirs!r}")
    for a, b in zip(theirs, ours, strict=False):
        if a != b and a.startswith("batched(") and b.startswith("batched("):
            raise ValueError(
                f"WebDataset state was taken with another batch size: {a} in the state, "
                f"{b} in this pipeline"
            )
    raise ValueError(
        f"WebDataset state is from another pipeline: stages {theirs} in the state, "
        f"{ours} in this one"
    )


def position_from_state(state: Any, expected: dict[str, Any]) -> StreamPosition:
    """The position `state` names, after checking it belongs to the pipeline
    whose fingerprint is `expected`."""
    if not isinstance(state, dict):
        raise ValueError(
            f"WebDataset state must be a dict from state_dict(), not {type(state).__name__}"
        )
    seed = state.get("shuffle_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"WebDataset state: 'shuffle_seed' must be an int or None, not {seed!r}")
    state_seed = state.get("seed")
    if state_seed is not None and (isinstance(state_seed, bool) or not isinstance(state_seed, int)):
        raise ValueError(f"WebDataset state: 'seed' must be an int, not {state_seed!r}")
    position = StreamPosition(
        epoch=_count(state, "epoch"),
        shuffle_seed=seed,
        pass_index=_count(state, "pass", 0),
        batches=_count(state, "batches"),
        rows=_count(state, "rows"),
        items=_count(state, "items", 0),
        seed=state_seed,
    )
    recorded = state.get("elastic")
    if recorded is not None and not isinstance(recorded, dict):
        raise ValueError(f"WebDataset state: 'elastic' must be a dict, not {recorded!r}")
    position.recorded_elastic = recorded
    if "pipeline" not in state:
        raise ValueError(
            "WebDataset state has no pipeline fingerprint (it was taken by a chute that did "
            "not record one, or not by state_dict()): it cannot be checked against this "
            "pipeline; start the epoch afresh"
        )
    if not isinstance(state["pipeline"], dict):
        raise ValueError(f"WebDataset state: 'pipeline' must be a dict, not {state['pipeline']!r}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise ValueError(
            f"WebDataset state has version {version!r}; this chute reads version "
            f"{STATE_VERSION} (a state from another chute release)"
        )
    if state_seed is None:
        raise ValueError("WebDataset state: 'seed' is missing")
    check_fingerprint(state["pipeline"], expected)
    return position


def check_pass_reached(start: StreamPosition, passes: int) -> None:
    """ValueError when `start` lies past the last of an epoch's `passes`
    (the end of the last pass is the end of the epoch)."""
    if start.pass_index < passes:
        return
    if start.pass_index > passes:
        where = f"in pass {start.pass_index}"
    elif start.batches or start.rows:
        where = f"in pass {start.pass_index} after batch {start.batches}"
    else:
        return
    raise ValueError(
        f"WebDataset state resumes {where}, but an epoch of this pipeline makes {passes} "
        "pass(es) over the shards: the state is from another pipeline, or was edited"
    )


def check_resume_reached(skip_batches: int, formed: int | None) -> None:
    """ValueError when a resumed pass has fewer batches (`formed`: all the
    engine formed, or the most the shards' indexes allow; None: unknown)
    than the one its state resumes after: the position lies past the end of
    the data."""
    if formed is not None and skip_batches > formed:
        raise ValueError(
            f"WebDataset state resumes after batch {skip_batches} of its pass, but the pass "
            f"has only {formed} batches: the state is from other data (another shard list "
            "of the same names, rewritten shards, or an edited state)"
        )
