"""Writes small seed corpora for the harnesses (nothing binary is committed):
``python fuzz/make_corpus.py [OUT_DIR]`` → OUT_DIR/{tar,npy,image}/..."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def tar_seeds() -> dict[str, bytes]:
    out = {}
    for fmt_name, fmt in (
        ("ustar", tarfile.USTAR_FORMAT),
        ("gnu", tarfile.GNU_FORMAT),
        ("pax", tarfile.PAX_FORMAT),
    ):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            for key in ("a", "dir/b", "c" * 120 if fmt != tarfile.USTAR_FORMAT else "c"):
                for ext, payload in (("txt", b"hello"), ("cls", b"3"), ("npy", b"\x93NUMPY")):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
            info = tarfile.TarInfo("somedir")
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        out[f"{fmt_name}.tar"] = buf.getvalue()[: 512 * 24]  # keep seeds small
    return out


def npy_seeds() -> dict[str, bytes]:
    out = {}
    arrays = {
        "f4": np.arange(6, dtype="<f4").reshape(2, 3),
        "be-i8": np.arange(4, dtype=">i8"),
        "fortran": np.asfortranarray(np.arange(6, dtype="u2").reshape(2, 3)),
        "bool": np.array([True, False]),
        "scalar": np.array(7, dtype="f8"),
        "empty": np.zeros((0, 3), dtype="f4"),
    }
    for name, array in arrays.items():
        buf = io.BytesIO()
        np.save(buf, array)
        out[f"{name}.npy"] = buf.getvalue()
    v2 = bytearray(out["f4.npy"])
    v2[6] = 2  # version 2.0 header: 4-byte length
    out["v2.npy"] = bytes(v2[:8]) + len(v2[10:]).to_bytes(4, "little")[:2] + bytes(v2[10:])
    return out


def image_seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    out = {}
    pixels = rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)
    for mode in ("RGB", "L", "RGBA", "P"):
        image = Image.fromarray(pixels).convert(mode)
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        out[f"{mode}.png"] = b"\x00" + buf.getvalue()
    for name, kw in (("base", {}), ("progressive", {"progressive": True})):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=80, **kw)
        out[f"{name}.jpg"] = b"\x00" + buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(pixels).convert("L").save(buf, format="JPEG")
    out["gray.jpg"] = b"\x01" + buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(buf, format="JPEG")
    out["cmyk.jpg"] = b"\x00" + buf.getvalue()
    return out


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus")
    for name, seeds in (("tar", tar_seeds()), ("npy", npy_seeds()), ("image", image_seeds())):
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        for file_name, data in seeds.items():
            (directory / file_name).write_bytes(data)
        print(f"{directory}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")


if __name__ == "__main__":
    main()
