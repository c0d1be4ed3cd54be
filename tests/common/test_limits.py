"""Limits that keep one bad input or one bad setting from taking the
machine's memory: the image pixel limit (Pillow's, configurable), a batch
size that cannot fit, and an allocation that fails."""

from __future__ import annotations

import io
import os
import re
import warnings
import zlib
from pathlib import Path
from typing import Any

import chute
import chute.wds as cwds
import chute_testing
import numpy as np
import pytest
from chute import _core
from conftest import jpeg_bytes, write_shards
from helpers import png_declaring, run_json_probe

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def bomb_png(side: int) -> bytes:
    """A real PNG of side x side black pixels: its IDAT deflates to the whole
    image (for 15000, about 640 KiB holding 645 MiB of pixels)."""
    compress = zlib.compressobj(9)
    row = b"\x00" * (1 + 3 * side)  # filter byte + RGB
    chunks = [compress.compress(row) for _ in range(side)]
    idat = b"".join(chunks) + compress.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return len(body).to_bytes(4, "big") + kind + body + crc.to_bytes(4, "big")

    ihdr = side.to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.fixture
def restore_pixel_limit() -> Any:
    before = chute.get_max_image_pixels()
    yield
    chute.set_max_image_pixels(before)


def test_pixel_limit_is_where_pillow_raises(restore_pixel_limit: Any) -> None:
    import PIL.Image

    assert chute.get_max_image_pixels() == 2 * PIL.Image.MAX_IMAGE_PIXELS == 178_956_970
    for side in (13375, 13380):  # 13375^2 is just below 2x the limit, 13380^2 just above
        data = png_declaring(side, side)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PIL.Image.DecompressionBombWarning)
            try:
                PIL.Image.open(io.BytesIO(data))
                pillow_refuses = False
            except PIL.Image.DecompressionBombError:
                pillow_refuses = True
        if pillow_refuses:
            with pytest.raises(chute.DataError, match="above the limit of 178956970 pixels"):
                _core.probe_image(data)
        else:
            assert _core.probe_image(data) == ("png", side, side)
        assert pillow_refuses == (side == 13380)


def test_a_bomb_fails_from_its_header_and_is_skippable(
    tmp_path: Path, restore_pixel_limit: Any
) -> None:
    bomb = bomb_png(15000)
    assert len(bomb) < 1 << 20
    rng = np.random.default_rng(0)
    samples: list[dict[str, object]] = [
        {"__key__": f"s{i}", "png" if i == 1 else "jpg": bomb if i == 1 else jpeg_bytes(rng, 8, 8)}
        for i in range(3)
    ]
    url = write_shards(tmp_path, samples, 3)[0]

    def pipeline(handler: Any) -> Any:
        return (
            chute.WebDataset(url, shardshuffle=False, handler=handler)
            .decode("rgb8")
            .to_tuple("__key__", "jpg;png")
        )

    with pytest.raises(chute.DataError, match="15000x15000 = 225000000 pixels") as info:
        list(pipeline(cwds.reraise_exception))
    assert "s1.png" in str(info.value) and "set_max_image_pixels" in str(info.value)
    ds = pipeline(cwds.ignore_and_continue)
    assert [k for k, _ in ds] == ["s0", "s2"]
    assert ds.stats()["samples_skipped"] == 1
    # The limit is the user's to set: lower, it refuses small images too.
    chute.set_max_image_pixels(63)
    with pytest.raises(chute.DataError, match="8x8 = 64 pixels, above the limit of 63"):
        list(pipeline(cwds.reraise_exception))
    chute.set_max_image_pixels(None)
    assert chute.get_max_image_pixels() is None
    assert _core.probe_image(png_declaring(60000, 60000)) == ("png", 60000, 60000)
    with pytest.raises(ValueError, match="positive"):
        chute.set_max_image_pixels(0)


def test_a_batch_size_that_cannot_fit_is_refused(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards[:1], shardshuffle=False).decode().to_tuple("npy", "cls")
    with pytest.raises(ValueError, match=r"batch_size 1000000000 cannot fit") as info:
        next(iter(ds.batched(10**9)))
    assert "bytes of memory of this machine" in str(info.value)
    # A large batch that fits is formed from what there is.
    (batch,) = list(ds.batched(10**6))
    assert batch[0].shape == (250, 64)


ALLOCATION = """
import json, resource, sys
import chute, chute.wds
from chute import _core
url = sys.argv[1]
chute.set_max_image_pixels(None)
# Address space for what is mapped now plus 1 GiB: the 4.8 GB of a
# 40000 x 40000 RGB image cannot be had.
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
try:
    list(chute.WebDataset(url, shardshuffle=False).decode("rgb8").to_tuple("png"))
except MemoryError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


@pytest.mark.skipif(
    bool(os.environ.get("CHUTE_SANITIZER")), reason="sanitizers reserve address space of their own"
)
def test_an_allocation_that_fails_is_a_memory_error_naming_it(tmp_path: Path) -> None:
    url = write_shards(tmp_path, [{"__key__": "big", "png": png_declaring(40000, 40000)}], 1)[0]
    report = run_json_probe(ALLOCATION, url)
    assert report["error"] == "MemoryError"
    assert "cannot allocate 4800000000 bytes" in report["message"]
    assert "uint8 tensor of shape (40000, 40000, 3)" in report["message"]


# ---------------------------------------------------------------- error texts

# What an error text must never show: an empty field between separators, a
# separator with nothing after it, a detail left empty before the source
# location.
EMPTY_FIELD = re.compile(r": :|:\s*$|:\s*\[|''|(?<!\w)\(\)")


def engine_errors(tmp_path: Path) -> dict[str, str]:
    """The message of each kind of bad sample, as the engine raises it."""
    rng = np.random.default_rng(0)
    good = jpeg_bytes(rng, 16, 16)
    png = bomb_png(8)
    bad: dict[str, dict[str, bytes]] = {
        "corrupt-jpeg": {"jpg": good[:200]},
        "corrupt-png": {"png": png[:45]},
        "garbage-jpeg": {"jpg": b"\xff\xd8\xff" + bytes(64)},
        "not-an-image": {"jpg": b""},
        "bad-npy": {"npy": b"\x93NUMPY\x01\x00"},
        "bad-label": {"cls": b"seven"},
    }
    messages = {}
    for name, fields in bad.items():
        url = write_shards(tmp_path / name, [{"__key__": "k", **fields}], 1)[0]
        field = next(iter(fields))
        spec = "jpg;png" if field in ("jpg", "png") else field
        with pytest.raises(chute.DataError) as info:
            list(chute.WebDataset(url, shardshuffle=False).decode("rgb8").to_tuple(spec))
        messages[name] = str(info.value)
    return messages


def test_error_texts_have_no_empty_fields(tmp_path: Path) -> None:
    for name, message in engine_errors(tmp_path).items():
        assert "shard '" in message and "member 'k." in message and "offset 0" in message, name
        assert not EMPTY_FIELD.search(message), (name, message)
    # The decoders called on their own, without a place, start with their words.
    for call in (
        lambda: chute_testing.decode_image(b"\xff\xd8\xff" + bytes(64), "rgb", ""),
        lambda: _core.decode_npy(b"\x93NUMPY\x01\x00", ""),
        lambda: _core.parse_int_label(b"x", ""),
    ):
        with pytest.raises(chute.DataError) as info:
            call()
        message = str(info.value)
        assert not message.startswith(":") and not EMPTY_FIELD.search(message), message
