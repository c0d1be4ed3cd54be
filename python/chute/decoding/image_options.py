"""chute's image options on ``decode``: resize and crop (torchvision's
RandomResizedCrop, Resize + CenterCrop, ...), flip, normalisation, element
type and layout, checked once and brought to one canonical form, which the
engine's field plans are built from (see ``chute.stream.native``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from chute.decoding.decoders import IMAGE_SPECS

CROP_MODES = ("center", "random", "none", "random_resized")
DTYPES = ("uint8", "float32", "float16", "bfloat16")
LAYOUTS = ("CHW", "HWC")
# torchvision's RandomResizedCrop defaults.
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)

_TORCH_DTYPES = {
    torch.uint8: "uint8",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

# The options that change decoded pixels; with none of them set, decode is
# webdataset's.
TRANSFORM_KEYS = ("size", "flip", "resize", "normalize", "dtype", "layout")


def has_transforms(opts: dict[str, Any]) -> bool:
    """Whether the canonical options `opts` ask for anything webdataset's
    decode would not do."""
    return any(opts.get(k) not in (None, False) for k in TRANSFORM_KEYS)


def _pair(name: str, value: Any) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of numbers (min, max), not {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name} must be finite, not {value!r}")
    return lo, hi


def _size(size: Any) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if (
        not isinstance(size, Sequence)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in size)
        or min(size) < 1
    ):
        raise ValueError(f"size must be (height, width) with positive values, not {size!r}")
    return int(size[0]), int(size[1])


def _dtype(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_DTYPES:
            raise ValueError(
                f"dtype {dtype} is not an image output type; use one of "
                "torch.uint8, torch.float32, torch.float16, torch.bfloat16"
            )
        return _TORCH_DTYPES[dtype]
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    raise ValueError(
        f"dtype must be torch.uint8/float32/float16/bfloat16 or one of {DTYPES}, not {dtype!r}"
    )


def _channel_values(name: str, value: Any, channels: int) -> tuple[float, ...]:
    values = [value] if isinstance(value, (int, float)) else value
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"normalize {name} must be numbers, not {value!r}") from None
    if len(out) not in (1, channels):
        wanted = "1 value" if channels == 1 else f"1 or {channels} values (one per channel)"
        raise ValueError(f"normalize {name} needs {wanted}, got {len(out)}")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"normalize {name} must be finite, not {value!r}")
    return out


def image_options(
    image_spec: str | None,
    *,
    size: Any = None,
    crop: str = "center",
    flip: bool = False,
    resize: int | None = None,
    scale: Any = None,
    ratio: Any = None,
    normalize: Any = None,
    dtype: Any = None,
    layout: str | None = None,
) -> dict[str, Any]:
    """Checks the image options of ``decode(image_spec, ...)`` and returns
    them in canonical form: `size` a (height, width) tuple or None, `scale`
    and `ratio` float pairs, `normalize` ((mean, ...), (std, ...)) or None,
    `dtype` a name of DTYPES or None, `layout` "CHW", "HWC" or None (None:
    what the image spec gives). Raises ValueError naming what is wrong."""
    if crop not in CROP_MODES:
        raise ValueError(f"crop must be one of {', '.join(map(repr, CROP_MODES))}, not {crop!r}")
    out_size = _size(size)
    if crop == "random_resized" and out_size is None:
        raise ValueError('crop="random_resized" needs size=(height, width)')
    if (scale is not None or ratio is not None) and crop != "random_resized":
        raise ValueError('scale and ratio go with crop="random_resized"')
    scale_pair = _pair("scale", DEFAULT_SCALE if scale is None else scale)
    ratio_pair = _pair("ratio", DEFAULT_RATIO if ratio is None else ratio)
    if not 0 <= scale_pair[0] <= scale_pair[1]:
        raise ValueError(f"scale must be (min, max) with 0 <= min <= max, not {scale!r}")
    if not 0 < ratio_pair[0] <= ratio_pair[1]:
        raise ValueError(f"ratio must be (min, max) with 0 < min <= max, not {ratio!r}")
    if resize is not None:
        if not isinstance(resize, int) or isinstance(resize, bool) or resize < 1:
            raise ValueError(f"resize must be a positive int (the shorter side), not {resize!r}")
        if out_size is None or crop not in ("center", "random"):
            raise ValueError(
                'resize=N goes with size=(height, width) and crop="center" or "random" '
                "(torchvision's Resize(N) then CenterCrop / RandomCrop)"
            )
        if max(out_size) > resize:
            raise ValueError(
                f"size {out_size} does not fit an image resized to {resize} on its shorter "
                "side (torchvision would pad; chute does not)"
            )
    if not isinstance(flip, bool):
        raise ValueError(f"flip must be True or False, not {flip!r}")
    dtype_name = _dtype(dtype)
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be 'CHW' or 'HWC', not {layout!r}")

    opts: dict[str, Any] = {
        "size": out_size,
        "crop": crop,
        "flip": flip,
        "resize": resize,
        "scale": scale_pair,
        "ratio": ratio_pair,
        "normalize": None,
        "dtype": dtype_name,
        "layout": layout,
    }
    channels = 3
    if image_spec is not None:
        atype, etype, mode = IMAGE_SPECS[image_spec]
        channels = 1 if mode == "l" else 3
        if has_transforms(opts) or normalize is not None:
            if atype == "pil" or mode == "rgba":
                raise ValueError(
                    f"image spec {image_spec!r} decodes in Python; size, crop, flip, "
                    "normalize, dtype and layout need a native spec (rgb8, torchrgb8, l8, ...)"
                )
            if dtype_name == "bfloat16" and atype != "torch":
                raise ValueError(
                    f"dtype bfloat16 needs a torch image spec (numpy has no bfloat16), "
                    f"not {image_spec!r}"
                )
        out_type = dtype_name or ("float32" if etype == "float" else "uint8")
    elif has_transforms(opts) or normalize is not None:
        raise ValueError(
            "size, crop, flip, normalize, dtype and layout need an image spec, "
            'e.g. decode("torchrgb8", size=(224, 224))'
        )
    else:
        out_type = dtype_name or "uint8"
    if normalize is not None:
        try:
            mean, std = normalize
        except (TypeError, ValueError):
            raise ValueError(f"normalize must be (mean, std), not {normalize!r}") from None
        means = _channel_values("mean", mean, channels)
        stds = _channel_values("std", std, channels)
        if any(s == 0 for s in stds):
            raise ValueError("normalize std must not be 0")
        if out_type == "uint8":
            raise ValueError(
                "normalize needs a float output: pass dtype=torch.float32, torch.float16 or "
                "torch.bfloat16 (or a float spec such as 'torchrgb')"
            )
        opts["normalize"] = (means, stds)
    return opts
