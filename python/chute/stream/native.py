"""The stream engine's side of a WebDataset iteration: field plans for the
compiled fields, seeds, error policy, batch pinning and skipped samples."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from chute import _core
from chute.common.errors import failure_scope, translate
from chute.common.handlers import (
    Handler,
    ignore_and_continue,
    reraise_exception,
    warn_and_continue,
)
from chute.common.warning_types import SkippedSampleWarning
from chute.decoding.decoders import IMAGE_SPECS
from chute.decoding.image_options import DEFAULT_RATIO, DEFAULT_SCALE
from chute.gpu.pinning import pin_hooks
from chute.stream.prefix import OutputField


def engine_seed(base_seed: int, rank: int, worker: int, pass_index: int = 0) -> int:
    """The engine's seed for a rank's torch worker in one pass of an epoch:
    ranks and workers read different shards, and the passes of an epoch are
    shuffled anew, so their shuffles and per-image draws (crops, flips)
    differ too."""
    return (base_seed * 1_000_003 + rank * 1009 + worker + pass_index * 7_919_009) & ((1 << 63) - 1)


@dataclass(frozen=True)
class EngineSettings:
    """The engine settings of one iteration."""

    threads: int
    prefetch: int | None
    timeout: float
    pin_memory: bool = False


# Without a .batched the engine still works in batches, whose rows are handed
# out one by one: batch_size rows, or fewer once their samples hold this many
# bytes, so that large samples do not pile up whole batches of them.
UNBATCHED_BATCH_BYTES = 8 << 20


@dataclass(frozen=True)
class ErrorHandlers:
    """The handlers of the failures in the native part of a pipeline, by
    scope (see ``chute.common.errors.failure_scope``)."""

    read: Handler  # opening, reading, tar structure, compression; anything else
    member: Handler  # a member that does not decode
    field: Handler  # a sample without the member a field needs

    @property
    def policy(self) -> Any:
        """The engine's error policy: skip and report when any handler may
        skip, else raise at the first failure."""
        handlers = (self.read, self.member, self.field)
        if all(h is reraise_exception for h in handlers):
            return _core.ErrorPolicy.RAISE
        return _core.ErrorPolicy.SKIP

    def for_failure(self, error: BaseException) -> Handler:
        """The handler of `error`'s scope, as the engine set it (never read
        from its message)."""
        scope = failure_scope(error)
        if scope == "member":
            return self.member
        if scope == "field":
            return self.field
        return self.read

    def report(self, errors: list[Exception]) -> bool:
        """Hands the errors of the samples the engine skipped to the handlers
        of their scopes: raises for ``reraise_exception``, warns for
        ``warn_and_continue``; True when a handler asks to stop."""
        for raw in errors:
            error = translate(raw)
            handler = self.for_failure(error)
            if handler is ignore_and_continue:
                continue
            if handler is warn_and_continue:
                warnings.warn(str(error), SkippedSampleWarning, stacklevel=4)
            elif handler is reraise_exception:
                raise error
            elif not handler(error):
                return True
        return False


_CROP_MODES = {
    "center": _core.CropMode.CENTER,
    "random": _core.CropMode.RANDOM,
    "none": _core.CropMode.NONE,
    "random_resized": _core.CropMode.RANDOM_RESIZED,
}
_PIXEL_TYPES = {
    "uint8": _core.PixelType.UINT8,
    "float32": _core.PixelType.FLOAT32,
    "float16": _core.PixelType.FLOAT16,
    "bfloat16": _core.PixelType.BFLOAT16,
}
_LAYOUTS = {"CHW": _core.Layout.CHW, "HWC": _core.Layout.HWC}


def image_output_spec(image_spec: str, decode_opts: dict[str, Any]) -> Any:
    """The engine's output spec for images decoded under `image_spec` with
    the decode stage's canonical image options (see chute.decoding.image_options)."""
    atype, etype, mode = IMAGE_SPECS[image_spec]
    spec = _core.ImageOutputSpec()
    layout = decode_opts.get("layout") or ("CHW" if atype == "torch" else "HWC")
    spec.layout = _LAYOUTS[layout]
    dtype = decode_opts.get("dtype") or ("float32" if etype == "float" else "uint8")
    spec.dtype = _PIXEL_TYPES[dtype]
    if decode_opts.get("size") is not None:
        spec.out_height, spec.out_width = decode_opts["size"]
        spec.crop = _CROP_MODES[decode_opts["crop"]]
        spec.resize = decode_opts.get("resize") or 0
        spec.scale_min, spec.scale_max = decode_opts.get("scale", DEFAULT_SCALE)
        spec.ratio_min, spec.ratio_max = decode_opts.get("ratio", DEFAULT_RATIO)
    spec.random_flip = bool(decode_opts.get("flip"))
    if decode_opts.get("normalize") is not None:
        mean, std = decode_opts["normalize"]
        # One value stands for every channel; a gray image uses the first.
        spec.normalize = True
        spec.mean = [mean[c % len(mean)] for c in range(3)]
        spec.std = [std[c % len(std)] for c in range(3)]
    return spec


def field_plan(f: OutputField, stack: bool, optional: bool, decode_opts: dict[str, Any]) -> Any:
    """The engine's plan for one native field; `decode_opts` are the decode
    stage's image options (see chute.decoding.image_options)."""
    plan = _core.FieldPlan()
    plan.name = f.name
    plan.extensions = [e.lower() for e in f.extensions]
    plan.optional = optional
    plan.stack = stack
    native = f.native
    if native is None:
        plan.decoder = _core.FieldDecoder.RAW
        return plan
    plan.decoder = native.decoder
    if native.image_spec is not None:
        mode = IMAGE_SPECS[native.image_spec][2]
        plan.color = _core.ColorMode.GRAY if mode == "l" else _core.ColorMode.RGB
        plan.image = image_output_spec(native.image_spec, decode_opts)
    return plan


def apply_pin_hooks(plan: Any) -> bool:
    """Pins batch memory in the engine; False when CUDA is there but the
    runtime's functions were not found (the caller then copies)."""
    hooks = pin_hooks()
    if hooks is not None:
        plan.set_pin_hooks(*hooks)
        return True
    return not torch.cuda.is_available()


def report_skips(engine: Any, handlers: ErrorHandlers) -> bool:
    """Hands the samples the engine skipped to their handlers; True when one
    asks to stop. A failure whose handler raises is raised here (the engine
    skipped it because another scope's handler may skip)."""
    return handlers.report(_core._take_skipped(engine))
