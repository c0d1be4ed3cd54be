"""The native image kernels through their diagnostic bindings: the resampler
against Pillow and against an exact model of its integer arithmetic, the SIMD
levels against each other, layouts, dtypes and normalisation against torch,
RandomResizedCrop parameters against torchvision's algorithm, the eval crop
against Resize + CenterCrop, and region / DCT-scaled JPEG decoding against a
full decode.

Stated bounds (uint8):
- resample vs Pillow's resize(BILINEAR, reducing_gap=None): max abs diff <= 1,
  mean <= 0.3 (outputs of 64 values or more). Weights are 16-bit fixed point
  (Pillow: 22-bit), and the two passes' order decides how the intermediate
  rounds: Pillow <= 12 and Pillow-SIMD always run the horizontal pass first,
  Pillow 13 switches for some size pairs, chute picks the cheaper order (see
  image/resample.h). Where the orders differ, up to ~20% of the pixels move by 1.
- region decode ("crop"): identical to the full decode.
- DCT-scaled region decode ("scaled") vs Pillow full decode + crop + resize:
  mean abs diff <= 2.0 per image, max <= 16 (measured on the test images:
  1.09 and 7).
"""

from __future__ import annotations

import io
import math
import random
import threading
from typing import Any

import chute_testing
import numpy as np
import pytest
import torch
from chute import _core
from PIL import Image

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

BILINEAR = Image.Resampling.BILINEAR

# ---------------------------------------------------------------- helpers


