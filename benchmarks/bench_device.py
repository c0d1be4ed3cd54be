"""Checks for a machine with a GPU and many cores (scripts/device_check.sh
runs this there, in the one command a session with a device gets).

Part ``pinned`` (needs CUDA; skipped with a message without it):
- which batches come out page-locked with ``pin_memory=True``: every tensor
  of every batch over an epoch, counted pinned or not, for three loaders:
  a tar stream on native threads (256x256 JPEGs, ``decode("torchrgb8")``),
  a Python ``.map`` in worker processes (bench_transforms' map job), and an
  ``ArrayDataset`` (the index-driven engine);
- host-to-device bandwidth of the stream's pinned batches:
  ``.to("cuda", non_blocking=True)`` + synchronize, timed for chute's batch
  itself, for torch's ``pin_memory()`` copy of it (what torch's DataLoader
  hands over) and for a pageable copy; GB/s, the median over the kept batches
  and rounds, the three interleaved. Also the time torch's ``pin_memory()``
  copy takes per batch, which chute's registered arenas do not spend.
- the same counts for a ``.map`` in this process (``num_workers=0``) and an
  ``ArrayDataset`` with a ``collate_fn`` (worker processes);
- the hand-off's overlap (``device="cuda"``): steps of ``torch.cuda._sleep``
  (twice the longer of a batch's copy and the loader's time per host batch)
  over chute's batches, against the same steps over batches already on the
  GPU; the target is at most 1.05x.

Part ``scaling``: images/s at 1, 2, 4, 8 and 16 threads or workers (capped at
the cores), each configuration in its own process through the benchmarks'
own workers: bench_wds' JPEG job (chute.DataLoader, num_workers as threads),
bench_transforms' train and eval jobs (threads; torch's DataLoader +
webdataset + Pillow at the largest count, its baseline) and map job (chute's
worker processes, and torch's DataLoader over webdataset at the same
num_workers when webdataset imports; chute's loader process's CPU per batch
is reported). Rounds run every configuration once each, so a
``--deadline`` that cuts the last round still leaves every configuration
measured. Speed-up is over the same loader at 1. Each data set's shard list
is read ``--repeat-shards`` times per epoch (the page cache serves the
repeats): longer timed epochs without writing more pictures, and at least as
many shards as torch's workers (webdataset gives each worker whole shards).

    python benchmarks/bench_device.py                 # the device's sizes
    python benchmarks/bench_device.py --data-only     # write the shards, run nothing
    python benchmarks/bench_device.py --counts 1,2 --images 100 --map-images 100 \\
        --jpeg-images 200 --rounds 1                  # a check's tiny run
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_transforms  # noqa: E402
import bench_wds  # noqa: E402
from common import RESULTS, run_config, save, table  # noqa: E402

PARTS = ("pinned", "scaling", "stages")
SCALING_JOBS = ("jpeg", "train", "eval", "map")
HERE = str(Path(__file__).resolve())
WDS_SCRIPT = str(Path(bench_wds.__file__).resolve())
TRANSFORMS_SCRIPT = str(Path(bench_transforms.__file__).resolve())


# ---------------------------------------------------------------- data


def data_sets(args: argparse.Namespace) -> dict[str, list[str]]:
    """The benchmarks' own cached shards (written on first use), the three
    data sets in parallel: the 500x375 pictures take tens of ms each."""
    makers = {
        "jpeg": (bench_wds.jpeg_shards, args.jpeg_images),
        "train": (bench_transforms.shards, args.images),
        "map": (bench_transforms.map_shards, args.map_images),
    }
    # spawn: forking a process that numpy's thread pools already run in can deadlock.
    with ProcessPoolExecutor(len(makers), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(make, n) for name, (make, n) in makers.items()}
        return {name: future.result() for name, future in futures.items()}


# ---------------------------------------------------------------- pinned batches (subprocess)


def count_pinned(batch: Any, names: tuple[str, ...], counts: dict[str, list[int]]) -> None:
    """Per field of a tuple batch: [pinned, not pinned] tensors."""
    import torch

    for name, field in zip(names, batch, strict=True):
        if isinstance(field, torch.Tensor):
            counts.setdefault(name, [0, 0])[0 if field.is_pinned() else 1] += 1


def pinned_worker(config: dict[str, Any]) -> None:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch.cuda.is_available() is False"}))
        return
    import chute

    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "loaders": {},
    }
    batch, threads = config["batch"], config["threads"]

    stream = (
        chute.WebDataset(config["jpeg"], shardshuffle=False)
        .decode("torchrgb8")
        .to_tuple("jpg", "cls")
        .batched(batch)
    )
    counts: dict[str, list[int]] = {}
    kept: list[Any] = []
    for images, labels in chute.DataLoader(
        stream, batch_size=None, num_workers=threads, pin_memory=True
    ):
        count_pinned((images, labels), ("images", "labels"), counts)
        if len(kept) < config["keep"] and len(labels) == batch:
            kept.append(images)
    report["loaders"]["tar stream, threads"] = {
        "counts": counts,
        "batch_bytes_pinned": stream.stats()["batch_bytes_pinned"],
    }

    mapped = (
        chute.WebDataset(config["map"], shardshuffle=False)
        .decode("torchrgb8")
        .to_tuple("jpg", "cls")
        .map(bench_transforms.normalise_and_flip)
    )
    counts = {}
    for item in chute.DataLoader(
        mapped, batch_size=bench_transforms.MAP_BATCH, num_workers=threads, pin_memory=True
    ):
        count_pinned(item, ("images", "labels"), counts)
    report["loaders"]["map, worker processes"] = {"counts": counts}

    counts = {}
    for item in chute.DataLoader(
        mapped, batch_size=bench_transforms.MAP_BATCH, num_workers=0, pin_memory=True
    ):
        count_pinned(item, ("images", "labels"), counts)
    report["loaders"]["map, this process"] = {"counts": counts}

    rows = np.arange(config["array_rows"] * 1024, dtype=np.float32).reshape(-1, 1024)
    arrays = chute.ArrayDataset(x=rows)
    counts = {}
    for item in chute.DataLoader(arrays, batch_size=1024, num_workers=threads, pin_memory=True):
        count_pinned((item["x"],), ("x",), counts)
    report["loaders"]["ArrayDataset, threads"] = {"counts": counts}

    counts = {}
    for item in chute.DataLoader(
        arrays, batch_size=1024, num_workers=threads, pin_memory=True, collate_fn=stacked
    ):
        count_pinned((item["x"],), ("x",), counts)
    report["loaders"]["ArrayDataset + collate_fn, worker processes"] = {"counts": counts}

    report["bandwidth"] = bandwidth(kept, config["rounds"])
    report["handoff"] = handoff_overlap(rows, threads)
    print(json.dumps(report))


def stacked(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate_fn (it makes the index-driven dataset run on worker
    processes)."""
    import torch

    return {"x": torch.stack([torch.as_tensor(row["x"]) for row in rows])}


