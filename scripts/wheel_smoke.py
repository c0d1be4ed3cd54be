"""Smoke test of an installed chute wheel (cibuildwheel's test-command, and
scripts/test.sh before the suite): streams a small shard with JPEG, PNG, WebP
and npy members through the native engine and checks every value, so a wheel
whose bundled libjpeg-turbo/libpng/libwebp/zlib do not load or decode fails
here.
Needs pillow (the `test` extra) to write the images."""

from __future__ import annotations

import io
import sys
import tarfile
import tempfile
from pathlib import Path

import chute
import numpy as np
from PIL import Image


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# Member extension -> Pillow format, by sample number modulo 3. PNG and
# lossless WebP must decode to the exact pixels; JPEG only to the right shape.
FORMATS = [("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP")]


def main() -> int:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (8, 12, 3), dtype=np.uint8) for _ in range(6)]
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "smoke.tar"
        with tarfile.open(shard, "w") as tar:
            for i, pixels in enumerate(images):
                extension, image_format = FORMATS[i % 3]
                encoded = io.BytesIO()
                # `lossless` is WebP's option; the other encoders ignore it.
                Image.fromarray(pixels).save(encoded, format=image_format, lossless=True)
                _member(tar, f"s{i}.{extension}", encoded.getvalue())
                vector = io.BytesIO()
                np.save(vector, np.full(4, i, dtype=np.float32))
                _member(tar, f"s{i}.npy", vector.getvalue())
                _member(tar, f"s{i}.cls", str(i).encode())
        ds = (
            chute.WebDataset(str(shard), shardshuffle=False)
            .decode("rgb8")
            .to_tuple("jpg;png;webp", "npy", "cls")
        )
        seen = 0
        for i, (image, vector, label) in enumerate(ds):
            assert image.shape == (8, 12, 3) and image.dtype == np.uint8, image.shape
            if i % 3:
                assert np.array_equal(image, images[i]), f"sample {i}: pixels differ"
            assert np.array_equal(vector, np.full(4, i, dtype=np.float32))
            assert label == i
            seen += 1
        assert seen == len(images), seen
    print(f"chute {chute.__version__} wheel smoke test passed ({chute.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