def noise(h: int, w: int, c: int, seed: int) -> np.ndarray:
    shape = (h, w) if c == 1 else (h, w, c)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def photo(h: int, w: int, c: int, seed: int) -> np.ndarray:
    """Smooth waves plus a little noise: what a photo looks like to a codec."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for _ in range(c):
        a, b, p = rng.uniform(0.005, 0.06, 3)
        planes.append(127 + 90 * np.sin(a * xx + p) * np.cos(b * yy) + rng.normal(0, 8, (h, w)))
    out = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    return out[..., 0] if c == 1 else out


def pil_resize(img: np.ndarray, out_h: int, out_w: int, box: Any = None) -> np.ndarray:
    resized = Image.fromarray(img).resize((out_w, out_h), BILINEAR, box=box, reducing_gap=None)
    return np.asarray(resized)


def encode(img: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **kw: Any) -> bytes:
    pil = Image.fromarray(img)
    if mode is not None:
        pil = pil.convert(mode)
    out = io.BytesIO()
    pil.save(out, format=fmt, **kw)
    return out.getvalue()


def pil_decode(data: bytes, mode: str = "RGB") -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def simd_levels() -> list[str]:
    order = ["scalar", "sse4.1", "avx2"]
    return order[: order.index(chute_testing.simd_level()) + 1]


def diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.int64) - b.astype(np.int64))


# -------------------------------------------- the integer algorithm, in Python


def model_taps(in_size: int, in0: float, in1: float, out: int) -> tuple[list[Any], int]:
    """Pillow's bilinear taps (precompute_coeffs), in the same floating-point
    steps as the C++, quantized at the highest precision <= 22 bits at which
    the largest weight fits an int16."""
    scale = (in1 - in0) / out
    fs = max(scale, 1.0)
    inv = 1.0 / fs
    taps = []
    max_w = 0.0
    for o in range(out):
        center = in0 + (o + 0.5) * scale
        lo = max(0, int(center - fs + 0.5))
        hi = min(in_size, int(center + fs + 0.5))
        w = [max(0.0, 1.0 - abs(((i + lo) - center + 0.5) * inv)) for i in range(hi - lo)]
        total = 0.0
        for v in w:
            total += v
        w = [v / total for v in w]
        max_w = max(max_w, *w)
        taps.append((lo, w))
    precision = 22
    while precision > 1 and int(0.5 + max_w * (1 << precision)) > 32767:
        precision -= 1
    return [(lo, [int(0.5 + v * (1 << precision)) for v in w]) for lo, w in taps], precision


def model_pass(rows: np.ndarray, taps: list[Any], precision: int) -> np.ndarray:
    """One pass along axis 1 of an (N, M[, C]) array, rounded to uint8."""
    out = np.empty((rows.shape[0], len(taps), *rows.shape[2:]), np.uint8)
    for o, (lo, w) in enumerate(taps):
        acc = np.full(rows[:, 0].shape, 1 << (precision - 1), np.int64)
        for k, wk in enumerate(w):
            acc += wk * rows[:, lo + k].astype(np.int64)
        out[:, o] = np.clip(acc >> precision, 0, 255)
    return out


def model_resample(
    img: np.ndarray,
    out_h: int,
    out_w: int,
    region: tuple[int, int, int, int],
    box: Any,
    order: str = "horizontal",
) -> np.ndarray:
    """The resampler's exact output: region (y, x, h, w) readable, box
    (y0, x0, y1, x1) in image pixels, `order` the pass that runs first."""
    y, x, h, w = region
    src = img[y : y + h, x : x + w]
    tx, px = model_taps(w, box[1] - x, box[3] - x, out_w)
    ty, py = model_taps(h, box[0] - y, box[2] - y, out_h)

    def vertical(a: np.ndarray) -> np.ndarray:
        return model_pass(a.swapaxes(0, 1), ty, py).swapaxes(0, 1)

    if order == "horizontal":
        return vertical(model_pass(src, tx, px))
    return model_pass(vertical(src), tx, px)


ORDERS = ("horizontal", "vertical")


# ------------------------------------------------------------------ resample

RESIZES = [
    ((375, 500), (224, 224)),
    ((224, 224), (375, 500)),
    ((64, 64), (32, 32)),
    ((50, 37), (13, 29)),
    ((7, 9), (40, 30)),
    ((31, 17), (31, 17)),
    ((31, 17), (62, 33)),
    ((300, 300), (299, 301)),
    ((1, 1), (1, 1)),
    ((1, 1), (4, 5)),
    ((4, 4), (1, 1)),
    ((1, 50), (3, 7)),
    ((100, 3), (5, 5)),
    ((13, 1000), (1, 1)),
    ((2000, 3), (1, 2)),
    ((3, 700), (300, 1)),
]


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("src,dst", RESIZES)
def test_resize_close_to_pillow(channels: int, src: tuple[int, int], dst: tuple[int, int]) -> None:
    for seed, make in enumerate((noise, photo)):
        img = make(*src, channels, seed)
        got = chute_testing.resize(img, *dst)
        assert got.shape == pil_resize(img, *dst).shape
        d = diff(got, pil_resize(img, *dst))
        assert d.max() <= 1
        if d.size >= 64:  # a mean over a handful of values bounds nothing
            assert d.mean() <= 0.3


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("src,dst", RESIZES)
def test_resize_is_the_integer_algorithm(
    channels: int, src: tuple[int, int], dst: tuple[int, int]
) -> None:
    img = noise(*src, channels, seed=3)
    h, w = src
    expected = {o: model_resample(img, *dst, (0, 0, h, w), (0, 0, h, w), o) for o in ORDERS}
    for simd in simd_levels():
        for order in ORDERS:
            got = chute_testing.resize(img, *dst, simd=simd, order=order)
            assert np.array_equal(got, expected[order]), (simd, order)
    # The automatic choice is one of the two.
    auto = chute_testing.resize(img, *dst)
    assert any(np.array_equal(auto, e) for e in expected.values())


def test_simd_levels_agree_on_random_geometry() -> None:
    # Every kernel (and its scalar tail for pixels near the right edge) on
    # random sizes, crops, boxes and flips.
    rng = np.random.default_rng(11)
    levels = simd_levels()
    for _ in range(150):
        h, w = (int(v) for v in rng.integers(1, 90, 2))
        c = int(rng.choice([1, 3]))
        img = noise(h, w, c, int(rng.integers(1 << 30)))
        y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
        ch, cw = int(rng.integers(1, h - y + 1)), int(rng.integers(1, w - x + 1))
        out_h, out_w = (int(v) for v in rng.integers(1, 120, 2))
        flip = bool(rng.integers(2))
        order = str(rng.choice(ORDERS))
        box = None
        if rng.integers(2):
            y0, y1 = sorted(rng.uniform(y, y + ch, 2))
            x0, x1 = sorted(rng.uniform(x, x + cw, 2))
            if y1 - y0 > 1e-3 and x1 - x0 > 1e-3:
                box = (float(y0), float(x0), float(y1), float(x1))
        results = [
            chute_testing.resize(
                img, out_h, out_w, crop=(y, x, ch, cw), box=box, flip=flip, simd=s, order=order
            )
            for s in levels
        ]
        for r in results[1:]:
            assert np.array_equal(r, results[0])
        by_box = box or (y, x, y + ch, x + cw)
        expected = model_resample(img, out_h, out_w, (y, x, ch, cw), by_box, order)
        assert np.array_equal(results[0], expected[:, ::-1] if flip else expected)


@pytest.mark.parametrize("channels", [1, 3])
def test_crop_then_resize_close_to_pillow(channels: int) -> None:
    img = photo(120, 160, channels, seed=5)
    for y, x, h, w, out in [
        (0, 0, 120, 160, (64, 64)),
        (10, 20, 50, 90, (64, 64)),
        (119, 159, 1, 1, (3, 3)),
        (5, 7, 100, 3, (20, 20)),
        (33, 0, 87, 160, (224, 224)),
    ]:
        expected = pil_resize(np.ascontiguousarray(img[y : y + h, x : x + w]), *out)
        got = chute_testing.resize(img, *out, crop=(y, x, h, w))
        assert diff(got, expected).max() <= 1
        # The crop's edges clamp the filter: the pixels outside do not leak in.
        poisoned = img.copy()
        poisoned[:y] = poisoned[y + h :] = 0
        poisoned[:, :x] = poisoned[:, x + w :] = 255
        assert np.array_equal(chute_testing.resize(poisoned, *out, crop=(y, x, h, w)), got)


def test_box_close_to_pillow_box() -> None:
    # Fractions of 1/8 are exact in float32, the type Pillow takes the box in.
    img = photo(90, 130, 3, seed=6)
    for y0, x0, y1, x1, out in [
        (0.0, 0.0, 90.0, 130.0, (45, 60)),
        (10.5, 3.25, 70.125, 100.0, (32, 48)),
        (0.125, 120.5, 89.875, 130.0, (100, 7)),
        (44.0, 60.0, 45.0, 61.0, (5, 5)),
    ]:
        expected = pil_resize(img, *out, box=(x0, y0, x1, y1))
        got = chute_testing.resize(img, *out, box=(y0, x0, y1, x1))
        assert diff(got, expected).max() <= 1


def test_flip_mirrors_the_output() -> None:
    for c in (1, 3):
        img = noise(37, 53, c, seed=c)
        for out in [(37, 53), (20, 31), (80, 90), (30, 41)]:
            for order in ORDERS:
                plain = chute_testing.resize(img, *out, crop=(2, 3, 30, 41), order=order)
                flipped = chute_testing.resize(
                    img, *out, crop=(2, 3, 30, 41), flip=True, order=order
                )
                assert np.array_equal(flipped, plain[:, ::-1])


def test_pure_crop_copies_pixels() -> None:
    img = noise(40, 50, 3, seed=8)
    for order in ("auto", *ORDERS):
        got = chute_testing.resize(img, 20, 30, crop=(5, 6, 20, 30), order=order)
        assert np.array_equal(got, img[5:25, 6:36])
        got = chute_testing.resize(img, 20, 30, crop=(5, 6, 20, 30), flip=True, order=order)
        assert np.array_equal(got, img[5:25, 6:36][:, ::-1])


def test_taps_cache_keeps_results() -> None:
    # More size pairs than the per-thread cache holds, twice over: evicted and
    # rebuilt tables must give the same pixels.
    img = noise(97, 89, 3, seed=9)
    sizes = [(a, b) for a in (13, 50, 97, 150) for b in (7, 89, 200)]
    first = [chute_testing.resize(img, *s) for s in sizes]
    for _ in range(2):
        for s, expected in zip(sizes, first, strict=True):
            assert np.array_equal(chute_testing.resize(img, *s), expected)


def test_threads_agree() -> None:
    img = photo(200, 300, 3, seed=10)
    sizes = [(224, 224), (64, 96), (300, 17), (13, 400)]
    expected = {s: chute_testing.resize(img, *s) for s in sizes}
    failures: list[tuple[int, int]] = []

    def work() -> None:
        for _ in range(5):
            for s in sizes:
                if not np.array_equal(chute_testing.resize(img, *s), expected[s]):
                    failures.append(s)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


# ---------------------------------------------------------- layout and dtypes

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def torch_float(hwc: np.ndarray, normalize: bool) -> torch.Tensor:
    """torchvision's ToTensor() (then Normalize(MEAN, STD)) of a uint8 HWC image."""
    t = torch.from_numpy(np.ascontiguousarray(hwc)).permute(2, 0, 1).contiguous()
    t = t.to(torch.float32).div(255)
    if normalize:
        mean = torch.as_tensor(MEAN, dtype=torch.float32).view(-1, 1, 1)
        std = torch.as_tensor(STD, dtype=torch.float32).view(-1, 1, 1)
        t.sub_(mean).div_(std)
    return t