def handoff_overlap(rows: np.ndarray, threads: int, batch: int = 1024) -> dict[str, Any]:
    """Seconds of steps over chute's batches handed over with
    ``device="cuda"`` against the same steps over the batches already on
    the GPU. A step is ``torch.cuda._sleep`` for twice the longer of a
    batch's copy and the loader's time per host batch (so that a copy not
    overlapped with the step would show), then a use of the batch."""
    import chute
    import torch

    arrays = chute.ArrayDataset(x=rows)
    host = chute.DataLoader(arrays, batch_size=batch, num_workers=threads, pin_memory=True)
    on_gpu = [item["x"].to("cuda") for item in host]
    torch.cuda.synchronize()
    start = time.perf_counter()
    count = sum(1 for _ in host)
    host_seconds = (time.perf_counter() - start) / count
    pinned = on_gpu[0].cpu().pin_memory()
    copies = []
    for _ in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        pinned.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - start)
    copy_seconds = statistics.median(copies)
    probe = 10_000_000
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    step_seconds = 2 * max(copy_seconds, host_seconds)
    cycles = max(1, int(probe * step_seconds / (time.perf_counter() - start)))

    def steps(batches: Any) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for item in batches:
            x = item["x"] if isinstance(item, dict) else item
            torch.cuda._sleep(cycles)
            x.add_(1)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    steps(on_gpu)
    baseline = min(steps(on_gpu) for _ in range(3))
    loader = chute.DataLoader(arrays, batch_size=batch, num_workers=threads, device="cuda")
    steps(loader)
    handed = min(steps(loader) for _ in range(3))
    return {
        "batches": count,
        "batch_bytes": pinned.numel() * pinned.element_size(),
        "copy_ms": 1e3 * copy_seconds,
        "host_ms_per_batch": 1e3 * host_seconds,
        "step_ms": 1e3 * step_seconds,
        "steps_on_gpu_s": baseline,
        "steps_handed_over_s": handed,
        "ratio": handed / baseline,
        "target": 1.05,
    }


