"""webdataset's fluent interface, recorded: each method returns a copy with
one more stage, and nothing runs until the pipeline is iterated."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import Self

from chute.collate import default_collate
from chute.decoders import IMAGE_SPECS
from chute.handlers import Handler, reraise_exception


@dataclass
class Stage:
    """One recorded fluent call: its method name and arguments."""

    kind: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


# Python stages that hold items across calls: a mid-epoch checkpoint cannot
# replay them exactly.
STATEFUL_PYTHON_STAGES = frozenset({"batched", "unbatched", "shuffle", "compose"})


class Fluent:
    """webdataset's fluent interface: each method returns a copy with one more
    stage recorded. WebDataset compiles the stages onto the engine; WebLoader
    applies them in Python to what its DataLoader yields."""

    stages: list[Stage]
    epoch_items: int

    def _compose(self, stage: Stage) -> Self:
        result = copy.copy(self)
        result.stages = [*self.stages, stage]
        return result

    def shuffle(
        self,
        size: int,
        initial: int = 100,
        rng: random.Random | None = None,
        seed: int | None = None,
        handler: Handler | None = None,
    ) -> Self:
        if size < 1:
            return self
        return self._compose(
            Stage("shuffle", (size,), {"initial": initial, "rng": rng, "seed": seed})
        )

    def decode(
        self,
        *specs: str | Callable[[str, bytes], Any],
        handler: Handler = reraise_exception,
        size: tuple[int, int] | None = None,
        crop: str = "center",
        flip: bool = False,
    ) -> Self:
        """``specs`` as webdataset (an image spec such as ``"torchrgb8"``, or
        handler callables, which run on the slow path). chute's additions:
        ``size=(h, w)`` resizes (shorter side) and crops each image to a fixed
        size in C++, ``crop`` is ``"center"``, ``"random"`` or ``"none"``
        (plain resize), ``flip`` mirrors half of the images at random."""
        for spec in specs:
            if isinstance(spec, str) and spec.lower() not in IMAGE_SPECS:
                raise ValueError(f"Unknown imagespec: {spec}")
        if crop not in ("center", "random", "none"):
            raise ValueError(f"crop must be 'center', 'random' or 'none', not {crop!r}")
        if size is not None and (len(size) != 2 or min(size) < 1):
            raise ValueError(f"size must be (height, width) with positive values, not {size!r}")
        return self._compose(
            Stage("decode", specs, {"handler": handler, "size": size, "crop": crop, "flip": flip})
        )

    def rename(self, keep: bool = True, handler: Handler = reraise_exception, **kw: str) -> Self:
        return self._compose(Stage("rename", (), {"keep": keep, "handler": handler, "names": kw}))

    def to_tuple(self, *args: str, handler: Handler = reraise_exception) -> Self:
        if len(args) == 1 and " " in args[0]:
            args = tuple(args[0].split())
        return self._compose(Stage("to_tuple", args, {"handler": handler}))

    def map(self, f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Self:
        return self._compose(Stage("map", (f,), {"handler": handler}))

    def map_dict(self, handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> Self:
        return self._compose(Stage("map_dict", (), {"handler": handler, "fns": kw}))

    def map_tuple(self, *fns: Callable[[Any], Any], handler: Handler = reraise_exception) -> Self:
        return self._compose(Stage("map_tuple", fns, {"handler": handler}))

    def select(self, predicate: Callable[[Any], bool]) -> Self:
        return self._compose(Stage("select", (predicate,)))

    def batched(
        self,
        batchsize: int,
        collation_fn: Callable[[list[Any]], Any] | None = default_collate,
        partial: bool = True,
    ) -> Self:
        if batchsize < 1:
            raise ValueError(f"batchsize must be >= 1, got {batchsize}")
        return self._compose(
            Stage("batched", (batchsize,), {"collation_fn": collation_fn, "partial": partial})
        )

    def unbatched(self) -> Self:
        return self._compose(Stage("unbatched"))

    def compose(self, *fns: Callable[[Iterator[Any]], Iterator[Any]]) -> Self:
        """Append generator stages (iterator in, iterator out), run in Python."""
        result = self
        for fn in fns:
            result = result._compose(Stage("compose", (fn,)))
        return result

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Self:
        """Each epoch yields this many items (batches when batched), restarting
        the shard list as often as needed, as webdataset does."""
        result = copy.copy(self)
        result.epoch_items = max(nsamples, nbatches)
        return result
