"""Training and evaluation transforms: chute against torch DataLoader +
webdataset + Pillow, and against this machine's full-size decode limit.

Data: 500x375 JPEGs (quality 90, 4:2:0) + `cls`, seeded, in 8 shards. The
pictures are synthetic but have the statistics that matter to a JPEG codec
and a resampler: a 1/f^1.2 amplitude spectrum with random phases (the power
spectrum of natural images falls as about 1/f^2), a luminance field plus
smoother, weaker chroma fields, a few blended ellipses and polygons with sharp edges,
and a little sensor noise.

Jobs (issue 12), batches of 256 float16 CHW tensors:
- train: RandomResizedCrop(224) (scale (0.08, 1), ratio (3/4, 4/3)) +
  RandomHorizontalFlip + ToTensor + Normalize(ImageNet mean/std).
- eval: Resize(256) + CenterCrop(224) + ToTensor + Normalize.
chute: ``decode("torchrgb8", size=(224, 224), crop="random_resized",
flip=True, normalize=..., dtype=torch.float16)`` (train) or ``resize=256,
size=(224, 224), crop="center"`` (eval) on ``chute.DataLoader``
(num_workers = the cores, as threads). The baseline: webdataset's
``decode("pil")`` and torchvision's transforms rebuilt with Pillow and torch
(torchvision is not installed here; its algorithms are written out below),
converted to float16 per sample, ``batched(256)``, on torch's DataLoader with
the best of num_workers 0, 1, 2.

The decode limit is libjpeg-turbo decoding the same files at full size
(``chute._core._decode_loop``, a C++ loop from memory into one buffer) on
one thread, times the cores; it is measured before the first chute run and
after each, and each run is compared with the mean of the rounds on its two
sides (as in bench_wds.py). Region and DCT-scaled decoding do less work than
a full decode, so chute can exceed it.

The ``.map(normalise)`` job with CPU hogs (issue 12's job (c)) needs process
workers and is not measured here; it joins ``JOBS`` below when they exist.

    python benchmarks/bench_transforms.py           # 3,000 images
    python benchmarks/bench_transforms.py --quick   # 600
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_wds import (  # noqa: E402
    _write,
    concurrent_decode_round,
    decode_limit_round,
    jpeg_payloads,
)
from common import current_rss, run_config, save, table  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
HEIGHT, WIDTH = 375, 500
BATCH = 256
CROP = 224
RESIZE = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
JOBS = ("train", "eval")
# The decode limit decodes this many of the files per pass (a pass over all
# of them would take seconds on one thread).
LIMIT_IMAGES = 300


# ---------------------------------------------------------------- data


def natural_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A synthetic picture with a natural image's spectrum, edges and noise."""
    from PIL import Image, ImageDraw

    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.hypot(fy, fx)
    f[0, 0] = 1.0

    def pink(exponent: float) -> np.ndarray:
        phase = rng.uniform(0, 2 * np.pi, f.shape)
        field = np.fft.irfft2(f**-exponent * np.exp(1j * phase), s=(h, w))
        return (field - field.mean()) / field.std()

    # Chroma varies more slowly than luminance in photos.
    luma = 128 + 45 * pink(1.2)
    chroma = [15 * pink(1.6), 15 * pink(1.6)]
    rgb = np.stack(
        [
            luma + 1.40 * chroma[1],
            luma - 0.34 * chroma[0] - 0.71 * chroma[1],
            luma + 1.77 * chroma[0],
        ],
        -1,
    )
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))
    for _ in range(int(rng.integers(3, 10))):
        layer = Image.new("RGBA", (w, h), (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        colour = (*(int(c) for c in rng.integers(0, 256, 3)), int(rng.integers(80, 220)))
        x0, y0 = int(rng.integers(-w // 4, w)), int(rng.integers(-h // 4, h))
        x1, y1 = x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            points = [(int(rng.integers(x0, x1)), int(rng.integers(y0, y1))) for _ in range(5)]
            draw.polygon(points, fill=colour)
        img = Image.alpha_composite(img.convert("RGBA"), layer).convert("RGB")
    noisy = np.asarray(img, np.float32) + rng.normal(0, 3, (h, w, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def shards(n: int) -> list[str]:
    from PIL import Image

    directory = DATA / f"transforms-{n}"
    marker = directory / "done.json"
    if marker.exists():
        return list(json.loads(marker.read_text()))
    rng = np.random.default_rng(12)

    def samples() -> Any:
        for i in range(n):
            out = io.BytesIO()
            Image.fromarray(natural_image(rng, HEIGHT, WIDTH)).save(
                out, format="JPEG", quality=90, subsampling=2
            )
            yield {"__key__": f"img{i:07d}", "jpg": out.getvalue(), "cls": i % 1000}

    paths = _write(directory, samples(), per_shard=n // 8)
    marker.write_text(json.dumps(paths))
    return paths


# ------------------------------------------- torchvision's transforms, with Pillow


def random_resized_crop_params(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, drawn from torch's
    generator as torchvision draws them: (top, left, height, width)."""
    import torch

    area = height * width
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(*SCALE).item()
        aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def to_normalized_half(img: Any) -> Any:
    """ToTensor, Normalize(MEAN, STD), then float16 (per sample, in the worker)."""
    import torch

    x = torch.from_numpy(np.array(img, np.uint8, copy=True)).permute(2, 0, 1).contiguous()
    x = x.to(torch.float32).div(255)
    x.sub_(torch.tensor(MEAN)[:, None, None]).div_(torch.tensor(STD)[:, None, None])
    return x.to(torch.float16)


def train_transform(img: Any) -> Any:
    """RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize."""
    import torch
    from PIL import Image

    top, left, h, w = random_resized_crop_params(*img.size)
    img = img.crop((left, top, left + w, top + h)).resize((CROP, CROP), Image.Resampling.BILINEAR)
    if torch.rand(1).item() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return to_normalized_half(img)


def eval_transform(img: Any) -> Any:
    """Resize(256) + CenterCrop(224) + ToTensor + Normalize."""
    from PIL import Image

    w, h = img.size
    size = (RESIZE, int(RESIZE * h / w)) if w <= h else (int(RESIZE * w / h), RESIZE)
    img = img.resize(size, Image.Resampling.BILINEAR)
    top = int(round((size[1] - CROP) / 2.0))
    left = int(round((size[0] - CROP) / 2.0))
    return to_normalized_half(img.crop((left, top, left + CROP, top + CROP)))


def identity(value: Any) -> Any:
    return value


def chute_options(job: str) -> dict[str, Any]:
    import torch

    common = {"normalize": (MEAN, STD), "dtype": torch.float16, "size": (CROP, CROP)}
    if job == "train":
        return {**common, "crop": "random_resized", "scale": SCALE, "ratio": RATIO, "flip": True}
    return {**common, "resize": RESIZE, "crop": "center"}


# ---------------------------------------------------------------- one configuration (subprocess)


def worker(config: dict[str, Any]) -> None:
    import torch

    rss_after_torch = current_rss()
    job, urls, workers = config["job"], config["urls"], config["workers"]
    if config["loader"] == "chute":
        import chute

        ds = (
            chute.WebDataset(urls, shardshuffle=False)
            .decode("torchrgb8", **chute_options(job))
            .to_tuple("jpg", "cls")
            .batched(BATCH)
        )
        loader: Any = chute.DataLoader(ds, batch_size=None, num_workers=workers)
    else:
        import webdataset

        transform = train_transform if job == "train" else eval_transform
        pipeline = (
            webdataset.WebDataset(urls, shardshuffle=False)
            .decode("pil")
            .to_tuple("jpg", "cls")
            .map_tuple(transform, identity)
            .batched(BATCH)
        )
        loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=workers)
    gc.collect()  # importing torch leaves a full collection due (see bench_wds.py)
    start = time.perf_counter()
    first = None
    samples = 0
    for images, labels in loader:
        if first is None:
            first = time.perf_counter() - start
            assert images.dtype == torch.float16 and tuple(images.shape[1:]) == (3, CROP, CROP)
        samples += len(labels)
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "samples": samples,
                "seconds": seconds,
                "first_batch_seconds": first,
                "rss_after_import_torch": rss_after_torch,
            }
        )
    )


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="600 images instead of 3,000")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: train, eval")
    parser.add_argument(
        "--repeats", type=int, default=3, help="chute runs per job (the median is reported)"
    )
    parser.add_argument(
        "--torch-workers",
        default="0,1,2",
        help="torch DataLoader num_workers to try (the best is the baseline)",
    )
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    jobs = args.jobs.split(",")
    unknown = set(jobs) - set(JOBS)
    if unknown:
        parser.error(f"unknown jobs {sorted(unknown)}; known: {', '.join(JOBS)}")
    load_before = os.getloadavg()
    n = 600 if args.quick else 3_000
    urls = shards(n)
    every_payload = jpeg_payloads(urls)
    payloads = every_payload[:LIMIT_IMAGES]
    script = str(Path(__file__).resolve())
    cores = os.cpu_count() or 2
    rows: list[dict[str, Any]] = []
    chute_runs: dict[str, list[dict[str, Any]]] = {}
    limit_rounds = [decode_limit_round(payloads)]
    for job in jobs:
        configs = [("webdataset", int(w)) for w in args.torch_workers.split(",")]
        configs.append(("chute", cores))
        for loader, workers in configs:
            runs: list[dict[str, Any]] = []
            for _ in range(args.repeats if loader == "chute" else 1):
                report = run_config(
                    script, {"loader": loader, "workers": workers, "job": job, "urls": urls}
                )
                run: dict[str, Any] = {
                    "job": job,
                    "loader": "chute.DataLoader"
                    if loader == "chute"
                    else "torch DataLoader + webdataset + Pillow",
                    "workers": workers,
                    "samples": report["samples"],
                    "samples_per_s": report["samples"] / report["seconds"],
                    "first_batch_s": report["first_batch_seconds"],
                    "peak_rss_mib": report["peak_tree_rss"] / 2**20,
                }
                if loader == "chute":
                    run["decode_limit_before"] = limit_rounds[-1]
                    limit_rounds.append(decode_limit_round(payloads))
                    run["decode_limit_after"] = limit_rounds[-1]
                    run["decode_limit"] = (run["decode_limit_before"] + limit_rounds[-1]) / 2
                    run["ratio_to_decode_limit"] = run["samples_per_s"] / run["decode_limit"]
                    run["concurrent_decode_after"] = concurrent_decode_round(payloads)
                runs.append(run)
                print(
                    f"  {job:5s} {run['loader']:40s} workers={workers}: "
                    f"{run['samples_per_s']:,.0f} images/s"
                    + (
                        f" ({run['ratio_to_decode_limit']:.2f}x the decode limit,"
                        f" {run['decode_limit']:,.0f}/s)"
                        if "decode_limit" in run
                        else ""
                    ),
                    flush=True,
                )
            if loader == "chute":
                chute_runs[job] = list(runs)
            runs.sort(key=lambda r: r["samples_per_s"])
            rows.append(runs[len(runs) // 2])

    summary: dict[str, Any] = {}
    for job in jobs:
        job_rows = [r for r in rows if r["job"] == job]
        best_torch = max(
            (r for r in job_rows if r["loader"] != "chute.DataLoader"),
            key=lambda r: r["samples_per_s"],
        )
        ours = next(r for r in job_rows if r["loader"] == "chute.DataLoader")
        ratios = sorted(r["ratio_to_decode_limit"] for r in chute_runs[job])
        summary[job] = {
            "chute_images_per_s": ours["samples_per_s"],
            "chute_runs_images_per_s": [r["samples_per_s"] for r in chute_runs[job]],
            "best_torch_images_per_s": best_torch["samples_per_s"],
            "best_torch_workers": best_torch["workers"],
            "speedup_vs_torch": ours["samples_per_s"] / best_torch["samples_per_s"],
            "ratio_to_decode_limit_median": ratios[len(ratios) // 2],
            "ratios_to_decode_limit": [r["ratio_to_decode_limit"] for r in chute_runs[job]],
        }
    load_after = os.getloadavg()
    print()
    print(
        table(
            rows,
            [
                ("job", "job"),
                ("loader", "loader"),
                ("workers", "workers"),
                ("samples_per_s", "images/s"),
                ("first_batch_s", "first batch s"),
                ("peak_rss_mib", "peak RSS MiB"),
            ],
        )
    )
    print()
    for job, s in summary.items():
        print(
            f"{job}: chute {s['chute_images_per_s']:,.0f}/s = {s['speedup_vs_torch']:.1f}x torch"
            f" DataLoader + webdataset + Pillow ({s['best_torch_images_per_s']:,.0f}/s,"
            f" num_workers={s['best_torch_workers']}), {s['ratio_to_decode_limit_median']:.2f}x"
            " the full-size decode limit (median of the runs, each against the mean of the"
            " limit rounds right before and after it)"
        )
    print(
        f"decode limit: libjpeg-turbo full-size on one thread x {cores} cores, rounds "
        + ", ".join(f"{x:,.0f}" for x in limit_rounds)
        + "/s (in time order; chute ran between each two)"
    )
    print(f"load average before / after: {load_before} / {load_after}")
    path = save(
        "transforms_quick" if args.quick else "transforms",
        {
            "images": n,
            "image_size": [HEIGHT, WIDTH],
            "mean_jpeg_bytes": float(np.mean([len(p) for p in every_payload])),
            "rows": rows,
            "summary": summary,
            "decode_limit_rounds": limit_rounds,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
