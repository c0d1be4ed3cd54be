"""num_workers="auto" against the best fixed setting, on the jobs of
bench_wds.py (tiny samples, 256x256 JPEGs) and bench_transforms.py (train,
eval, and the Python map on worker processes).

Each configuration runs in its own subprocess and is measured as its own
benchmark measures it: bench_wds's jobs one epoch from a fresh loader,
bench_transforms' train and eval jobs their second epoch, the map job one
epoch. The fixed settings are num_workers 1, half the cores and all the
cores (as threads; the map job's are worker processes). Rounds alternate
the configurations (a new order each round) so that the machine's drift
and its other users do not favour one; each row is the median of the
rounds with its spread, and "auto / best" divides each round's auto run by
that round's best fixed run (the median and spread of those ratios). The
load average before and after is printed beside the figures: on a shared
machine it says how far they can be trusted.

    python benchmarks/bench_auto.py                  # full sizes, 5 rounds
    python benchmarks/bench_auto.py --quick --rounds 3
    python benchmarks/bench_auto.py --jobs jpeg,train
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_transforms  # noqa: E402
import bench_wds  # noqa: E402
from common import RESULTS, run_config, save, table  # noqa: E402

JOBS = ("tiny", "jpeg", "train", "eval", "map")


def fixed_settings(cores: int) -> list[int]:
    return sorted({1, max(1, cores // 2), cores})


def job_urls(job: str, quick: bool) -> list[str]:
    scale = 10 if quick else 1
    if job == "tiny":
        return bench_wds.tiny_shards(200_000 // scale)
    if job == "jpeg":
        return bench_wds.jpeg_shards(4_000 // scale)
    if job == "map":
        return bench_transforms.map_shards(3_000 // (5 if quick else 1))
    return bench_transforms.shards(3_000 // (5 if quick else 1))


# ---------------------------------------------------------------- one configuration (subprocess)


def worker(config: dict[str, Any]) -> None:
    import chute
    import torch

    job, urls = config["job"], config["urls"]
    workers: int | str = config["workers"]
    ds = chute.WebDataset(urls, shardshuffle=False)
    epochs = 1
    if job == "tiny":
        loader = chute.DataLoader(
            ds.decode().to_tuple("npy", "cls").batched(256), batch_size=None, num_workers=workers
        )
    elif job == "jpeg":
        loader = chute.DataLoader(
            ds.decode("torchrgb8").to_tuple("jpg", "cls").batched(64),
            batch_size=None,
            num_workers=workers,
        )
    elif job == "map":
        pipeline = (
            ds.decode("torchrgb8").to_tuple("jpg", "cls").map(bench_transforms.normalise_and_flip)
        )
        loader = chute.DataLoader(
            pipeline, batch_size=bench_transforms.MAP_BATCH, num_workers=workers
        )
    else:
        loader = chute.DataLoader(
            ds.decode("torchrgb8", **bench_transforms.chute_options(job))
            .to_tuple("jpg", "cls")
            .batched(bench_transforms.BATCH),
            batch_size=None,
            num_workers=workers,
        )
        epochs = 2
    gc.collect()  # importing torch leaves a full collection due (see bench_wds.py)
    samples = 0
    seconds = 0.0
    for _ in range(epochs):
        start = time.perf_counter()
        samples = 0
        for _images, labels in loader:
            samples += len(labels)
        seconds = time.perf_counter() - start
    stats = loader.stats()
    report = loader.diagnose()
    torch.set_num_threads(1)
    print(
        json.dumps(
            {
                "samples": samples,
                "seconds": seconds,
                "samples_per_s": samples / seconds,
                "decode_threads": stats.get("decode_threads"),
                "prefetch_batches": stats.get("prefetch_batches"),
                "bottleneck": report["bottleneck"],
            }
        )
    )


# ---------------------------------------------------------------- main


def load_average() -> str:
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller data sets")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default: %(default)s)")
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--name", default="auto", help="results file name (default: %(default)s)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    cores = len(os.sched_getaffinity(0))
    jobs = [j for j in args.jobs.split(",") if j]
    unknown = sorted(set(jobs) - set(JOBS))
    if unknown:
        parser.error(f"unknown jobs {unknown}; jobs are {', '.join(JOBS)}")
    settings: list[int | str] = [*fixed_settings(cores), "auto"]
    urls = {job: job_urls(job, args.quick) for job in jobs}
    script = str(Path(__file__).resolve())
    load_before = load_average()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    rng = random.Random(0)
    started = time.time()
    for round_index in range(args.rounds):
        for job in jobs:
            order = list(settings)
            rng.shuffle(order)
            for workers in order:
                result = run_config(script, {"job": job, "urls": urls[job], "workers": workers})
                result["round"] = round_index
                runs.setdefault((job, str(workers)), []).append(result)
                print(
                    f"round {round_index + 1} {job:5s} num_workers={workers!s:4s} "
                    f"{result['samples_per_s']:10,.0f}/s  threads {result['decode_threads']}"
                    f"  {result['bottleneck']}",
                    flush=True,
                )
    load_after = load_average()
    rows: list[dict[str, Any]] = []
    for job in jobs:
        fixed_medians = {
            w: statistics.median(r["samples_per_s"] for r in runs[(job, str(w))])
            for w in settings
            if w != "auto"
        }
        best = max(fixed_medians, key=lambda w: fixed_medians[w])
        ratios = []
        for round_index in range(args.rounds):
            per_round = {
                w: next(r for r in runs[(job, str(w))] if r["round"] == round_index)
                for w in settings
            }
            best_fixed = max(per_round[w]["samples_per_s"] for w in settings if w != "auto")
            ratios.append(per_round["auto"]["samples_per_s"] / best_fixed)
        for w in settings:
            rates = [r["samples_per_s"] for r in runs[(job, str(w))]]
            row: dict[str, Any] = {
                "job": job,
                "num_workers": str(w),
                "median": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
                "threads_at_end": statistics.median(
                    int(r["decode_threads"] or 0) for r in runs[(job, str(w))]
                ),
                "bottleneck": statistics.mode(r["bottleneck"] for r in runs[(job, str(w))]),
            }
            if w == "auto":
                row["vs_best_fixed"] = statistics.median(ratios)
                row["vs_best_min"] = min(ratios)
                row["vs_best_max"] = max(ratios)
                row["best_fixed"] = best
            rows.append(row)
    print()
    print(
        table(
            rows,
            [
                ("job", "job"),
                ("num_workers", "num_workers"),
                ("median", "samples/s (median)"),
                ("min", "min"),
                ("max", "max"),
                ("threads_at_end", "threads at end"),
                ("bottleneck", "diagnosis"),
                ("vs_best_fixed", "auto / best fixed"),
                ("vs_best_min", "min"),
                ("vs_best_max", "max"),
            ],
        )
    )
    print(
        f"\n{args.rounds} rounds, {time.time() - started:.0f} s; load average before "
        f"{load_before}, after {load_after}; {cores} cores"
    )
    path = save(
        args.name,
        {
            "rounds": args.rounds,
            "quick": args.quick,
            "cores": cores,
            "load_before": load_before,
            "load_after": load_after,
            "rows": rows,
            "runs": {f"{job}/{w}": r for (job, w), r in runs.items()},
        },
        Path(args.results_dir),
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
