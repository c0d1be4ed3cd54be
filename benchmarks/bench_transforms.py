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
the best of num_workers 0, 1, 2. Both loaders run two epochs in one
process; the second is timed (the first batch is the first epoch's).

The decode limit is libjpeg-turbo decoding the same files at full size
(``chute._core.decode_loop``, a C++ loop from memory into one buffer) on
one thread, times the cores; it is measured before the first chute run and
after each, and each run is compared with the mean of the rounds on its two
sides (as in bench_wds.py). Region and DCT-scaled decoding do less work than
a full decode, so chute can exceed it. How much less: the stage costs
printed at the end (one thread, per image: full decode, entropy decoding
alone, the crop window's decode, then resize, then normalise and write).

Job ``map`` (issue 12's job (c)): a Python ``.map(fn)`` whose ``fn``
normalises (mean/std) and randomly flips a 3x256x256 tensor decoded from a
256x256 JPEG, batches of 64: chute.DataLoader(num_workers=N), whose worker
processes run the map, against torch's DataLoader(num_workers=N) over
webdataset with the same decode and map. Each side runs on an idle machine
and with CPU hogs beside it (processes spinning in a loop, started before
the run and ended by pid after it: the cores a training node's trainer and
other ranks keep busy). ``--map-workers`` and ``--hogs`` take lists (the
scaling from 1 to 16 workers on a larger machine). Each run also reports
the loader's own process's CPU seconds per batch (getrusage of that
process: its threads, not the workers) and the images/s that implies as a
ceiling: that process hands over every batch, so it cannot go faster.

    python benchmarks/bench_transforms.py                  # 3,000 images
    python benchmarks/bench_transforms.py --quick          # 600
    python benchmarks/bench_transforms.py --jobs map --hogs 0,2
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_wds import (  # noqa: E402
    concurrent_decode_round,
    decode_limit_round,
    jpeg_payloads,
)
from common import cached_shards, current_rss, run_config, save, table  # noqa: E402

HEIGHT, WIDTH = 375, 500
BATCH = 256
CROP = 224
RESIZE = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
JOBS = ("train", "eval", "map")
MAP_SIZE = 256
MAP_BATCH = 64
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

    rng = np.random.default_rng(12)

    def samples() -> Any:
        for i in range(n):
            out = io.BytesIO()
            Image.fromarray(natural_image(rng, HEIGHT, WIDTH)).save(
                out, format="JPEG", quality=90, subsampling=2
            )
            yield {"__key__": f"img{i:07d}", "jpg": out.getvalue(), "cls": i % 1000}

    return cached_shards(f"transforms-{n}", samples, per_shard=n // 8)


def map_shards(n: int) -> list[str]:
    """n 256x256 JPEGs (quality 90) + `cls`, for the map job."""
    from PIL import Image

    rng = np.random.default_rng(13)

    def samples() -> Any:
        for i in range(n):
            out = io.BytesIO()
            image = natural_image(rng, MAP_SIZE, MAP_SIZE)
            Image.fromarray(image).save(out, format="JPEG", quality=90)
            yield {"__key__": f"img{i:07d}", "jpg": out.getvalue(), "cls": i % 1000}

    return cached_shards(f"transforms-map-{n}", samples, per_shard=max(1, n // 8))


def normalise_and_flip(sample: tuple[Any, int]) -> tuple[Any, int]:
    """The map job's user function: uint8 CHW to float, normalised per
    channel, flipped left-right half of the time (torch ops throughout, so
    torch's intra-op threads are in play)."""
    import torch

    image, cls = sample
    x = image.to(torch.float32).div_(255)
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    if torch.rand(1).item() < 0.5:
        x = torch.flip(x, dims=(2,))
    return x, cls


class Hogs:
    """`n` processes that keep a core busy each, ended by pid on exit."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Hogs:
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


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
    shape: tuple[int, ...] = (3, CROP, CROP)
    dtype = torch.float16
    if job == "map":
        shape, dtype = (3, MAP_SIZE, MAP_SIZE), torch.float32
        if config["loader"] == "chute":
            import chute

            ds = chute.WebDataset(urls, shardshuffle=False)
        else:
            import webdataset

            ds = webdataset.WebDataset(urls, shardshuffle=False)
        ds = ds.decode("torchrgb8").to_tuple("jpg", "cls").map(normalise_and_flip)
        make = torch.utils.data.DataLoader if config["loader"] != "chute" else chute.DataLoader
        loader: Any = make(ds, batch_size=MAP_BATCH, num_workers=workers)
    elif config["loader"] == "chute":
        import chute

        ds = (
            chute.WebDataset(urls, shardshuffle=False)
            .decode("torchrgb8", **chute_options(job))
            .to_tuple("jpg", "cls")
            .batched(BATCH)
        )
        loader = chute.DataLoader(ds, batch_size=None, num_workers=workers)
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
    # Train and eval: the speed of a second epoch, as a training run spends
    # its time (one epoch of these few batches is mostly start-up: worker
    # processes, batch memory faulted in); the first batch of the first.
    first = None
    # The loader's own process: its CPU time (all its threads, not the
    # worker processes) from the first batch of the timed epoch to its last.
    cpu_from = cpu_to = 0.0
    timed_batches = 0
    for _epoch in range(1 if job == "map" else 2):
        start = time.perf_counter()
        samples = 0
        timed_batches = 0
        for images, labels in loader:
            if first is None:
                first = time.perf_counter() - start
                assert images.dtype == dtype and tuple(images.shape[1:]) == shape
            if timed_batches == 0:
                cpu_from = process_cpu_seconds()
            cpu_to = process_cpu_seconds()
            timed_batches += 1
            samples += len(labels)
        seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "samples": samples,
                "seconds": seconds,
                "first_batch_seconds": first,
                "rss_after_import_torch": rss_after_torch,
                "loader_cpu_s_per_batch": (cpu_to - cpu_from) / max(1, timed_batches - 1),
            }
        )
    )


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process (every thread of it; not
    its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------- the map job (c)


def map_job(
    script: str, urls: list[str], workers: list[int], hogs: list[int], repeats: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (the median of `repeats` runs per configuration) and, per
    (workers, hogs), chute's speed-up over torch + webdataset."""
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for n_hogs in hogs:
        for n_workers in workers:
            speeds: dict[str, float] = {}
            for loader in ("webdataset", "chute"):
                runs = []
                for _ in range(repeats):
                    config = {"loader": loader, "workers": n_workers, "job": "map", "urls": urls}
                    with Hogs(n_hogs):
                        report = run_config(script, config)
                    runs.append(
                        {
                            "job": "map",
                            "loader": "chute.DataLoader"
                            if loader == "chute"
                            else "torch DataLoader + webdataset",
                            "workers": n_workers,
                            "hogs": n_hogs,
                            "samples": report["samples"],
                            "samples_per_s": report["samples"] / report["seconds"],
                            "first_batch_s": report["first_batch_seconds"],
                            "peak_rss_mib": report["peak_tree_rss"] / 2**20,
                            "peak_pss_mib": report["peak_tree_pss"] / 2**20,
                            **loader_ceiling(report["loader_cpu_s_per_batch"]),
                        }
                    )
                    print(
                        f"  map   {runs[-1]['loader']:40s} workers={n_workers} hogs={n_hogs}: "
                        f"{runs[-1]['samples_per_s']:,.0f} images/s; the loader's process "
                        f"{1e3 * runs[-1]['loader_cpu_s_per_batch']:.2f} ms CPU per batch "
                        f"(its ceiling {runs[-1]['loader_ceiling_images_per_s']:,.0f} images/s)",
                        flush=True,
                    )
                runs.sort(key=lambda r: r["samples_per_s"])
                rows.append(runs[len(runs) // 2])
                speeds[loader] = rows[-1]["samples_per_s"]
            summary[f"workers={n_workers},hogs={n_hogs}"] = {
                "chute_loader_cpu_ms_per_batch": 1e3 * rows[-1]["loader_cpu_s_per_batch"],
                "chute_loader_ceiling_images_per_s": rows[-1]["loader_ceiling_images_per_s"],
                "chute_images_per_s": speeds["chute"],
                "torch_images_per_s": speeds["webdataset"],
                "speedup_vs_torch": speeds["chute"] / speeds["webdataset"],
            }
    return rows, summary


def loader_ceiling(cpu_s_per_batch: float) -> dict[str, float]:
    """The loader process's CPU per batch and the images/s it caps the map
    job at: it cannot hand over batches faster than it spends on each."""
    return {
        "loader_cpu_s_per_batch": cpu_s_per_batch,
        "loader_ceiling_images_per_s": MAP_BATCH / cpu_s_per_batch if cpu_s_per_batch else 0.0,
    }


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="600 images instead of 3,000")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: train, eval, map")
    parser.add_argument("--images", type=int, help="images per data set (a check's tiny run)")
    parser.add_argument(
        "--map-workers", default="2", help="map job: num_workers to run, comma-separated"
    )
    parser.add_argument(
        "--hogs", default="0,2", help="map job: CPU hog processes beside the run, comma-separated"
    )
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
    n = args.images or (600 if args.quick else 3_000)
    script = str(Path(__file__).resolve())
    results: dict[str, Any] = {"images": n}
    rows: list[dict[str, Any]] = []
    image_jobs = [job for job in jobs if job != "map"]
    if image_jobs:
        rows += image_jobs_run(args, script, image_jobs, n, results)
    if "map" in jobs:
        map_rows, results["map_summary"] = map_job(
            script,
            map_shards(n),
            [int(w) for w in args.map_workers.split(",")],
            [int(h) for h in args.hogs.split(",")],
            args.repeats,
        )
        rows += map_rows
    load_after = os.getloadavg()
    print()
    print(
        table(
            rows,
            [
                ("job", "job"),
                ("loader", "loader"),
                ("workers", "workers"),
                ("hogs", "CPU hogs"),
                ("samples_per_s", "images/s"),
                ("first_batch_s", "first batch s"),
                ("peak_rss_mib", "peak RSS MiB"),
                ("peak_pss_mib", "peak PSS MiB"),
            ],
        )
    )
    print()
    for job, s in results.get("summary", {}).items():
        print(
            f"{job}: chute {s['chute_images_per_s']:,.0f}/s = {s['speedup_vs_torch']:.1f}x torch"
            f" DataLoader + webdataset + Pillow ({s['best_torch_images_per_s']:,.0f}/s,"
            f" num_workers={s['best_torch_workers']}), {s['ratio_to_decode_limit_median']:.2f}x"
            " the full-size decode limit (median of the runs, each against the mean of the"
            " limit rounds right before and after it)"
        )
    if "decode_limit_rounds" in results:
        print(
            f"decode limit: libjpeg-turbo full-size on one thread x {os.cpu_count() or 2} cores,"
            " rounds "
            + ", ".join(f"{x:,.0f}" for x in results["decode_limit_rounds"])
            + "/s (in time order; chute ran between each two)"
        )
    if "stage_costs_us" in results:
        costs = results["stage_costs_us"]
        full = costs["full-size decode"]
        print(
            "\nper image on one thread (the least of three passes; the resampler's SIMD level"
            f" here: {results.get('simd_level')}):"
        )
        for name, us in costs.items():
            print(f"  {name:42s} {us:6.0f} us  {us / full:5.2f}x a full-size decode")
    for key, s in results.get("map_summary", {}).items():
        print(
            f"map {key}: chute {s['chute_images_per_s']:,.0f}/s = {s['speedup_vs_torch']:.2f}x"
            f" torch DataLoader + webdataset ({s['torch_images_per_s']:,.0f}/s); chute's"
            f" loader process {s['chute_loader_cpu_ms_per_batch']:.2f} ms CPU per batch of"
            f" {MAP_BATCH}, a ceiling of {s['chute_loader_ceiling_images_per_s']:,.0f} images/s"
        )
    print(f"load average before / after: {load_before} / {load_after}")
    results.update(rows=rows, load_average_before=load_before, load_average_after=load_after)
    if args.images:
        print("not saved: --images is for checking that the jobs run")
        return
    # A run of some of the jobs keeps the file of the full run.
    name = "transforms" if set(jobs) == set(JOBS) else "transforms_" + "_".join(jobs)
    path = save(name + ("_quick" if args.quick else ""), results)
    print(f"wrote {path}")


def stage_costs(payloads: list[bytes], rounds: int = 3) -> dict[str, float]:
    """Microseconds per image of each stage of the train and eval jobs on one
    thread (the least of `rounds` passes over `payloads`): where a job's time
    goes, against a full-size decode and against entropy decoding alone (the
    coefficients, with no inverse DCT, upsampling or colour conversion: the
    part of a decode that no crop or DCT scale avoids for the rows it keeps,
    and a region decode still pays it for the rows above the crop). The
    stages past the decode loops are single calls from Python, so each
    includes a call's overhead (a few microseconds)."""
    import chute_testing
    from chute import _core

    def loop_us(entropy_only: bool) -> float:
        rate = _core.decode_loop(payloads, 1.0, entropy_only=entropy_only)
        return 1e6 / float(rate)

    crops = [
        tuple(int(v) for v in c)
        for c in chute_testing.rrc_params(HEIGHT, WIDTH, SCALE, RATIO, 7, len(payloads))
    ]
    whole, box = chute_testing.center_crop_area(HEIGHT, WIDTH, RESIZE, CROP, CROP)
    _, _, window = chute_testing.decode_resampled(payloads[0], CROP, CROP, crop=whole, box=box)
    norm = {
        "layout": "CHW",
        "dtype": "float16",
        "mean": list(MEAN),
        "std": list(STD),
    }

    def per_image(call: Any) -> float:
        start = time.perf_counter()
        for i, payload in enumerate(payloads):
            call(i, payload)
        return (time.perf_counter() - start) / len(payloads) * 1e6

    stages: dict[str, Any] = {
        "full-size decode": lambda: loop_us(False),
        "entropy decoding alone": lambda: loop_us(True),
        "train: crop window decoded, no resize": lambda: per_image(
            lambda i, b: chute_testing.decode_resampled(
                b, crops[i][2], crops[i][3], crop=crops[i], region="crop"
            )
        ),
        "train: + resize to 224x224 (uint8 HWC)": lambda: per_image(
            lambda i, b: chute_testing.decode_resampled(b, CROP, CROP, crop=crops[i])
        ),
        "train: + flip, normalise, float16 CHW": lambda: per_image(
            lambda i, b: chute_testing.decode_resampled(
                b, CROP, CROP, crop=crops[i], flip=bool(i % 2), **norm
            )
        ),
        "eval: window decoded, no resize": lambda: per_image(
            lambda i, b: chute_testing.decode_resampled(b, window[2], window[3], crop=window)
        ),
        "eval: + resize, centre crop (uint8 HWC)": lambda: per_image(
            lambda i, b: chute_testing.decode_resampled(b, CROP, CROP, crop=whole, box=box)
        ),
        "eval: + normalise, float16 CHW": lambda: per_image(
            lambda i, b: chute_testing.decode_resampled(b, CROP, CROP, crop=whole, box=box, **norm)
        ),
    }
    # The resize stages again at each SIMD level this CPU runs (the level the
    # resampler picks itself is chute_testing.simd_level()): a CPU that resizes slowly
    # shows here whether its level or its speed at a level is the cause.
    for level in ("scalar", "sse4.1", "avx2"):
        try:
            chute_testing.decode_resampled(payloads[0], CROP, CROP, crop=crops[0], simd=level)
        except Exception:  # this CPU lacks the level
            continue
        stages[f"train: + resize, simd={level}"] = lambda level=level: per_image(
            lambda i, b: chute_testing.decode_resampled(b, CROP, CROP, crop=crops[i], simd=level)
        )
        stages[f"eval: + resize, centre crop, simd={level}"] = lambda level=level: per_image(
            lambda i, b: chute_testing.decode_resampled(
                b, CROP, CROP, crop=whole, box=box, simd=level
            )
        )
    return {name: min(measure() for _ in range(rounds)) for name, measure in stages.items()}


def resampler_simd_level() -> str:
    import chute_testing

    return str(chute_testing.simd_level())


def image_jobs_run(
    args: argparse.Namespace, script: str, jobs: list[str], n: int, results: dict[str, Any]
) -> list[dict[str, Any]]:
    """The train and eval jobs: their rows; their summary and the decode
    limit's rounds go into `results`."""
    urls = shards(n)
    every_payload = jpeg_payloads(urls)
    payloads = every_payload[:LIMIT_IMAGES]
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
                    "peak_pss_mib": report["peak_tree_pss"] / 2**20,
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
    results.update(
        stage_costs_us=stage_costs(payloads),
        simd_level=resampler_simd_level(),
        image_size=[HEIGHT, WIDTH],
        mean_jpeg_bytes=float(np.mean([len(p) for p in every_payload])),
        summary=summary,
        decode_limit_rounds=limit_rounds,
    )
    return rows


if __name__ == "__main__":
    main()
