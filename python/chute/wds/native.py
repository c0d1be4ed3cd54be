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
from chute.image_options import DEFAULT_RATIO, DEFAULT_SCALE
from chute.pinning import pin_hooks
from chute.wds.compiler import OutputField


@dataclass(frozen=True)
class EngineSettings:
    """The engine settings of one iteration."""

    threads: int
    prefetch: int | None
    timeout: float
    pin_memory: bool = False


def handler_policy(handler: Handler) -> Any:
    """The engine's error policy for `handler`: raise, or skip and report."""
    return _core.ErrorPolicy.RAISE if handler is reraise_exception else _core.ErrorPolicy.SKIP


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
    the decode stage's canonical image options (see chute.image_options)."""
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
    stage's image options (see chute.image_options)."""
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
