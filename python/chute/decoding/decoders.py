"""How each member is decoded: the native decoders chute runs on its threads,
and the Python decoders of the slow path, chosen the way webdataset chooses
them (by the last extension of the field's name at decode time).
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chute import _core
from chute.decoding.extensions import (
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


def decode_image_python(data: bytes, spec: str) -> Any:
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


def _msgpack(data: bytes) -> Any:
    # An optional package, as for webdataset: without it the member fails to
    # decode (ModuleNotFoundError, wrapped by the decode stage).
    import msgpack

    return msgpack.unpackb(data)


def _cbor(data: bytes) -> Any:
    import cbor  # type: ignore[import-not-found]

    return cbor.loads(data)


# tenbin (webdataset's ".ten" tensors): chunks of an 8-byte magic, a native
# int64 length and the bytes padded to 64; each array is a header chunk
# (int64s: dtype code and info as 8 ASCII bytes, rank, dims) and a data chunk.
_TENBIN_MAGIC = b"~TenBin~"
_TENBIN_DTYPES = {
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "i1": "int8",
    "i2": "int16",
    "i4": "int32",
    "i8": "int64",
    "u1": "uint8",
    "u2": "uint16",
    "u4": "uint32",
    "u8": "uint64",
}


def _tenbin_chunks(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    chunks: list[memoryview] = []
    offset = 0
    while offset < len(view):
        if bytes(view[offset : offset + 8]) != _TENBIN_MAGIC:
            raise ValueError(f"tenbin: bad magic at offset {offset}")
        if offset + 16 > len(view):
            raise ValueError(f"tenbin: chunk header cut at offset {offset}")
        (nbytes,) = struct.unpack("@q", view[offset + 8 : offset + 16])
        if nbytes < 0 or offset + 16 + nbytes > len(view):
            raise ValueError(f"tenbin: chunk at offset {offset} declares {nbytes} bytes")
        chunks.append(view[offset + 16 : offset + 16 + nbytes])
        offset += 16 + (nbytes + 63) // 64 * 64
    return chunks


def tenbin_loads(data: bytes) -> list[np.ndarray]:
    """The arrays of a tenbin buffer (webdataset's ``.ten``/``.tb`` members)."""
    chunks = _tenbin_chunks(data)
    if len(chunks) % 2:
        raise ValueError("tenbin: a header chunk without its data chunk")
    arrays = []
    for header, payload in zip(chunks[::2], chunks[1::2], strict=True):
        words = np.frombuffer(header, dtype="i8")
        if len(words) < 3:
            raise ValueError("tenbin: short array header")
        code = struct.pack("@q", int(words[0])).decode("ascii").strip("\0")
        if code not in _TENBIN_DTYPES:
            raise ValueError(f"tenbin: unsupported dtype code {code!r}")
        rank = int(words[2])
        if rank < 0 or len(words) < 3 + rank:
            raise ValueError(f"tenbin: bad rank {rank}")
        shape = tuple(int(d) for d in words[3 : 3 + rank])
        count = int(np.prod(shape))
        arrays.append(
            np.frombuffer(payload, dtype=_TENBIN_DTYPES[code], count=count).reshape(shape)
        )
    return arrays


_BASIC: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(TEXT_EXTENSIONS, _utf8),
    **dict.fromkeys(INT_EXTENSIONS, int),
    **dict.fromkeys(JSON_EXTENSIONS, json.loads),
    **dict.fromkeys(PICKLE_EXTENSIONS, pickle.loads),
    "pth": _torch_load,
    NPY_EXTENSION: _npy,
    "npz": _npz,
    "ten": tenbin_loads,
    "tb": tenbin_loads,
    "mp": _msgpack,
    "msg": _msgpack,
    "cbor": _cbor,
}


def basic_decoder(name: str) -> Callable[[bytes], Any] | None:
    """webdataset's decoder of a non-image member named `name` (by its last
    extension), or None: such members stay bytes."""
    return _BASIC.get(last_extension(name).lower())


def gunzip_name(name: str, data: bytes) -> tuple[str, bytes]:
    """A ``.gz`` member inflated and named without the ``.gz``, as
    webdataset's default ``gzfilter`` does before the other decoders (one
    level: ``txt.gz`` decodes as text); other members unchanged."""
    if ("." + name).endswith(".gz"):
        return name[:-3], gzip.decompress(data)
    return name, data


def python_decode(name: str, data: bytes, image_spec: str | None) -> Any:
    """Decode one member on the slow path, as webdataset's default Decoder
    with `image_spec` would; unknown extensions stay bytes."""
    name, data = gunzip_name(name, data)
    if image_spec is not None and last_extension(name).lower() in IMAGE_EXTENSIONS:
        return decode_image_python(data, image_spec)
    fn = basic_decoder(name)
    return data if fn is None else fn(data)
