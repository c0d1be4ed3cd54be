"""Single-thread JPEG decode rate: chute's native decoder against PIL, same
images, same process, from memory. It bounds what any loader can deliver per
core on this machine ("this machine's decode limit").

256x256 quality-90 4:2:0 JPEGs of smooth, slightly noisy content (about the
entropy of a downscaled photo). Each decoder runs for --seconds; the best of
--repeats rounds is reported. Prints a summary and writes
benchmarks/results/decode_limit.json.
"""

import argparse
import io
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import PIL
from PIL import Image


def make_jpegs(count, size, quality, seed):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    out = []
    for _ in range(count):
        planes = []
        for _ in range(3):
            a, b, p = rng.uniform(0.01, 0.1, 3)
            v = 127 + 90 * np.sin(a * xx + p) * np.cos(b * yy) + rng.normal(0, 8, (size, size))
            planes.append(v)
        img = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality, subsampling=2)
        out.append(buf.getvalue())
    return out


def decode_chute(data):
    # The tests' module (not in the wheel): bench_wds imports this file for
    # Pillow's rate on a machine where only the wheel is installed.
    import chute_testing

    return chute_testing.decode_image(data, "rgb")


def decode_pil(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def rate(fn, images, seconds):
    done = 0
    start = time.perf_counter()
    while True:
        for data in images:
            fn(data)
        done += len(images)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "decode_limit.json")
    )
    args = parser.parse_args()

    images = make_jpegs(args.count, args.size, args.quality, seed=0)
    for data in images[:20]:  # the comparison only means something if outputs agree
        assert np.array_equal(decode_chute(data), decode_pil(data))

    results = {}
    for name, fn in (("chute", decode_chute), ("pil", decode_pil)):
        rate(fn, images[:20], 0.3)  # warm-up
        rounds = []
        for _ in range(args.repeats):
            rounds.append(rate(fn, images, args.seconds))
        results[name] = {"images_per_s": max(rounds), "rounds": rounds}

    report = {
        "benchmark": "single-thread JPEG decode from memory to uint8 HWC RGB",
        "images": args.count,
        "size": [args.size, args.size],
        "quality": args.quality,
        "subsampling": "4:2:0",
        "mean_jpeg_bytes": float(np.mean([len(d) for d in images])),
        "chute_images_per_s": results["chute"]["images_per_s"],
        "pil_images_per_s": results["pil"]["images_per_s"],
        "speedup": results["chute"]["images_per_s"] / results["pil"]["images_per_s"],
        "rounds": {k: v["rounds"] for k, v in results.items()},
        "pillow": PIL.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{args.size}x{args.size} q{args.quality} 4:2:0 JPEG "
        f"({report['mean_jpeg_bytes'] / 1024:.1f} KiB avg), one thread:"
    )
    print(f"  chute_testing.decode_image : {report['chute_images_per_s']:8.0f} images/s")
    print(f"  PIL open+convert+asarray : {report['pil_images_per_s']:8.0f} images/s")
    print(f"  ratio                    : {report['speedup']:8.2f}x")
    print(f"  load average             : {report['load_average']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
