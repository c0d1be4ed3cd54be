"""WebP members, decoded natively (libwebp), against webdataset + Pillow on
the same shards: every image spec, the crop/resize options, TarDataset,
region decode, and the errors.

Bounds: lossless WebP is pixel-identical to Pillow's decode. Lossy WebP is
within LOSSY_LEVELS of it on every pixel: chute links the system's libwebp
and Pillow bundles its own, and the two versions' YUV -> RGB rounding may
differ by a level (where the versions agree, as on the machine these tests
were written on, the pixels are identical too). With a resize, the bound of
tests/decoding/test_train_transforms.py (within 1 of Pillow's resize of Pillow's
decode) plus that.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import chute
import chute.decoding.decoders
import chute_testing
import numpy as np
import pytest
import torch
import webdataset
from chute import _core
from chute.decoding.decoders import native_decode_for
from chute.decoding.extensions import IMAGE_EXTENSIONS, NATIVE_IMAGE_EXTENSIONS
from conftest import write_shards
from helpers import assert_names, assert_same, member_offsets
from PIL import Image
from test_train_transforms import (
    SEED,
    diff,
    photo,
    pillow_reference,
    placement,
    torchvision_resize_center_crop,
)

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

LOSSY_LEVELS = 1
SPECS = ["rgb8", "torchrgb8", "rgb", "torchrgb", "torch", "l8", "torchl8", "l"]
# Odd sizes, a one-pixel-wide one among them.
SHAPES = [(37, 51), (23, 64), (61, 45), (1, 7), (50, 3), (40, 40)]


def webp(img: np.ndarray, *, lossless: bool, alpha: bool, seed: int = 0) -> bytes:
    """`img` (HxWx3) as WebP; with alpha, a seeded alpha plane with fully
    transparent patches (whose colours the encoder may change: both decoders
    read the same bytes)."""
    pil = Image.fromarray(img)
    if alpha:
        rng = np.random.default_rng(seed)
        a = rng.integers(0, 256, img.shape[:2], dtype=np.uint8)
        a[: img.shape[0] // 3, : img.shape[1] // 2] = 0
        pil = Image.fromarray(np.dstack([img, a]), "RGBA")
    out = io.BytesIO()
    pil.save(out, format="WEBP", lossless=lossless, quality=80)
    return out.getvalue()


def make_samples(lossless: bool, seed: int, shapes: list[tuple[int, int]] = SHAPES) -> list[Any]:
    """One sample per shape, every other one with alpha."""
    return [
        {
            "__key__": f"w{seed}-{i:03d}",
            "webp": webp(photo(h, w, seed * 100 + i), lossless=lossless, alpha=i % 2 == 1, seed=i),
            "cls": i,
        }
        for i, (h, w) in enumerate(shapes)
    ]


def bound(lossless: bool) -> int:
    return 0 if lossless else LOSSY_LEVELS


@pytest.fixture(scope="module", params=[True, False], ids=["lossless", "lossy"])
def shards(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], bool]:
    lossless = bool(request.param)
    samples = make_samples(lossless, seed=3 if lossless else 4)
    return write_shards(tmp_path_factory.mktemp("webp"), samples, per_shard=4), lossless


@pytest.fixture
def native_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if chute hands an image to its Python (Pillow) decoder:
    the comparisons below would then compare Pillow with itself."""

    def refuse(data: bytes, spec: str) -> Any:
        raise AssertionError(f"decoded in Python ({spec}), not by the engine")

    monkeypatch.setattr(chute.decoding.decoders, "decode_image_python", refuse)


def assert_close(ref: Any, got: Any, levels: int, where: str = "") -> None:
    """assert_same, but images within `levels` (of 255 for float specs)."""
    if levels == 0:
        assert_same(ref, got, where)
        return
    if isinstance(ref, (list, tuple)):
        assert type(ref) is type(got) and len(ref) == len(got), where
        for i, (a, b) in enumerate(zip(ref, got, strict=True)):
            assert_close(a, b, levels, f"{where}[{i}]")
    elif isinstance(ref, (np.ndarray, torch.Tensor)):
        assert type(ref) is type(got) and ref.dtype == got.dtype, where
        assert ref.shape == got.shape, where
        a = np.asarray(ref).astype(np.float64)
        b = np.asarray(got).astype(np.float64)
        scale = 1.0 if np.asarray(ref).dtype == np.uint8 else 1 / 255
        assert np.abs(a - b).max() <= levels * scale + 1e-6, where
    else:
        assert ref == got, where


# ------------------------------------------------------------ recognised


