"""Training and evaluation transforms on ``decode`` through the public API:
each output row against Pillow applied to the crop window the engine drew
for it (recovered with the ``chute_testing.image_placement`` diagnostic from the
row's seed, epoch, batch and position), torchvision's Resize + CenterCrop
rebuilt with Pillow, normalisation and dtypes against torch's own
conversions, flips, layouts, PNG and gray images, reproducibility, and the
errors for options that cannot work.

Bounds: where no DCT scaling applies (the crop's box is less than twice the
output on an axis) the engine's output is within 1 of Pillow's
resize(BILINEAR, reducing_gap=None) on every pixel, the resampler's bound
(tests/native/test_transforms.py); with DCT scaling the mean absolute difference
per image is at most 2.0 and the largest at most 16.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import chute
import chute_testing
import numpy as np
import pytest
import torch
from chute import _core
from chute.decoding.image_options import image_options
from chute.stream.native import image_output_spec
from chute.wds.dataset import engine_seed
from conftest import write_shards
from PIL import Image

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

BILINEAR = Image.Resampling.BILINEAR
SEED = 1234
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
OUT = (32, 32)  # images below are at most 63 pixels: no DCT scaling


def photo(h: int, w: int, seed: int, freq: tuple[float, float] = (0.02, 0.2)) -> np.ndarray:
    """Smooth waves (`freq` radians per pixel) plus noise: what a photo
    looks like to a codec."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for _ in range(3):
        a, b, p = rng.uniform(*freq, 3)
        planes.append(127 + 90 * np.sin(a * xx + p) * np.cos(b * yy) + rng.normal(0, 8, (h, w)))
    return np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)


def encode(img: np.ndarray, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    pil = Image.fromarray(img).convert(mode)
    if fmt == "JPEG":
        pil.save(out, format=fmt, quality=90)
    else:
        pil.save(out, format=fmt)
    return out.getvalue()


def make_samples(n: int, seed: int, lo: int = 40, hi: int = 64) -> list[dict[str, Any]]:
    """JPEGs of varied sizes; every fifth a PNG, every seventh a gray JPEG."""
    rng = np.random.default_rng(seed)
    samples: list[dict[str, Any]] = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(lo, hi, 2))
        img = photo(h, w, seed * 1000 + i)
        sample: dict[str, Any] = {"__key__": f"s{seed}-{i:04d}", "cls": i}
        if i % 5 == 0:
            sample["png"] = encode(img, "PNG")
        else:
            sample["jpg"] = encode(img, mode="L" if i % 7 == 0 else "RGB")
        samples.append(sample)
    return samples


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, bytes]]:
    samples = make_samples(40, seed=1)
    urls = write_shards(tmp_path_factory.mktemp("train"), samples, per_shard=15)
    payloads = {str(s["__key__"]): s.get("jpg", s.get("png")) for s in samples}
    return urls, payloads


def batches(
    urls: list[str],
    spec: str = "torchrgb8",
    *,
    threads: int = 1,
    epoch: int = 0,
    batch: int = 8,
    seed: int = SEED,
    loader: bool = True,
    **decode: Any,
) -> list[tuple[Any, list[str]]]:
    """The batches of (images, keys); through chute.DataLoader (which, as
    torch's, turns numpy arrays into tensors) unless `loader` is False."""
    ds = (
        chute.WebDataset(urls, shardshuffle=False, seed=seed)
        .decode(spec, **decode)
        .to_tuple("jpg;png", "__key__")
        .batched(batch)
    )
    ds.set_epoch(epoch)
    if not loader:
        return list(ds.iterate(threads=threads))
    return list(chute.DataLoader(ds, batch_size=None, num_workers=threads))


def placement(
    spec: str, decode: dict[str, Any], shape: tuple[int, int], epoch: int, b: int, r: int
) -> Any:
    """The region, box and flip the engine drew for row r of batch b."""
    opts = image_options(spec, **decode)
    color = _core.ColorMode.GRAY if spec in ("torchl8", "l8") else _core.ColorMode.RGB
    return chute_testing.image_placement(
        image_output_spec(spec, opts),
        color,
        *shape,
        seed=engine_seed(SEED, 0, 0),
        epoch=epoch,
        batch=b,
        row=r,
        field=0,
    )


