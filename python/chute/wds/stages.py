"""webdataset's fluent interface, recorded: each method returns a copy with
one more stage, and nothing runs until the pipeline is iterated."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from typing_extensions import Self

from chute.collate import default_collate
from chute.decoders import IMAGE_SPECS
from chute.handlers import Handler, reraise_exception
from chute.image_options import image_options


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
        size: int | tuple[int, int] | None = None,
        crop: str = "center",
        flip: bool = False,
        resize: int | None = None,
        scale: tuple[float, float] | None = None,
        ratio: tuple[float, float] | None = None,
        normalize: tuple[Any, Any] | None = None,
        dtype: torch.dtype | str | None = None,
        layout: str | None = None,
    ) -> Self:
        """``specs`` as webdataset (an image spec such as ``"torchrgb8"``, or
        handler callables, which run on the slow path). chute's additions, run
        in C++ by the decoding thread (see the README): ``size=(h, w)`` with
        ``crop`` ``"center"`` (shorter side to the output, or to ``resize``
        first: torchvision's Resize(resize) + CenterCrop(size)), ``"random"``,
        ``"none"`` (plain resize) or ``"random_resized"`` (torchvision's
        RandomResizedCrop(size, scale, ratio)); ``flip`` mirrors half of the
        images at random; ``normalize=(mean, std)`` as torchvision's
        Normalize after ToTensor; ``dtype`` (uint8, float32, float16,
        bfloat16) and ``layout`` ("CHW", "HWC") override the image spec's."""
        for spec in specs:
            if isinstance(spec, str) and spec.lower() not in IMAGE_SPECS:
                raise ValueError(f"Unknown imagespec: {spec}")
        image_spec = next((s.lower() for s in specs if isinstance(s, str)), None)
        opts = image_options(
            image_spec,
            size=size,
            crop=crop,
            flip=flip,
            resize=resize,
            scale=scale,
            ratio=ratio,
            normalize=normalize,
            dtype=dtype,
            layout=layout,
        )
        return self._compose(Stage("decode", specs, {"handler": handler, **opts}))

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