def bandwidth(kept: list[Any], rounds: int) -> dict[str, Any]:
    """H2D GB/s of chute's pinned batches, torch's pinned copies of them and
    pageable copies, interleaved batch by batch."""
    import torch

    if not kept:
        return {"skipped": "no full batch to time"}
    pin_seconds = []
    sources: dict[str, list[Any]] = {"chute pinned batch": kept, "torch pin_memory() copy": []}
    for tensor in kept:
        start = time.perf_counter()
        sources["torch pin_memory() copy"].append(tensor.pin_memory())
        pin_seconds.append(time.perf_counter() - start)
    sources["pageable copy"] = [tensor.clone() for tensor in kept]
    assert not any(t.is_pinned() for t in sources["pageable copy"])
    on_gpu = kept[0].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.cpu(), kept[0])
    seconds: dict[str, list[float]] = {name: [] for name in sources}
    for round_ in range(rounds + 1):  # the first round warms the copy paths up
        for i in range(len(kept)):
            for name, tensors in sources.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                tensors[i].to("cuda", non_blocking=True)
                torch.cuda.synchronize()
                if round_:
                    seconds[name].append(time.perf_counter() - start)
    nbytes = kept[0].numel() * kept[0].element_size()
    return {
        "batch_bytes": nbytes,
        "batches": len(kept),
        "rounds": rounds,
        "gb_per_s": {
            name: {
                "median": nbytes / statistics.median(s) / 1e9,
                "min": nbytes / max(s) / 1e9,
                "max": nbytes / min(s) / 1e9,
            }
            for name, s in seconds.items()
        },
        "torch_pin_memory_ms_per_batch": 1e3 * statistics.median(pin_seconds),
    }