def pillow_reference(data: bytes, where: Any, out: tuple[int, int], mode: str = "RGB") -> Any:
    """Pillow's crop of the region, resize of the box, then the flip."""
    (ry, rx, rh, rw), (y0, x0, y1, x1), flip = where
    img = Image.open(io.BytesIO(data)).convert(mode).crop((rx, ry, rx + rw, ry + rh))
    box = (x0 - rx, y0 - ry, x1 - rx, y1 - ry)
    result = np.asarray(img.resize((out[1], out[0]), BILINEAR, box=box, reducing_gap=None))
    return result[:, ::-1] if flip else result


def dct_scaled(box: Any, out: tuple[int, int]) -> bool:
    """Whether the engine decodes a JPEG crop with this box at a reduced DCT
    scale: when half the box still covers the output on both axes."""
    y0, x0, y1, x1 = box
    return y1 - y0 >= 2 * out[0] and x1 - x0 >= 2 * out[1]


def image_shape(data: bytes) -> tuple[int, int]:
    w, h = Image.open(io.BytesIO(data)).size
    return h, w


def diff(a: Any, b: Any) -> np.ndarray:
    return np.abs(np.asarray(a).astype(np.int64) - np.asarray(b).astype(np.int64))


def check_against_pillow(
    got: list[tuple[Any, list[str]]],
    payloads: dict[str, bytes],
    spec: str,
    decode: dict[str, Any],
    epoch: int = 0,
) -> list[bool]:
    """Every row within the bounds of Pillow on its window (see the top);
    returns the rows' flips."""
    flips = []
    gray = spec in ("torchl8", "l8")
    for b, (images, keys) in enumerate(got):
        for r, key in enumerate(keys):
            data = payloads[key]
            where = placement(spec, decode, image_shape(data), epoch, b, r)
            flips.append(where[2])
            expected = pillow_reference(data, where, decode["size"], "L" if gray else "RGB")
            row = images[r].numpy()
            if not gray:
                row = row.transpose(1, 2, 0)
            d = diff(row, expected)
            if dct_scaled(where[1], decode["size"]):
                assert d.mean() <= 2.0 and d.max() <= 16, (key, where)
            else:
                assert d.max() <= 1, (key, where)
    return flips


# ------------------------------------------------------------ the crop modes


def test_random_resized_crop_matches_pillow_on_its_window(shards: Any) -> None:
    urls, payloads = shards
    decode = {"size": OUT, "crop": "random_resized"}
    got = batches(urls, **decode)
    assert sum(len(k) for _, k in got) == 40
    assert got[0][0].shape == (8, 3, *OUT) and got[0][0].dtype == torch.uint8
    check_against_pillow(got, payloads, "torchrgb8", decode)
    # The windows vary: area and aspect are drawn, not fixed.
    windows = {
        placement("torchrgb8", decode, image_shape(payloads[k]), 0, b, r)[0]
        for b, (_, keys) in enumerate(got)
        for r, k in enumerate(keys)
    }
    assert len(windows) == 40


def test_random_resized_custom_ranges_and_flip(shards: Any) -> None:
    urls, payloads = shards
    decode = {
        "size": (24, 40),
        "crop": "random_resized",
        "scale": (0.3, 0.6),
        "ratio": (0.5, 2.0),
        "flip": True,
    }
    got = batches(urls, **decode)
    flips = check_against_pillow(got, payloads, "torchrgb8", decode)
    assert 5 <= sum(flips) <= 35
    for b, (_, keys) in enumerate(got):
        for r, k in enumerate(keys):
            h, w = image_shape(payloads[k])
            (_, _, ch, cw), _, _ = placement("torchrgb8", decode, (h, w), 0, b, r)
            # Accepted attempts lie in the ranges (rounding aside); the
            # fallback is the centred clamp of the whole image.
            assert 0.25 <= ch * cw / (h * w) <= 0.65 or (ch, cw) in ((h, w),)


