"""Smoke test of an installed chute wheel (cibuildwheel's test-command, and
scripts/test.sh before the suite): streams a small shard with JPEG, PNG and
npy members through the native engine and checks every value, so a wheel
whose bundled libjpeg-turbo/libpng/zlib do not load or decode fails here.
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


def main() -> int:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (8, 12, 3), dtype=np.uint8) for _ in range(6)]
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "smoke.tar"
        with tarfile.open(shard, "w") as tar:
            for i, pixels in enumerate(images):
                encoded = io.BytesIO()
                # PNG is lossless, so decoded pixels must match exactly; JPEG
                # only has to decode to the right shape.
                Image.fromarray(pixels).save(encoded, format="PNG" if i % 2 else "JPEG")
                _member(tar, f"s{i}.{'png' if i % 2 else 'jpg'}", encoded.getvalue())
                vector = io.BytesIO()
                np.save(vector, np.full(4, i, dtype=np.float32))
                _member(tar, f"s{i}.npy", vector.getvalue())
                _member(tar, f"s{i}.cls", str(i).encode())
        ds = (
            chute.WebDataset(str(shard), shardshuffle=False)
            .decode("rgb8")
            .to_tuple("jpg;png", "npy", "cls")
        )
        seen = 0
        for i, (image, vector, label) in enumerate(ds):
            assert image.shape == (8, 12, 3) and image.dtype == np.uint8, image.shape
            if i % 2:
                assert np.array_equal(image, images[i]), f"sample {i}: PNG pixels differ"
            assert np.array_equal(vector, np.full(4, i, dtype=np.float32))
            assert label == i
            seen += 1
        assert seen == len(images), seen
    print(f"chute {chute.__version__} wheel smoke test passed ({chute.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
