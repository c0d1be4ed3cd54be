"""How each member is decoded: the native decoders chute runs on its threads,
and the Python decoders of the slow path, chosen the way webdataset chooses
them (by the last extension of the field's name at decode time).
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chute import _core
from chute.extensions import (
    IMAGE_EXTENSIONS,
    INT_EXTENSIONS,
    JSON_EXTENSIONS,
    NATIVE_IMAGE_EXTENSIONS,
    NPY_EXTENSION,
    PICKLE_EXTENSIONS,
    TEXT_EXTENSIONS,
    last_extension,
)

# webdataset's image specs: (array type, element type, mode).
IMAGE_SPECS: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}


@dataclass(frozen=True)
class NativeDecode:
    """A field the engine decodes: what it asks of the engine, and how the
    resulting column is handed to the user."""

    decoder: Any  # _core.FieldDecoder
    image_spec: str | None = None  # key of IMAGE_SPECS for images

    @property
    def as_torch(self) -> bool:
        return self.image_spec is not None and IMAGE_SPECS[self.image_spec][0] == "torch"


def native_decode_for(name: str, image_spec: str | None) -> NativeDecode | None:
    """The native decoder webdataset's Decoder would match for a field named
    `name` under `.decode(image_spec)`, or None when only Python can decode it."""
    ext = last_extension(name).lower()
    if image_spec is not None and ext in IMAGE_EXTENSIONS:
        atype, _, mode = IMAGE_SPECS[image_spec]
        if ext in NATIVE_IMAGE_EXTENSIONS and atype != "pil" and mode != "rgba":
            return NativeDecode(_core.FieldDecoder.IMAGE, image_spec)
        return None
    if ext == NPY_EXTENSION:
        return NativeDecode(_core.FieldDecoder.NPY)
    if ext in INT_EXTENSIONS:
        return NativeDecode(_core.FieldDecoder.INT)
    return None


def _decode_image_python(data: bytes, spec: str) -> Any:
    import PIL.Image

    atype, etype, mode = IMAGE_SPECS[spec]
    with io.BytesIO(data) as stream:
        img: PIL.Image.Image = PIL.Image.open(stream)
        img.load()
        img = img.convert(mode.upper())
    if atype == "pil":
        return img
    result = np.asarray(img)
    if etype == "float":
        result = result.astype(np.float32) / 255.0
    if atype == "torch":
        import torch

        if result.ndim == 3:
            return torch.from_numpy(result.transpose(2, 0, 1).copy())
        return torch.from_numpy(result.copy())
    return result


def _torch_load(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _npz(data: bytes) -> Any:
    return dict(np.load(io.BytesIO(data)))


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


def _npy(data: bytes) -> Any:
    return np.lib.format.read_array(io.BytesIO(data))


_BASIC: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(TEXT_EXTENSIONS, _utf8),
    **dict.fromkeys(INT_EXTENSIONS, int),
    **dict.fromkeys(JSON_EXTENSIONS, json.loads),
    **dict.fromkeys(PICKLE_EXTENSIONS, pickle.loads),
    "pth": _torch_load,
    NPY_EXTENSION: _npy,
    "npz": _npz,
}


def python_decode(name: str, data: bytes, image_spec: str | None) -> Any:
    """Decode one member on the slow path, as webdataset's default Decoder
    with `image_spec` would; unknown extensions stay bytes."""
    ext = last_extension(name).lower()
    if image_spec is not None and ext in IMAGE_EXTENSIONS:
        return _decode_image_python(data, image_spec)
    fn = _BASIC.get(ext)
    return data if fn is None else fn(data)