def pinned(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The pinned part in its own process, which is killed if it hangs (the
    first CUDA use in a new environment may), so that scaling still runs."""
    try:
        proc = subprocess.run(
            [sys.executable, HERE, "--worker", json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"failed": f"killed after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"failed": f"exit status {proc.returncode}", "stderr": proc.stderr[-3000:]}
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


# ---------------------------------------------------------------- scaling


def scaling_configs(
    args: argparse.Namespace, urls: dict[str, list[str]], counts: list[int]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(job, loader label, config for the script's --worker) in run order."""
    repeat = args.repeat_shards
    configs: list[tuple[str, str, dict[str, Any]]] = []
    jobs = args.jobs.split(",")
    for n in counts if "jpeg" in jobs else []:
        config = {"loader": "chute", "workers": n, "job": "jpeg", "urls": urls["jpeg"] * repeat}
        configs.append(("jpeg", "chute.DataLoader (threads)", config))
    for job in ("train", "eval"):
        for n in counts if job in jobs else []:
            config = {"loader": "chute", "workers": n, "job": job, "urls": urls["train"] * repeat}
            configs.append((job, "chute.DataLoader (threads)", config))
        if job in jobs and importlib.util.find_spec("webdataset") is not None:
            # torch's baseline at the most workers: webdataset gives each
            # worker whole shards, and the list holds `repeat` times 8.
            config = {
                "loader": "webdataset",
                "workers": max(counts),
                "job": job,
                "urls": urls["train"] * repeat,
            }
            configs.append((job, "torch DataLoader + webdataset + Pillow", config))
    loaders = [("chute", "chute.DataLoader (processes)")]
    if importlib.util.find_spec("webdataset") is not None:
        loaders.append(("webdataset", "torch DataLoader + webdataset"))
    for loader, label in loaders if "map" in jobs else []:
        for n in counts:
            config = {"loader": loader, "workers": n, "job": "map", "urls": urls["map"] * repeat}
            configs.append(("map", label, config))
    return configs


def scaling(
    args: argparse.Namespace,
    urls: dict[str, list[str]],
    results: dict[str, Any],
    out_of_time: Any,
    checkpoint: Any,
) -> None:
    cores = os.cpu_count() or 1
    counts = [n for n in (int(c) for c in args.counts.split(",")) if n <= cores]
    configs = scaling_configs(args, urls, counts)
    runs: list[dict[str, Any]] = results.setdefault("scaling_runs", [])
    for round_ in range(args.rounds):
        for job, label, config in configs:
            if out_of_time():
                results["scaling_cut_by_deadline"] = f"round {round_ + 1} of {args.rounds}"
                return
            script = WDS_SCRIPT if job == "jpeg" else TRANSFORMS_SCRIPT
            try:
                report = run_config(script, config, timeout=args.config_timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                failure = f"{job} {label} workers={config['workers']}: {str(error)[-2000:]}"
                print(f"  FAILED {failure}", flush=True)
                results.setdefault("scaling_failures", []).append(failure)
                checkpoint()
                continue
            run = {
                "job": job,
                "loader": label,
                "workers": config["workers"],
                "round": round_ + 1,
                "samples": report["samples"],
                "samples_per_s": report["samples"] / report["seconds"],
                "first_batch_s": report["first_batch_seconds"],
                "peak_rss_mib": report["peak_tree_rss"] / 2**20,
                # bench_transforms' jobs: the loader process's own CPU per batch.
                "loader_cpu_ms_per_batch": 1e3 * report.get("loader_cpu_s_per_batch", 0.0),
            }
            runs.append(run)
            print(
                f"  {job:5s} {label:32s} workers={run['workers']:2d} round {round_ + 1}: "
                f"{run['samples_per_s']:,.0f} images/s",
                flush=True,
            )
            results["scaling"] = summarise(runs)
            checkpoint()


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (job, loader, workers): the median run, and its speed-up
    over the same loader's median at one worker."""
    rows: list[dict[str, Any]] = []
    keys = dict.fromkeys((r["job"], r["loader"], r["workers"]) for r in runs)
    for job, loader, workers in keys:
        mine = [r for r in runs if (r["job"], r["loader"], r["workers"]) == (job, loader, workers)]
        speeds = [r["samples_per_s"] for r in mine]
        rows.append(
            {
                "job": job,
                "loader": loader,
                "workers": workers,
                "runs": len(speeds),
                "samples_per_s": statistics.median(speeds),
                "runs_samples_per_s": speeds,
                "loader_cpu_ms_per_batch": statistics.median(
                    r["loader_cpu_ms_per_batch"] for r in mine
                ),
            }
        )
    for row in rows:
        one = next(
            (
                r["samples_per_s"]
                for r in rows
                if (r["job"], r["loader"], r["workers"]) == (row["job"], row["loader"], 1)
            ),
            None,
        )
        row["speedup_vs_1"] = row["samples_per_s"] / one if one else None
    return rows


# ---------------------------------------------------------------- main


def print_pinned(pinned: dict[str, Any]) -> None:
    if "skipped" in pinned:
        print(f"pinned batches: skipped ({pinned['skipped']})")
        return
    if "failed" in pinned:
        print(f"pinned batches: FAILED ({pinned['failed']})\n{pinned.get('stderr', '')}")
        return
    print(f"pinned batches on {pinned['gpu']} (torch {pinned['torch']}, CUDA {pinned['cuda']}):")
    rows = [
        {"loader": loader, "field": field, "pinned": c[0], "not_pinned": c[1]}
        for loader, entry in pinned["loaders"].items()
        for field, c in entry["counts"].items()
    ]
    print(
        table(
            rows,
            [
                ("loader", "loader"),
                ("field", "field"),
                ("pinned", "pinned"),
                ("not_pinned", "not pinned"),
            ],
        )
    )
    bw = pinned["bandwidth"]
    if "skipped" in bw:
        print(f"bandwidth: skipped ({bw['skipped']})")
        return
    print(
        f"\nhost to device, batches of {bw['batch_bytes'] / 2**20:.1f} MiB"
        f" ({bw['batches']} batches x {bw['rounds']} rounds):"
    )
    rows = [{"source": name, **v} for name, v in bw["gb_per_s"].items()]
    print(
        table(
            rows,
            [("source", "source"), ("median", "GB/s"), ("min", "min"), ("max", "max")],
        )
    )
    print(f"torch's pin_memory() copy: {bw['torch_pin_memory_ms_per_batch']:.2f} ms per batch")
    h = pinned["handoff"]
    print(
        f"\nhand-off (device='cuda'): {h['batches']} steps of {h['step_ms']:.2f} ms"
        f" (copy {h['copy_ms']:.2f} ms, host {h['host_ms_per_batch']:.2f} ms per batch):"
        f" {h['steps_handed_over_s']:.3f} s over chute's batches, {h['steps_on_gpu_s']:.3f} s"
        f" over batches already on the GPU = {h['ratio']:.3f}x (target <= {h['target']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--parts", default=",".join(PARTS), help="comma-separated: pinned, scaling, stages"
    )
    parser.add_argument("--jobs", default=",".join(SCALING_JOBS), help="scaling: jpeg, train, map")
    parser.add_argument("--counts", default="1,2,4,8,16", help="threads/workers (capped at cores)")
    parser.add_argument("--images", type=int, default=1500, help="500x375 JPEGs (train job)")
    parser.add_argument("--map-images", type=int, default=1500, help="256x256 JPEGs (map job)")
    parser.add_argument(
        "--jpeg-images", type=int, default=4000, help="256x256 JPEGs (jpeg job, pinned part)"
    )
    parser.add_argument("--repeat-shards", type=int, default=4, help="scaling: reads per epoch")
    parser.add_argument("--rounds", type=int, default=3, help="scaling: runs per configuration")
    parser.add_argument("--pin-batch", type=int, default=128, help="pinned part: batch size")
    parser.add_argument("--pin-keep", type=int, default=8, help="pinned part: batches timed")
    parser.add_argument("--pin-rounds", type=int, default=10, help="pinned part: timing rounds")
    parser.add_argument(
        "--array-rows", type=int, default=16384, help="pinned part: ArrayDataset rows of 4 KiB"
    )
    parser.add_argument(
        "--deadline", type=float, help="seconds after which no new configuration starts"
    )
    parser.add_argument(
        "--config-timeout", type=float, default=150, help="seconds one configuration may take"
    )
    parser.add_argument("--data-only", action="store_true", help="write the shards and stop")
    parser.add_argument(
        "--results-dir", default=str(RESULTS), help="where to save the JSON (default: %(default)s)"
    )
    args = parser.parse_args()
    if args.worker:
        pinned_worker(json.loads(args.worker))
        return
    started = time.monotonic()
    parts = args.parts.split(",")
    unknown = set(parts) - set(PARTS) | set(args.jobs.split(",")) - set(SCALING_JOBS)
    if unknown:
        parser.error(f"unknown parts or jobs {sorted(unknown)}")
    if importlib.util.find_spec("webdataset") is None:
        print("webdataset does not import: the shards are written with its TarWriter")
    urls = data_sets(args)
    print(f"data ready after {time.monotonic() - started:.0f} s", flush=True)
    if args.data_only:
        return
    gc.collect()
    results: dict[str, Any] = {"arguments": vars(args)}

    def checkpoint() -> None:
        save("device", results, Path(args.results_dir))

    def out_of_time() -> bool:
        return args.deadline is not None and time.monotonic() - started > args.deadline

    if "pinned" in parts:
        config = {
            "jpeg": urls["jpeg"],
            "map": urls["map"],
            "batch": args.pin_batch,
            "keep": args.pin_keep,
            "rounds": args.pin_rounds,
            "array_rows": args.array_rows,
            "threads": min(4, os.cpu_count() or 1),
        }
        results["pinned"] = pinned(config, args.config_timeout)
        print_pinned(results["pinned"])
        checkpoint()
    if "stages" in parts:
        # Per-image stage costs on one thread, the resize at each SIMD level
        # this CPU runs: what the eval resize costs here, and why.
        import chute_testing

        payloads = bench_transforms.jpeg_payloads(urls["train"])[: bench_transforms.LIMIT_IMAGES]
        results["simd_level"] = str(chute_testing.simd_level())
        results["stage_costs_us"] = bench_transforms.stage_costs(payloads)
        full = results["stage_costs_us"]["full-size decode"]
        print(f"\nper image on one thread (resampler SIMD level: {results['simd_level']}):")
        for name, us in results["stage_costs_us"].items():
            print(f"  {name:48s} {us:6.0f} us  {us / full:5.2f}x a full-size decode")
        checkpoint()
    if "scaling" in parts:
        scaling(args, urls, results, out_of_time, checkpoint)
        print()
        print(
            table(
                results.get("scaling", []),
                [
                    ("job", "job"),
                    ("loader", "loader"),
                    ("workers", "workers"),
                    ("runs", "runs"),
                    ("samples_per_s", "images/s"),
                    ("speedup_vs_1", "speed-up over 1"),
                    ("loader_cpu_ms_per_batch", "loader CPU ms/batch"),
                ],
            )
        )
        if "scaling_cut_by_deadline" in results:
            print(f"deadline reached in {results['scaling_cut_by_deadline']}")
        for failure in results.get("scaling_failures", []):
            print(f"FAILED: {failure}")
    checkpoint()
    print(f"wrote {Path(args.results_dir) / 'device.json'}")


if __name__ == "__main__":
    main()