def test_chw_is_hwc_transposed() -> None:
    img = noise(45, 67, 3, seed=12)
    for dtype in ("uint8", "float32", "float16", "bfloat16"):
        hwc = chute_testing.resize(img, 31, 47, dtype=dtype)
        chw = chute_testing.resize(img, 31, 47, layout="CHW", dtype=dtype)
        assert chw.shape == (3, 31, 47)
        assert np.array_equal(chw, hwc.transpose(2, 0, 1))


@pytest.mark.parametrize("normalize", [False, True])
def test_float_outputs_equal_torch(normalize: bool) -> None:
    img = photo(60, 80, 3, seed=13)
    u8 = chute_testing.resize(img, 33, 41, flip=True)
    ref = torch_float(u8, normalize)
    kw: dict[str, Any] = {"mean": MEAN, "std": STD} if normalize else {}
    f32 = chute_testing.resize(img, 33, 41, flip=True, layout="CHW", dtype="float32", **kw)
    assert f32.dtype == np.float32
    assert np.array_equal(f32.view(np.uint32), ref.numpy().view(np.uint32))
    f16 = chute_testing.resize(img, 33, 41, flip=True, layout="CHW", dtype="float16", **kw)
    assert f16.dtype == np.float16
    assert np.array_equal(f16.view(np.uint16), ref.to(torch.float16).numpy().view(np.uint16))
    bf16 = chute_testing.resize(img, 33, 41, flip=True, layout="CHW", dtype="bfloat16", **kw)
    assert bf16.dtype == np.uint16
    expected = ref.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bf16, expected)