@pytest.mark.parametrize("crop", ["center", "random", "none"])
def test_other_crop_modes_match_pillow(shards: Any, crop: str) -> None:
    urls, payloads = shards
    decode = {"size": (28, 36), "crop": crop, "flip": True}
    check_against_pillow(batches(urls, **decode), payloads, "torchrgb8", decode)


def test_center_crop_is_cover_resize_then_centre(shards: Any) -> None:
    # crop="center" without resize: the shorter side (relative to the output)
    # is resized to the output, the longer rounded, then the centred crop
    # (floor of the half excess), as chute has always done.
    urls, payloads = shards
    (images, keys), *_ = batches(urls, size=(30, 30))
    for r, key in enumerate(keys):
        img = Image.open(io.BytesIO(payloads[key])).convert("RGB")
        w, h = img.size
        nh, nw = (30, (w * 30 + h // 2) // h) if w >= h else ((h * 30 + w // 2) // w, 30)
        resized = img.resize((nw, nh), BILINEAR, reducing_gap=None)
        top, left = (nh - 30) // 2, (nw - 30) // 2
        expected = np.asarray(resized.crop((left, top, left + 30, top + 30)))
        assert diff(images[r].numpy().transpose(1, 2, 0), expected).max() <= 1


def torchvision_resize_center_crop(data: bytes, resize: int, crop: int) -> np.ndarray:
    """torchvision's Resize(resize) then CenterCrop(crop) as documented:
    shorter side to `resize`, the longer int(resize * long / short), PIL
    bilinear (antialiased) resize; the crop at round((size - crop) / 2)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    if w <= h:
        new_w, new_h = resize, int(resize * h / w)
    else:
        new_w, new_h = int(resize * w / h), resize
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), BILINEAR)
    top = int(round((new_h - crop) / 2.0))
    left = int(round((new_w - crop) / 2.0))
    return np.asarray(img.crop((left, top, left + crop, top + crop)))


def test_eval_resize_256_center_crop_224(tmp_path: Path) -> None:
    shapes = [(375, 500), (500, 375), (256, 256), (300, 301), (260, 400), (333, 280)]
    samples = [
        {"__key__": f"e{i}", "jpg": encode(photo(h, w, 50 + i))} for i, (h, w) in enumerate(shapes)
    ]
    urls = write_shards(tmp_path, samples, per_shard=3)
    ds = (
        chute.WebDataset(urls, shardshuffle=False)
        .decode("rgb8", resize=256, size=(224, 224), crop="center")
        .to_tuple("jpg")
        .batched(6)
    )
    ((images,),) = list(ds)
    assert isinstance(images, np.ndarray) and images.shape == (6, 224, 224, 3)
    for i, s in enumerate(samples):
        assert diff(images[i], torchvision_resize_center_crop(s["jpg"], 256, 224)).max() <= 1


def test_dct_scaled_decode_stays_close(tmp_path: Path) -> None:
    # Large images, small output: most crops are decoded at 1/2 or 1/4 scale.
    # The bound is the one tests/native/test_transforms.py states for its images,
    # whose waves (as here) are slow at this size, as a photo's mostly are.
    samples = [
        {"__key__": f"b{i}", "jpg": encode(photo(h, w, 70 + i, freq=(0.005, 0.06)))}
        for i, (h, w) in enumerate([(600, 800), (750, 1000), (800, 600), (512, 512)])
    ]
    urls = write_shards(tmp_path, samples, per_shard=4)
    payloads = {str(s["__key__"]): s["jpg"] for s in samples}
    decode = {"size": (64, 64), "crop": "random_resized"}
    scaled = 0
    for epoch in range(3):
        got = batches(urls, epoch=epoch, batch=4, **decode)
        for b, (images, keys) in enumerate(got):
            for r, key in enumerate(keys):
                where = placement("torchrgb8", decode, image_shape(payloads[key]), epoch, b, r)
                scaled += dct_scaled(where[1], (64, 64))
                expected = pillow_reference(payloads[key], where, (64, 64))
                d = diff(images[r].numpy().transpose(1, 2, 0), expected)
                assert d.mean() <= 2.0 and d.max() <= 16, (key, where)
    assert scaled >= 4
    # The eval crop of a 750x1000 image reads a 656-pixel box: 1/2 scale.
    ds = (
        chute.WebDataset(urls, shardshuffle=False)
        .decode("rgb8", resize=256, size=(224, 224))
        .to_tuple("jpg")
        .batched(4)
    )
    ((images,),) = list(ds)
    for i, s in enumerate(samples):
        d = diff(images[i], torchvision_resize_center_crop(s["jpg"], 256, 224))
        assert d.mean() <= 2.0 and d.max() <= 16


# ------------------------------------------------------------ reproducibility


def test_crops_reproducible_per_seed_and_epoch(shards: Any) -> None:
    urls, _ = shards
    kw: dict[str, Any] = {"size": OUT, "crop": "random_resized", "flip": True}
    first = batches(urls, **kw)
    again = batches(urls, **kw)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    other_epoch = batches(urls, epoch=1, **kw)
    other_seed = batches(urls, seed=SEED + 1, **kw)
    for other in (other_epoch, other_seed):
        differ = sum(
            not torch.equal(a[0][r], b[0][r])
            for a, b in zip(first, other, strict=True)
            for r in range(len(a[1]))
        )
        assert differ >= 35


def test_crops_independent_of_threads(shards: Any) -> None:
    urls, payloads = shards
    decode = {"size": OUT, "crop": "random_resized", "flip": True}
    one = batches(urls, threads=1, epoch=2, **decode)
    three = batches(urls, threads=3, epoch=2, **decode)
    assert [k for _, k in one] == [k for _, k in three]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one, three, strict=True))
    check_against_pillow(three, payloads, "torchrgb8", decode, epoch=2)


def test_crops_independent_of_the_other_samples(tmp_path: Path) -> None:
    # A row's draws depend on its position, not on its neighbours: replacing
    # every other sample (by images of other sizes) leaves the rest as they were.
    base = make_samples(16, seed=3)
    other = make_samples(16, seed=4, lo=20, hi=40)
    mixed = [s if i % 2 == 0 else other[i] for i, s in enumerate(base)]
    a = write_shards(tmp_path / "a", base, per_shard=16)
    b = write_shards(tmp_path / "b", mixed, per_shard=16)
    kw: dict[str, Any] = {"size": OUT, "crop": "random_resized", "flip": True}
    for (ia, ka), (ib, kb) in zip(batches(a, **kw), batches(b, **kw), strict=True):
        for r in range(0, len(ka), 2):
            assert ka[r] == kb[r] and torch.equal(ia[r], ib[r])


# ------------------------------------------------ normalise, dtypes, layouts


def torch_normalize(u8: torch.Tensor, mean: Any, std: Any) -> torch.Tensor:
    """torchvision's ToTensor then Normalize, on a uint8 CHW batch."""
    x = u8.to(torch.float32).div(255)
    m = torch.tensor(mean, dtype=torch.float32)[:, None, None]
    s = torch.tensor(std, dtype=torch.float32)[:, None, None]
    return x.sub_(m).div_(s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, "float16"])
def test_normalize_and_dtypes_equal_torch(shards: Any, dtype: Any) -> None:
    urls, _ = shards
    kw: dict[str, Any] = {"size": OUT, "crop": "random_resized", "flip": True}
    plain = batches(urls, **kw)
    got = batches(urls, dtype=dtype, normalize=(MEAN, STD), **kw)
    want = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    for (u8, _), (x, _) in zip(plain, got, strict=True):
        assert x.dtype == want and x.shape == u8.shape
        assert torch.equal(x, torch_normalize(u8, MEAN, STD).to(want))
    # Without normalize: ToTensor's x / 255.
    scaled = batches(urls, dtype=dtype, **kw)
    for (u8, _), (x, _) in zip(plain, scaled, strict=True):
        assert torch.equal(x, (u8.to(torch.float32) / 255).to(want))


def test_layouts_and_numpy_specs(shards: Any) -> None:
    urls, _ = shards
    kw: dict[str, Any] = {"size": OUT, "crop": "random_resized", "flip": True}
    chw = batches(urls, **kw)
    hwc = batches(urls, layout="HWC", **kw)
    np_chw = batches(urls, "rgb8", loader=False, layout="CHW", **kw)
    np_half = batches(urls, "rgb", loader=False, dtype="float16", normalize=(0.5, 0.25), **kw)
    for (a, _), (b, _), (c, _), (d, _) in zip(chw, hwc, np_chw, np_half, strict=True):
        assert b.shape == (len(a), *OUT, 3)
        assert torch.equal(b.permute(0, 3, 1, 2), a)
        assert isinstance(c, np.ndarray) and np.array_equal(c, a.numpy())
        assert isinstance(d, np.ndarray) and d.dtype == np.float16 and d.shape == b.shape
        expected = torch_normalize(a, (0.5,) * 3, (0.25,) * 3).to(torch.float16)
        assert np.array_equal(d, expected.permute(0, 2, 3, 1).numpy())


def test_no_resize_keeps_pillow_pixels(tmp_path: Path) -> None:
    # Without size: the full decode (Pillow-identical), then flip, layout,
    # type and normalisation on the way into the batch.
    samples = [{"__key__": f"f{i}", "jpg": encode(photo(45, 61, 90 + i))} for i in range(6)]
    samples[2] = {"__key__": "f2", "png": encode(photo(45, 61, 92), "PNG")}
    urls = write_shards(tmp_path, samples, per_shard=6)
    pixels = [
        torch.from_numpy(
            np.array(Image.open(io.BytesIO(s.get("jpg", s.get("png")))).convert("RGB"))
        ).permute(2, 0, 1)
        for s in samples
    ]
    ((images, keys),) = batches(
        urls, batch=6, flip=True, dtype=torch.bfloat16, normalize=(MEAN, STD)
    )
    assert images.shape == (6, 3, 45, 61) and images.dtype == torch.bfloat16
    opts = image_options("torchrgb8", flip=True, dtype=torch.bfloat16, normalize=(MEAN, STD))
    flips = 0
    for r, p in enumerate(pixels):
        _, _, flip = chute_testing.image_placement(
            image_output_spec("torchrgb8", opts),
            _core.ColorMode.RGB,
            45,
            61,
            seed=engine_seed(SEED, 0, 0),
            epoch=0,
            batch=0,
            row=r,
            field=0,
        )
        flips += flip
        src = p.flip(-1) if flip else p
        assert torch.equal(images[r], torch_normalize(src, MEAN, STD).to(torch.bfloat16))
    assert 0 < flips < 6


def test_bfloat16_rows_unbatched_and_torch_batched(shards: Any) -> None:
    urls, _ = shards

    def pipeline() -> Any:
        return (
            chute.WebDataset(urls, shardshuffle=False, seed=SEED)
            .decode("torchrgb8", size=OUT, dtype=torch.bfloat16)
            .to_tuple("jpg;png", "cls")
        )

    rows = list(pipeline())
    assert len(rows) == 40 and all(img.dtype == torch.bfloat16 for img, _ in rows)
    assert rows[0][0].shape == (3, *OUT)
    loaded = list(chute.DataLoader(pipeline(), batch_size=10))
    assert loaded[0][0].dtype == torch.bfloat16 and loaded[0][0].shape == (10, 3, *OUT)
    assert torch.equal(torch.stack([img for img, _ in rows[:10]]), loaded[0][0])


def test_gray_images(shards: Any) -> None:
    urls, payloads = shards
    decode = {"size": (20, 24), "crop": "random_resized", "flip": True}
    got = batches(urls, "torchl8", **decode)
    assert got[0][0].shape == (8, 20, 24)
    check_against_pillow(got, payloads, "torchl8", decode)
    half = batches(urls, "torchl8", dtype=torch.float16, normalize=(0.5, 0.2), **decode)
    for (u8, _), (x, _) in zip(got, half, strict=True):
        expected = ((u8.to(torch.float32) / 255 - 0.5) / 0.2).to(torch.float16)
        assert torch.equal(x, expected)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "spec,kw,match",
    [
        ("torchrgb8", {"size": OUT, "normalize": (MEAN, STD)}, "float output"),
        ("rgb8", {"dtype": torch.bfloat16}, "bfloat16 needs a torch"),
        ("torchrgb8", {"crop": "random_resized"}, "needs size"),
        ("torchrgb8", {"size": OUT, "crop": "diagonal"}, "crop must be"),
        ("torchrgb8", {"size": OUT, "resize": 256, "crop": "none"}, "resize=N goes with"),
        ("torchrgb8", {"size": (224, 224), "resize": 200}, "does not fit"),
        ("torchrgb8", {"size": OUT, "scale": (0.5, 1.0)}, "go with crop"),
        (
            "torchrgb8",
            {"size": OUT, "crop": "random_resized", "scale": (0.9, 0.1)},
            "0 <= min <= max",
        ),
        ("torchrgb8", {"size": OUT, "crop": "random_resized", "ratio": (0, 1)}, "0 < min"),
        ("torchrgb8", {"dtype": torch.int32}, "not an image output type"),
        ("torchrgb8", {"dtype": "half"}, "dtype must be"),
        ("torchrgb8", {"layout": "NCHW"}, "layout must be"),
        ("torchrgb8", {"size": (0, 5)}, "positive"),
        ("torchrgb", {"normalize": ((0.5, 0.5), STD)}, "1 or 3 values"),
        ("torchl8", {"dtype": "float32", "normalize": (MEAN, STD)}, "needs 1 value"),
        ("torchrgb", {"normalize": (MEAN, (1, 0, 1))}, "must not be 0"),
        ("pil", {"size": OUT}, "decodes in Python"),
    ],
)
def test_bad_options_raise(spec: str, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        chute.WebDataset(["x.tar"], shardshuffle=False).decode(spec, **kw)


def test_options_need_an_image_spec() -> None:
    with pytest.raises(ValueError, match="need an image spec"):
        chute.WebDataset(["x.tar"], shardshuffle=False).decode(size=OUT)


def test_options_after_a_python_stage_raise(shards: Any) -> None:
    urls, _ = shards
    ds = (
        chute.WebDataset(urls, shardshuffle=False)
        .map(lambda s: s)
        .decode("torchrgb8", size=OUT)
        .to_tuple("jpg;png")
    )
    with pytest.raises(ValueError, match="engine only"):
        next(iter(ds))
    # A handler callable makes the decode Python's too.
    ds = (
        chute.WebDataset(urls, shardshuffle=False)
        .decode("torchrgb8", lambda key, data: None, size=OUT)
        .to_tuple("jpg;png")
    )
    with pytest.raises(ValueError, match="has handler callables"):
        next(iter(ds))


def test_options_refuse_images_only_python_decodes(tmp_path: Path) -> None:
    ppm = io.BytesIO()
    Image.fromarray(photo(10, 10, 1)).save(ppm, format="PPM")
    sample = {"__key__": "p0", "jpg": encode(photo(40, 40, 2)), "ppm": ppm.getvalue()}
    urls = write_shards(tmp_path, [sample], per_shard=1)
    ds = chute.WebDataset(urls, shardshuffle=False).decode("rgb8", size=OUT)
    with pytest.raises(ValueError, match="'ppm'.*apply to jpeg, jpg, png, webp members only"):
        list(ds)
    # Without image options the ppm member is Pillow's, as in webdataset.
    (row,) = list(chute.WebDataset(urls, shardshuffle=False).decode("rgb8"))
    assert row["ppm"].shape == (10, 10, 3) and row["jpg"].shape == (40, 40, 3)


def test_refusal_is_not_a_decoding_failure_for_the_handler(tmp_path: Path) -> None:
    # A skipping decode handler covers members that fail to decode, not a
    # pipeline that cannot apply its options: every shape of output raises.
    ppm = io.BytesIO()
    Image.fromarray(photo(10, 10, 1)).save(ppm, format="PPM")
    sample = {"__key__": "p0", "jpg": encode(photo(40, 40, 2)), "ppm": ppm.getvalue()}
    urls = write_shards(tmp_path, [sample], per_shard=1)
    for build in (
        lambda ds: ds,
        lambda ds: ds.to_tuple("jpg", "ppm"),
        lambda ds: ds.to_tuple("jpg", "ppm").batched(2),
        lambda ds: ds.batched(2),
    ):
        ds = chute.WebDataset(urls, shardshuffle=False).decode(
            "rgb8", size=OUT, handler=chute.wds.ignore_and_continue
        )
        with pytest.raises(ValueError, match="'ppm'.*apply to jpeg, jpg, png, webp members only"):
            list(build(ds))


def test_options_on_a_decode_that_runs_in_python_raise(shards: Any) -> None:
    urls, payloads = shards
    samples = [{"__key__": "s", "jpg": payloads["s1-0001"]}]
    # A filter called on an iterator, and webdataset's pre/post handler lists.
    with pytest.raises(ValueError, match="engine only"):
        list(chute.wds.decode("torchrgb8", size=OUT)(samples))
    ds = chute.WebDataset(urls, shardshuffle=False).decode(
        "torchrgb8", pre=[lambda key, data: None], size=OUT
    )
    with pytest.raises(ValueError, match="pre/post handlers"):
        next(iter(ds))


def test_bfloat16_in_dict_samples_and_in_batches_that_lose_a_row(tmp_path: Path) -> None:
    samples: list[dict[str, Any]] = [
        {"__key__": f"b{i}", "jpg": encode(photo(40, 48, i)), "json": b'{"i": %d}' % i}
        for i in range(6)
    ]
    samples[3]["json"] = b"{broken"
    urls = write_shards(tmp_path, samples, per_shard=6)

    def pipeline() -> Any:
        return chute.WebDataset(urls, shardshuffle=False, seed=SEED).decode(
            "torchrgb8",
            size=OUT,
            dtype=torch.bfloat16,
            normalize=(MEAN, STD),
            handler=chute.wds.ignore_and_continue,
        )

    rows = list(pipeline())
    assert [r["__key__"] for r in rows] == ["b0", "b1", "b2", "b4", "b5"]
    assert all(r["jpg"].dtype == torch.bfloat16 and r["jpg"].shape == (3, *OUT) for r in rows)
    (batch,) = list(pipeline().to_tuple("jpg", "json").batched(6))
    images, labels = batch
    assert [j["i"] for j in labels] == [0, 1, 2, 4, 5]
    assert images.dtype == torch.bfloat16 and images.shape == (5, 3, *OUT)
    assert torch.equal(images, torch.stack([r["jpg"] for r in rows]))
    (batch,) = list(pipeline().batched(6))
    assert batch["__key__"] == ["b0", "b1", "b2", "b4", "b5"]
    assert torch.equal(batch["jpg"], images)


def test_tardataset_bfloat16_items_and_batches(shards: Any) -> None:
    urls, _ = shards
    opts: dict[str, Any] = {"size": OUT, "dtype": torch.bfloat16, "normalize": (MEAN, STD)}
    expected = [
        img
        for img, _ in chute.WebDataset(urls, shardshuffle=False)
        .decode("torchrgb8", **opts)
        .to_tuple("jpg;png", "cls")
    ]
    for fields in (("jpg;png", "cls"), {"image": "jpg;png", "label": "cls"}):
        ds = chute.TarDataset(urls, decode="torchrgb8", fields=fields, **opts)
        item = ds[3]
        image = item[0] if isinstance(item, tuple) else item["image"]
        assert image.dtype == torch.bfloat16 and torch.equal(image, expected[3])
        batch = next(iter(chute.DataLoader(ds, batch_size=8)))
        images = batch[0] if isinstance(batch, list) else batch["image"]
        assert images.dtype == torch.bfloat16 and torch.equal(images, torch.stack(expected[:8]))
