"""Random access into tar shards: chute.TarDataset with a full random shuffle,
against the same shards streamed by chute with a 1,000-sample shuffle buffer,
and against webdataset's indexed dataset (``wids.ShardListDataset``) in
torch's DataLoader.

The data is bench_wds.py's JPEG job: 256x256 JPEGs + `cls`, decoded to uint8
CHW tensors, batches of 64. Every loader runs in its own subprocess (the
parent samples the RSS of the whole process tree) on a warm page cache (the
shards are read once before the first run); the indexes are built before the
timed runs (their build time is reported on its own). chute's loaders run
--repeats times and their median run is reported; wids runs once per worker
count and its best count is reported. The targets (issue 14): TarDataset at
least 90% of chute's streaming throughput, and at least 3x wids. The load
average before and after is printed and saved: on a shared machine the
figures mean little without it.

    python benchmarks/bench_tardataset.py            # 4,000 JPEGs
    python benchmarks/bench_tardataset.py --quick    # 400
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_wds import jpeg_shards  # noqa: E402
from common import current_rss, run_config, save, table  # noqa: E402

BATCH = 64
SHUFFLE_BUFFER = 1000


def wids_sample(sample: dict[str, Any]) -> tuple[Any, int]:
    """A wids sample as webdataset's ``decode("torchrgb8").to_tuple("jpg",
    "cls")`` makes it (wids hands over file-like members keyed ".jpg")."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(sample[".jpg"]) as img:
        pixels = np.asarray(img.convert("RGB"))
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy()), int(sample[".cls"].read())


def _same_path(url: str) -> str:
    """wids' local name of a local shard: the shard itself (no copy)."""
    return url


def worker(config: dict[str, Any]) -> None:
    import torch

    rss_after_torch = current_rss()
    kind, workers, urls = config["loader"], config["workers"], config["urls"]
    generator = torch.Generator().manual_seed(0)
    loader: Any
    if kind == "tardataset":
        import chute

        ds = chute.TarDataset(urls, decode="torchrgb8", fields=("jpg", "cls"))
        loader = chute.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    elif kind == "stream":
        import chute

        stream = (
            chute.WebDataset(urls, shardshuffle=True)
            .shuffle(SHUFFLE_BUFFER)
            .decode("torchrgb8")
            .to_tuple("jpg", "cls")
            .batched(BATCH)
        )
        loader = chute.DataLoader(stream, batch_size=None, num_workers=workers)
    else:
        import wids

        shards = [{"url": u, "nsamples": n} for u, n in zip(urls, config["counts"], strict=True)]
        ds = wids.ShardListDataset(
            shards, transformations=[wids_sample], localname=_same_path, lru_size=len(urls)
        )
        loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    # Importing torch leaves a full collection due; not inside the timed loop.
    gc.collect()
    start = time.perf_counter()
    first = None
    samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        samples += len(batch[1])
    seconds = time.perf_counter() - start
    stats = loader.stats() if hasattr(loader, "stats") else {}
    print(
        json.dumps(
            {
                "samples": samples,
                "seconds": seconds,
                "first_batch_seconds": first,
                "rss_after_import_torch": rss_after_torch,
                "reads": stats.get("reads"),
                "bytes_read": stats.get("bytes_read"),
            }
        )
    )


def warm(paths: list[str]) -> None:
    """Reads every shard once, so every loader starts on a warm page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each chute loader")
    parser.add_argument("--wids-workers", default="0,1,2", help="torch workers tried for wids")
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    from chute.loader.engine import default_threads
    from chute.sources import tarindex

    urls = jpeg_shards(400 if args.quick else 4_000)
    warm(urls)
    load_before = os.getloadavg()
    started = time.perf_counter()
    for u in urls:
        tarindex.write_index(u)
    index_seconds = time.perf_counter() - started
    counts = [len(tarindex.read_index(u)["samples"]) for u in urls]
    total = sum(counts)
    print(f"{len(urls)} shards, {total} samples; indexes built in {index_seconds:.2f} s")
    script = str(Path(__file__).resolve())
    threads = default_threads()
    rows: list[dict[str, Any]] = []
    runs_of: dict[str, list[float]] = {}
    configs = [("tardataset", threads, args.repeats), ("stream", threads, args.repeats)] + [
        ("wids", int(w), 1) for w in args.wids_workers.split(",")
    ]
    for kind, workers, repeats in configs:
        runs: list[dict[str, Any]] = []
        for _ in range(repeats):
            report = run_config(
                script, {"loader": kind, "workers": workers, "urls": urls, "counts": counts}
            )
            run = {
                "loader": {
                    "tardataset": "chute.TarDataset, full shuffle",
                    "stream": f"chute.WebDataset, shuffle({SHUFFLE_BUFFER})",
                    "wids": "torch DataLoader + wids",
                }[kind],
                "kind": kind,
                "workers": workers,
                "samples": report["samples"],
                "samples_per_s": report["samples"] / report["seconds"],
                "first_batch_s": report["first_batch_seconds"],
                "peak_rss_mib": report["peak_tree_rss"] / 2**20,
                "reads": report["reads"],
                "bytes_read": report["bytes_read"],
            }
            runs.append(run)
            print(
                f"  {run['loader']:36s} workers={workers}: {run['samples_per_s']:,.0f} samples/s",
                flush=True,
            )
        runs_of[f"{kind}-{workers}"] = [r["samples_per_s"] for r in runs]
        runs.sort(key=lambda r: r["samples_per_s"])
        rows.append(runs[len(runs) // 2])
    load_after = os.getloadavg()
    ours = next(r for r in rows if r["kind"] == "tardataset")
    stream = next(r for r in rows if r["kind"] == "stream")
    best_wids = max((r for r in rows if r["kind"] == "wids"), key=lambda r: r["samples_per_s"])
    summary = {
        "tardataset_samples_per_s": ours["samples_per_s"],
        "stream_samples_per_s": stream["samples_per_s"],
        "best_wids_samples_per_s": best_wids["samples_per_s"],
        "best_wids_workers": best_wids["workers"],
        "fraction_of_stream": ours["samples_per_s"] / stream["samples_per_s"],
        "speedup_over_wids": ours["samples_per_s"] / best_wids["samples_per_s"],
        "reads_per_batch": (ours["reads"] or 0) / max(1, -(-ours["samples"] // BATCH)),
        "index_build_seconds": index_seconds,
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
    }
    print()
    print(
        table(
            rows,
            [
                ("loader", "loader"),
                ("workers", "workers"),
                ("samples_per_s", "samples/s"),
                ("first_batch_s", "first batch s"),
                ("peak_rss_mib", "peak RSS MiB"),
            ],
        )
    )
    print()
    print(
        f"TarDataset (full shuffle): {summary['fraction_of_stream']:.0%} of chute's streaming"
        f" throughput with a {SHUFFLE_BUFFER}-sample buffer (target >= 90%),"
        f" {summary['speedup_over_wids']:.1f}x wids at num_workers={best_wids['workers']}"
        f" (target >= 3x); {summary['reads_per_batch']:.1f} reads per batch"
    )
    print(
        "load average (1/5/15 min) before: "
        + "/".join(f"{x:.2f}" for x in load_before)
        + ", after: "
        + "/".join(f"{x:.2f}" for x in load_after)
    )
    path = save(
        "tardataset_quick" if args.quick else "tardataset",
        {"rows": rows, "runs": runs_of, "summary": summary},
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
