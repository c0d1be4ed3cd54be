"""One recorded pipeline stage: what webdataset's fluent method or filter
function of the same name was asked to do. A stage is data (the compiler
reads it to build the native part of a pipeline) and a filter (called on an
iterator, it runs in Python, as webdataset's filter does)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chute.wds.pystages import apply_python_stage


@dataclass(eq=False)
class Stage:
    """One recorded stage: its kind (webdataset's method name) and arguments."""

    kind: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        """The stage run in Python over `data`."""
        return apply_python_stage(self, iter(data))


# Python stages that hold items or counts across calls: a mid-epoch
# checkpoint cannot replay them exactly.
STATEFUL_PYTHON_STAGES = frozenset(
    {"batched", "unbatched", "unlisted", "shuffle", "compose", "slice", "info"}
)
