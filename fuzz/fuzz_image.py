"""Fuzzes the image decoders (libjpeg-turbo and libpng behind chute's
checks): probe_image, then decode_image in RGB or gray as the first input
byte says. ``python fuzz/fuzz_image.py [libFuzzer flags] [corpus dirs]``."""

from __future__ import annotations

import sys

import atheris
from common import ALLOWED, _core, chute_testing  # not instrumented: see common.py

# Decoding a large declared size is legal but slow; the fuzzer should spend
# its time on parsing, so inputs that probe larger than this are not decoded.
MAX_PIXELS = 1 << 20


def test_one(data: bytes) -> None:
    if not data:
        return
    mode = "l" if data[0] & 1 else "rgb"
    payload = data[1:]
    try:
        info = _core.probe_image(payload)
    except ALLOWED:
        info = None
    if info is not None:
        _, width, height = info
        assert height > 0 and width > 0, info
        if height * width > MAX_PIXELS:
            return
    try:
        image = chute_testing.decode_image(payload, mode)
    except ALLOWED:
        return
    assert info is not None, "decode succeeded where probe failed"
    channels = 1 if mode == "l" else 3
    _, width, height = info
    assert image.shape[:2] == (height, width), (image.shape, info)
    assert image.size == height * width * channels, (image.shape, info)


def main() -> None:
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