def test_webp_is_an_image_extension_wherever_jpg_is() -> None:
    # The extensions webdataset hands to its image decoder, exactly.
    assert frozenset(webdataset.autodecode.IMAGE_EXTENSIONS) == IMAGE_EXTENSIONS
    assert "webp" in NATIVE_IMAGE_EXTENSIONS
    for name in ("webp", "x.webp", "WEBP"):
        decode = native_decode_for(name, "torchrgb8")
        assert decode is not None and decode.decoder == _core.FieldDecoder.IMAGE
    assert native_decode_for("webp", "pil") is None  # PIL images stay Pillow's


def test_inspect_probes_webp_members(tmp_path: Path) -> None:
    from chute.kinds import Target
    from chute.kinds.tar import inspect_tar

    url = write_shards(tmp_path, make_samples(True, seed=2, shapes=[(5, 7)]), per_shard=1)[0]
    report = inspect_tar(Target(url))
    fields = report.first_samples[0]["fields"]
    assert {k: fields["webp"][k] for k in ("type", "format", "width", "height")} == {
        "type": "image",
        "format": "webp",
        "width": 7,
        "height": 5,
    }
    assert report.problems == []


# ------------------------------------------------------------ the decoder


@pytest.mark.parametrize("lossless", [True, False], ids=["lossless", "lossy"])
@pytest.mark.parametrize("alpha", [False, True], ids=["rgb", "rgba"])
def test_decode_equals_pillow(lossless: bool, alpha: bool) -> None:
    for i, (h, w) in enumerate(SHAPES):
        data = webp(photo(h, w, i), lossless=lossless, alpha=alpha, seed=i)
        assert _core.probe_image(data) == ("webp", w, h)
        for pil_mode, mode in (("RGB", "rgb"), ("L", "l")):
            expected = np.asarray(Image.open(io.BytesIO(data)).convert(pil_mode))
            got = chute_testing.decode_image(data, mode)
            assert got.shape == expected.shape
            assert diff(got, expected).max() <= bound(lossless), (h, w, mode)


@pytest.mark.parametrize("lossless", [True, False], ids=["lossless", "lossy"])
def test_region_decode_is_pillow_decode_then_crop(lossless: bool) -> None:
    rng = np.random.default_rng(5)
    for alpha in (False, True):
        data = webp(photo(90, 117, 6), lossless=lossless, alpha=alpha, seed=7)
        for mode, pil_mode in (("rgb", "RGB"), ("l", "L")):
            whole = np.asarray(Image.open(io.BytesIO(data)).convert(pil_mode))
            for _ in range(40):
                ch, cw = (int(v) for v in rng.integers(1, (91, 118)))
                y, x = int(rng.integers(0, 91 - ch)), int(rng.integers(0, 118 - cw))
                # Output the crop's own size: the resample is a copy.
                got, scale, decoded = chute_testing.decode_resampled(
                    data, ch, cw, crop=(y, x, ch, cw), region="crop", mode=mode
                )
                expected = whole[y : y + ch, x : x + cw]
                assert diff(got.reshape(expected.shape), expected).max() <= bound(lossless)
                # Only a window around the crop was decoded: a margin of at
                # most 4 pixels on each side, and one more to start even.
                dy, dx, dh, dw = decoded
                assert scale == 8 and dy % 2 == 0 and dx % 2 == 0
                assert dy <= y and dx <= x and y + ch <= dy + dh and x + cw <= dx + dw
                assert dh <= ch + 9 and dw <= cw + 9
                # The same pixels as a whole decode resampled there, exactly.
                full, _, _ = chute_testing.decode_resampled(
                    data, ch, cw, crop=(y, x, ch, cw), region="full", mode=mode
                )
                assert np.array_equal(got, full)


# ------------------------------------------------------------ WebDataset


@pytest.mark.parametrize("spec", SPECS)
def test_image_specs_against_webdataset(shards: Any, spec: str, native_only: None) -> None:
    urls, lossless = shards

    def build(ds: Any) -> Any:
        return ds.decode(spec).to_tuple("webp", "cls", "__key__")

    ref = list(build(webdataset.WebDataset(urls, shardshuffle=False)))
    got = list(build(chute.WebDataset(urls, shardshuffle=False)))
    assert len(got) == len(SHAPES)
    assert_close(ref, got, bound(lossless))


def test_batched_torchrgb8_against_webdataset(tmp_path: Path, native_only: None) -> None:
    # One size per batch, so that webdataset's collation stacks them.
    samples = make_samples(True, seed=8, shapes=[(29, 33)] * 6)
    urls = write_shards(tmp_path, samples, per_shard=6)

    def build(ds: Any) -> Any:
        return ds.decode("torchrgb8").to_tuple("webp", "cls").batched(3)

    ref = list(build(webdataset.WebDataset(urls, shardshuffle=False)))
    got = list(build(chute.WebDataset(urls, shardshuffle=False)))
    assert got[0][0].shape == (3, 3, 29, 33)
    assert_same(ref, got)


