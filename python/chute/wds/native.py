"""The stream engine's side of a WebDataset iteration: field plans for the
compiled fields, error policy, batch pinning and skipped samples."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from chute import _core
from chute.decoders import IMAGE_SPECS
from chute.handlers import Handler, ignore_and_continue, reraise_exception, warn_and_continue
from chute.pinning import pin_hooks
from chute.wds.compiler import OutputField


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


def handler_policy(handler: Handler) -> Any:
    """The engine's error policy for `handler`: raise, or skip and report."""
    return _core.ErrorPolicy.RAISE if handler is reraise_exception else _core.ErrorPolicy.SKIP


_CROP_MODES = {
    "center": _core.CropMode.CENTER,
    "random": _core.CropMode.RANDOM,
    "none": _core.CropMode.NONE,
}


def field_plan(f: OutputField, stack: bool, optional: bool, decode_opts: dict[str, Any]) -> Any:
    """The engine's plan for one native field; `decode_opts` are the decode
    stage's image options (size, crop, flip)."""
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
        atype, etype, mode = IMAGE_SPECS[native.image_spec]
        plan.color = _core.ColorMode.GRAY if mode == "l" else _core.ColorMode.RGB
        spec = _core.ImageOutputSpec()
        spec.chw = atype == "torch"
        spec.to_float = etype == "float"
        if decode_opts.get("size") is not None:
            spec.out_height, spec.out_width = decode_opts["size"]
            spec.crop = _CROP_MODES[decode_opts["crop"]]
        spec.random_flip = bool(decode_opts.get("flip"))
        plan.image = spec
    return plan


def apply_pin_hooks(plan: Any) -> bool:
    """Pins batch memory in the engine; False when CUDA is there but the
    runtime's functions were not found (the caller then copies)."""
    hooks = pin_hooks()
    if hooks is not None:
        plan.set_pin_hooks(*hooks)
        return True
    return not torch.cuda.is_available()


def report_skips(engine: Any, handler: Handler) -> bool:
    """Hands the errors of skipped samples (each of its own kind) to the
    handler; True when it asks to stop."""
    errors = engine.take_skipped()
    if handler is ignore_and_continue or not errors:
        return False
    for error in errors:
        if handler is warn_and_continue:
            warnings.warn(str(error), stacklevel=3)
        elif not handler(error):
            return True
    return False