@pytest.mark.parametrize("shape", [(16, 16), (2, 128), (3, 100), (1, 300)])
def test_every_byte_value_converts_like_torch(shape: tuple[int, int]) -> None:
    # All 256 values in every channel, through the identity resample; the
    # widths cross the float writes' 64-value blocks and end inside one.
    h, w = shape
    every = (np.arange(h * w) * 7 % 256).astype(np.uint8).reshape(h, w)
    img = np.stack([every, 255 - every, every * 3], -1)
    for kw in ({}, {"mean": MEAN, "std": STD}):
        ref = torch_float(img, bool(kw))
        for dtype, torch_dtype, view in (
            ("float32", torch.float32, np.uint32),
            ("float16", torch.float16, np.uint16),
        ):
            got = chute_testing.resize(img, h, w, layout="CHW", dtype=dtype, **kw)
            assert np.array_equal(got.view(view), ref.to(torch_dtype).numpy().view(view))
        got = chute_testing.resize(img, h, w, layout="CHW", dtype="bfloat16", **kw)
        assert np.array_equal(got, ref.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("channels", [1, 3])
def test_float_writes_equal_the_per_value_loop(dtype: str, channels: int) -> None:
    # The vector lookup (where the CPU has it; CHW planes and gray rows)
    # against the plain loop that simd="scalar" keeps to, on widths around
    # the 64-value block.
    for width in (1, 63, 64, 65, 200):
        img = noise(5, width, channels, seed=width)
        kw: dict[str, Any] = {"mean": MEAN[:channels], "std": STD[:channels]}
        got = chute_testing.resize(img, 5, width, layout="CHW", dtype=dtype, **kw)
        plain = chute_testing.resize(img, 5, width, layout="CHW", dtype=dtype, simd="scalar", **kw)
        bits = np.uint32 if dtype == "float32" else np.uint16
        assert np.array_equal(got.view(bits), plain.view(bits)), width


def test_gray_float_and_normalisation() -> None:
    img = noise(20, 30, 1, seed=14)
    u8 = chute_testing.resize(img, 10, 15)
    got = chute_testing.resize(img, 10, 15, dtype="float32", mean=[0.5], std=[0.25], layout="CHW")
    assert got.shape == (10, 15)
    expected = (torch.from_numpy(u8).float().div(255) - 0.5) / 0.25
    assert np.array_equal(got.view(np.uint32), expected.numpy().view(np.uint32))


def test_bad_arguments() -> None:
    img = noise(10, 10, 3, seed=15)
    with pytest.raises(ValueError, match="float output"):
        chute_testing.resize(img, 5, 5, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="one value per channel"):
        chute_testing.resize(img, 5, 5, dtype="float32", mean=[0.5], std=[0.5])
    with pytest.raises(ValueError, match="non-zero"):
        chute_testing.resize(img, 5, 5, dtype="float32", mean=MEAN, std=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="does not fit"):
        chute_testing.resize(img, 5, 5, crop=(5, 5, 6, 5))
    with pytest.raises(ValueError, match="not inside"):
        chute_testing.resize(img, 5, 5, box=(0.0, 0.0, 10.5, 10.0))
    with pytest.raises(ValueError, match="resample to"):
        chute_testing.resize(img, 0, 5)
    with pytest.raises(ValueError, match="layout"):
        chute_testing.resize(img, 5, 5, layout="NCHW")
    with pytest.raises(ValueError, match="dtype"):
        chute_testing.resize(img, 5, 5, dtype="float64")
    with pytest.raises(ValueError, match="HWC"):
        chute_testing.resize(np.zeros((4, 4, 2), np.uint8), 5, 5)


# ------------------------------------------------------- RandomResizedCrop


def torchvision_get_params(
    rng: random.Random, height: int, width: int, scale: Any, ratio: Any
) -> tuple[int, int, int, int]:
    """RandomResizedCrop.get_params, step by step, on Python's generator."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


RRC_CASES = [
    (375, 500, (0.08, 1.0), (3 / 4, 4 / 3)),
    (500, 375, (0.08, 1.0), (3 / 4, 4 / 3)),
    (64, 64, (0.08, 1.0), (3 / 4, 4 / 3)),
    (100, 400, (0.5, 1.0), (0.2, 5.0)),  # frequent rejections and fallbacks
    (9, 7, (0.3, 0.6), (0.5, 2.0)),  # small: rounding dominates
]


@pytest.mark.parametrize("height,width,scale,ratio", RRC_CASES)
def test_rrc_distribution_matches_torchvision(
    height: int, width: int, scale: Any, ratio: Any
) -> None:
    n = 20000
    ours = chute_testing.rrc_params(height, width, scale, ratio, seed=1234, count=n)
    rng = random.Random(99)
    ref = np.array([torchvision_get_params(rng, height, width, scale, ratio) for _ in range(n)])
    assert ours.shape == (n, 4)
    y, x, h, w = ours.T
    assert (h >= 1).all() and (w >= 1).all() and (y + h <= height).all() and (x + w <= width).all()

    def features(p: np.ndarray) -> dict[str, np.ndarray]:
        y, x, h, w = (p[:, i].astype(np.float64) for i in range(4))
        return {
            "area": h * w / (height * width),
            "log_aspect": np.log(w / h),
            "h": h,
            "w": w,
            # Position within the free range (0.5 when there is none).
            "top": np.where(h < height, y / np.maximum(height - h, 1), 0.5),
            "left": np.where(w < width, x / np.maximum(width - w, 1), 0.5),
        }

    fo, fr = features(ours), features(ref)
    for name in fo:
        # Two samples of 20000 from one distribution: KS D > 0.03 has p < 1e-6.
        assert ks_statistic(fo[name], fr[name]) < 0.03, name
    # Both ends of the inclusive position range occur where the range is small.
    if height <= 16:
        free = ours[:, 2] < height
        assert (ours[free, 0] == height - ours[free, 2]).any() and (ours[free, 0] == 0).any()


@pytest.mark.parametrize(
    "height,width,scale,ratio",
    [
        (1, 1, (0.08, 1.0), (3 / 4, 4 / 3)),  # every outcome is the whole pixel
        (1, 1000, (0.08, 1.0), (3 / 4, 4 / 3)),  # every attempt too tall
        (1000, 1, (0.08, 1.0), (3 / 4, 4 / 3)),  # every attempt too wide
        (100, 100, (0.9, 1.0), (10.0, 20.0)),  # ratio range beyond the image
        (10, 5, (0.0, 0.0), (2.0, 3.0)),  # zero area; fallback rounds 2.5 to 2
        (7, 3, (0.0, 0.0), (0.1, 0.2)),  # zero area; image ratio above the range
        (6, 8, (0.0, 0.0), (1.0, 2.0)),  # zero area; image ratio inside the range
    ],
)
def test_rrc_degenerate_cases_are_exact(height: int, width: int, scale: Any, ratio: Any) -> None:
    ours = chute_testing.rrc_params(height, width, scale, ratio, seed=5, count=200)
    rng = random.Random(5)
    expected = {torchvision_get_params(rng, height, width, scale, ratio) for _ in range(200)}
    assert len(expected) == 1  # deterministic outcome
    assert {tuple(int(v) for v in row) for row in ours} == expected


def test_rrc_fallback_side_is_at_least_one_pixel() -> None:
    # torchvision would return an empty crop here (round(1 / 3) == 0).
    got = chute_testing.rrc_params(10, 1, (0.0, 0.0), (3.0, 4.0), seed=0, count=1)
    assert got.tolist() == [[4, 0, 1, 1]]


def test_rrc_is_reproducible() -> None:
    a = chute_testing.rrc_params(375, 500, seed=7, count=100)
    assert np.array_equal(a, chute_testing.rrc_params(375, 500, seed=7, count=100))
    assert not np.array_equal(a, chute_testing.rrc_params(375, 500, seed=8, count=100))


def test_rrc_rejects_bad_ranges() -> None:
    with pytest.raises(ValueError, match="scale"):
        chute_testing.rrc_params(10, 10, (1.0, 0.5), (0.75, 1.33))
    with pytest.raises(ValueError, match="ratio"):
        chute_testing.rrc_params(10, 10, (0.08, 1.0), (0.0, 1.0))
    with pytest.raises(ValueError, match="ratio"):
        chute_testing.rrc_params(10, 10, (0.08, 1.0), (2.0, 1.0))


# ------------------------------------------------- Resize + CenterCrop (eval)


def torchvision_resize_center_crop(img: np.ndarray, size: int, crop: int) -> np.ndarray:
    """Resize(size) then CenterCrop(crop) on a PIL image, as torchvision computes them."""
    h, w = img.shape[:2]
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    resized = Image.fromarray(img)
    if (new_h, new_w) != (h, w):
        resized = resized.resize((new_w, new_h), BILINEAR)
    top = int(round((new_h - crop) / 2.0))
    left = int(round((new_w - crop) / 2.0))
    return np.asarray(resized.crop((left, top, left + crop, top + crop)))


@pytest.mark.parametrize(
    "shape,size,crop",
    [
        ((375, 500), 256, 224),
        ((500, 375), 256, 224),
        ((256, 256), 256, 224),
        ((256, 300), 256, 224),
        ((100, 177), 64, 64),  # (113 - 64) / 2 = 24.5 rounds to 24
        ((100, 179), 64, 64),  # (114 - 64) / 2 = 25
        ((1000, 30), 28, 24),
        ((60, 61), 200, 199),  # upscaling
    ],
)
def test_eval_area_matches_resize_then_center_crop(
    shape: tuple[int, int], size: int, crop: int
) -> None:
    img = photo(*shape, 3, seed=16)
    region, box = chute_testing.center_crop_area(*shape, size, crop, crop)
    assert region == (0, 0, *shape)
    got = chute_testing.resize(img, crop, crop, box=box)
    expected = torchvision_resize_center_crop(img, size, crop)
    assert diff(got, expected).max() <= 1


def test_eval_crop_offset_rounds_half_to_even() -> None:
    # 100x177 -> Resize(64) is 64x113; the crop starts at round(24.5) == 24.
    _, box = chute_testing.center_crop_area(100, 177, 64, 64, 64)
    assert box[1] == pytest.approx(24 * 177 / 113)
    _, box = chute_testing.center_crop_area(100, 179, 64, 64, 64)
    assert box[1] == pytest.approx(25 * 179 / 114)


def test_eval_crop_larger_than_resized_is_refused() -> None:
    with pytest.raises(ValueError, match="pad"):
        chute_testing.center_crop_area(100, 100, 200, 224, 224)


# --------------------------------------------------------- region decoding


def jpeg_variants(img: np.ndarray) -> dict[str, bytes]:
    return {
        "444": encode(img, quality=90, subsampling=0),
        "422": encode(img, quality=90, subsampling=1),
        "420": encode(img, quality=90, subsampling=2),
        "progressive": encode(img, quality=85, progressive=True),
        "gray": encode(img, mode="L", quality=90),
        "cmyk": encode(img, mode="CMYK", quality=90),
    }


def random_crops(h: int, w: int, n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    crops = [(0, 0, h, w), (h - 1, w - 1, 1, 1), (0, w - 1, h, 1)]
    for _ in range(n):
        y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
        crops.append((y, x, int(rng.integers(1, h - y + 1)), int(rng.integers(1, w - x + 1))))
    return crops


@pytest.mark.parametrize("order", ORDERS)
def test_streamed_rows_equal_whole_image(order: str) -> None:
    # The decoder hands rows over a few at a time (libjpeg's row groups); the
    # resample of that stream equals the resample of the whole decoded image.
    img = photo(203, 301, 3, seed=24)
    for name, data in jpeg_variants(img).items():
        for mode, pil_mode in (("rgb", "RGB"), ("l", "L")):
            decoded = pil_decode(data, pil_mode)
            for crop in random_crops(203, 301, n=5, seed=25):
                for out in [(17, 29), (150, 150), (crop[2], max(1, crop[3] // 3))]:
                    got, _, _ = chute_testing.decode_resampled(
                        data, *out, crop=crop, region="full", mode=mode, order=order
                    )
                    expected = chute_testing.resize(decoded, *out, crop=crop, order=order)
                    assert np.array_equal(got, expected), (name, mode, crop, out)


@pytest.mark.parametrize("shape", [(333, 517), (64, 48), (17, 33), (1, 1)])
def test_region_decode_equals_full_decode(shape: tuple[int, int]) -> None:
    img = photo(*shape, 3, seed=17)
    for name, data in jpeg_variants(img).items():
        for crop in random_crops(*shape, n=6, seed=shape[0]):
            for out in [(crop[2], crop[3]), (24, 31)]:
                for mode in ("rgb", "l"):
                    full, m, window = chute_testing.decode_resampled(
                        data, *out, crop=crop, region="full", mode=mode
                    )
                    assert m == 8 and window == (0, 0, *shape)
                    part, m, _ = chute_testing.decode_resampled(
                        data, *out, crop=crop, region="crop", mode=mode
                    )
                    assert m == 8
                    assert np.array_equal(part, full), (name, crop, out, mode)


def test_full_size_path_is_pillow_identical() -> None:
    img = photo(75, 101, 3, seed=18)
    for name, data in jpeg_variants(img).items():
        for mode, pil_mode in (("rgb", "RGB"), ("l", "L")):
            ref = pil_decode(data, pil_mode)
            for region in ("full", "crop", "scaled"):
                got, m, _ = chute_testing.decode_resampled(data, 75, 101, region=region, mode=mode)
                assert m == 8
                assert np.array_equal(got, ref), (name, mode, region)


def test_region_decode_reads_only_what_it_keeps() -> None:
    img = photo(400, 600, 3, seed=19)
    data = encode(img, quality=90)
    # A crop in the top-left: rows below it and iMCU columns right of it stay undecoded.
    _, m, (y, x, h, w) = chute_testing.decode_resampled(
        data, 50, 50, crop=(30, 40, 100, 120), region="crop"
    )
    assert m == 8 and y == 30 and h == 100 and x <= 36 and x % 16 == 0 and x + w < 600
    # At 1/8 scale the crop of the whole image is 50x75 pixels, still >= 40x60.
    _, m, window = chute_testing.decode_resampled(data, 40, 60, region="scaled")
    assert m == 1 and window == (0, 0, 50, 75)


def test_scaled_region_decode_close_to_full_decode() -> None:
    stats = []
    for shape, out in [((375, 500), (224, 224)), ((1000, 750), (224, 224)), ((600, 800), (64, 64))]:
        img = photo(*shape, 3, seed=shape[1])
        for sub in (0, 2):
            data = encode(img, quality=90, subsampling=sub)
            full = pil_decode(data)
            crops = chute_testing.rrc_params(*shape, seed=sub, count=12).tolist()
            crops.append([0, 0, *shape])
            for y, x, h, w in crops:
                got, m, _ = chute_testing.decode_resampled(
                    data, *out, crop=(y, x, h, w), region="scaled"
                )
                ref = pil_resize(np.ascontiguousarray(full[y : y + h, x : x + w]), *out)
                d = diff(got, ref)
                assert d.mean() <= 2.0 and d.max() <= 16, (shape, sub, (y, x, h, w), m)
                stats.append(m)
    # The bound was checked where the scale is reduced, not only at 8/8.
    assert sum(m < 8 for m in stats) >= 20 and min(stats) <= 2


def test_scaled_eval_decode_close_to_resize_center_crop() -> None:
    # The crop's preimage is 656 pixels square: decoded at 4/8.
    img = photo(750, 1000, 3, seed=20)
    data = encode(img, quality=90)
    region, box = chute_testing.center_crop_area(750, 1000, 256, 224, 224)
    got, m, _ = chute_testing.decode_resampled(
        data, 224, 224, crop=region, box=box, region="scaled"
    )
    assert m == 4
    d = diff(got, torchvision_resize_center_crop(pil_decode(data), 256, 224))
    assert d.mean() <= 2.0 and d.max() <= 16
    exact, _, _ = chute_testing.decode_resampled(
        data, 224, 224, crop=region, box=box, region="crop"
    )
    assert diff(exact, torchvision_resize_center_crop(pil_decode(data), 256, 224)).max() <= 1


def test_decode_options_are_the_resample_options() -> None:
    img = photo(120, 90, 3, seed=21)
    data = encode(img, quality=90)
    decoded = pil_decode(data)
    for region in ("full", "crop"):
        for kw in (
            {"flip": True, "layout": "CHW", "dtype": "float32", "mean": MEAN, "std": STD},
            {"flip": True, "dtype": "float16"},
            {"layout": "CHW", "dtype": "bfloat16"},
        ):
            got, _, _ = chute_testing.decode_resampled(
                data, 50, 40, crop=(10, 5, 100, 70), region=region, **kw
            )
            expected = chute_testing.resize(decoded, 50, 40, crop=(10, 5, 100, 70), **kw)
            assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_png_decodes_whole_then_resamples() -> None:
    img = noise(40, 60, 3, seed=22)
    data = encode(img, fmt="PNG")
    expected = chute_testing.resize(img, 20, 25, crop=(3, 4, 30, 50))
    for region in ("full", "crop", "scaled"):
        got, m, window = chute_testing.decode_resampled(
            data, 20, 25, crop=(3, 4, 30, 50), region=region
        )
        assert m == 8 and window == (0, 0, 40, 60)
        assert np.array_equal(got, expected)


def test_region_decode_errors() -> None:
    img = photo(64, 64, 3, seed=23)
    data = encode(img, quality=90)
    for region in ("full", "crop", "scaled"):
        with pytest.raises(ValueError, match="does not fit"):
            chute_testing.decode_resampled(data, 10, 10, crop=(60, 0, 10, 10), region=region)
    # Cut inside the rows the crop needs: a data error in every mode.
    cut = data[: len(data) // 3]
    for region in ("full", "crop", "scaled"):
        with pytest.raises(_core.DataError, match="<bytes>"):
            chute_testing.decode_resampled(cut, 10, 10, crop=(40, 0, 24, 64), region=region)
    with pytest.raises(_core.DataError, match="not a JPEG, PNG or WebP"):
        chute_testing.decode_resampled(b"GIF89a....", 10, 10)