def test_tar_dataset_against_webdataset(shards: Any, native_only: None) -> None:
    urls, lossless = shards
    ds = chute.TarDataset(urls, decode="rgb8", fields=("webp", "cls"))
    ref = list(
        webdataset.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("webp", "cls")
    )
    assert len(ds) == len(ref)
    got = [ds[i] for i in range(len(ds))]
    assert_close(ref, got, bound(lossless))


def test_random_resized_crop_and_flip_match_pillow_on_the_window(shards: Any) -> None:
    urls, lossless = shards
    payloads = {s["__key__"]: s["webp"] for s in webdataset.WebDataset(urls, shardshuffle=False)}
    out = (20, 24)
    decode = {"size": out, "crop": "random_resized", "flip": True}
    for spec in ("torchrgb8", "l8"):
        ds = (
            chute.WebDataset(urls, shardshuffle=False, seed=SEED)
            .decode(spec, **decode)
            .to_tuple("webp", "__key__")
            .batched(4)
        )
        ds.set_epoch(0)
        for b, (images, keys) in enumerate(ds):
            for r, key in enumerate(keys):
                data = payloads[key]
                w, h = Image.open(io.BytesIO(data)).size
                where = placement(spec, decode, (h, w), 0, b, r)
                gray = spec == "l8"
                expected = pillow_reference(data, where, out, "L" if gray else "RGB")
                row = np.asarray(images[r])
                if not gray:
                    row = row.transpose(1, 2, 0)
                assert diff(row, expected).max() <= 1 + bound(lossless), (key, where)


def test_eval_resize_center_crop_matches_torchvision(tmp_path: Path) -> None:
    shapes = [(75, 100), (100, 75), (64, 64), (61, 83)]
    for lossless in (True, False):
        samples = make_samples(lossless, seed=9, shapes=shapes)
        urls = write_shards(tmp_path / str(lossless), samples, per_shard=4)
        ds = (
            chute.WebDataset(urls, shardshuffle=False)
            .decode("rgb8", resize=56, size=(48, 48), crop="center")
            .to_tuple("webp")
            .batched(4)
        )
        ((images,),) = list(ds)
        assert images.shape == (4, 48, 48, 3)
        for i, s in enumerate(samples):
            expected = torchvision_resize_center_crop(s["webp"], 56, 48)
            assert diff(images[i], expected).max() <= 1 + bound(lossless)


# ------------------------------------------------------------ errors


def test_corrupt_webp_names_the_member(tmp_path: Path) -> None:
    good = make_samples(True, seed=10, shapes=[(20, 30)] * 4)
    data = good[2]["webp"]
    good[2]["webp"] = data[: len(data) // 2]
    url = write_shards(tmp_path, good, per_shard=4)[0]
    offset = member_offsets(Path(url))[f"{good[2]['__key__']}.webp"]
    ds = chute.WebDataset([url], shardshuffle=False).decode("rgb8").to_tuple("__key__", "webp")
    with pytest.raises(chute.DataError, match="corrupt WebP") as info:
        list(ds)
    assert_names(str(info.value), url, f"member '{good[2]['__key__']}.webp' at offset {offset}")
    # A skipping handler drops that sample only.
    ds = (
        chute.WebDataset([url], shardshuffle=False, handler=chute.wds.ignore_and_continue)
        .decode("rgb8")
        .to_tuple("__key__", "webp")
    )
    assert [k for k, _ in ds] == [good[i]["__key__"] for i in (0, 1, 3)]


def test_animated_webp_is_refused_by_name(tmp_path: Path) -> None:
    frames = [Image.fromarray(photo(16, 16, i)) for i in range(2)]
    out = io.BytesIO()
    frames[0].save(out, format="WEBP", save_all=True, append_images=frames[1:], lossless=True)
    url = write_shards(tmp_path, [{"__key__": "anim", "webp": out.getvalue()}], per_shard=1)[0]
    ds = chute.WebDataset([url], shardshuffle=False).decode("rgb8").to_tuple("webp")
    with pytest.raises(chute.DataError, match="animated WebP is not supported") as info:
        list(ds)
    assert_names(str(info.value), url, "member 'anim.webp'")
    with pytest.raises(chute.DataError, match="animated WebP"):
        chute_testing.decode_image(out.getvalue())


@pytest.mark.parametrize(
    "payload",
    [
        b"RIFF\x00\x00\x00\x00WEBP",
        b"RIFF\x10\x00\x00\x00WEBPVP8 \x04\x00\x00\x00abcd",
        b"RIFF\x10\x00\x00\x00WEBPVP8L\x04\x00\x00\x00abcd",
    ],
)
def test_broken_webp_headers_raise(payload: bytes) -> None:
    with pytest.raises(chute.DataError, match="corrupt WebP header"):
        _core.probe_image(payload, where="member 'k.webp'")
    with pytest.raises(chute.DataError, match="member 'k.webp'"):
        chute_testing.decode_image(payload, where="member 'k.webp'")
