"""Memory: peak RSS of the whole process tree, chute vs torch's DataLoader.

    python benchmarks/bench_memory.py            # default (< ~3 min on 2 cores)
    python benchmarks/bench_memory.py --quick    # smaller, for a smoke run

Jobs (each configuration in a fresh subprocess, sampled every 10 ms by
common.run_config; worker processes are part of the tree):

- tar: JPEG + class shards, decode to uint8 HWC, batches of 32, one epoch.
  chute.DataLoader(chute.WebDataset) vs torch DataLoader(webdataset.WebDataset).
- h5: rows of float32 in a gzip-chunked HDF5 file, shuffled batches of 256.
  chute.DataLoader(chute.H5Dataset) vs torch DataLoader over a map-style
  h5py Dataset (file opened lazily in each worker, one read per row).

Both with num_workers 0 and 2 (chute: native threads, max(1, num_workers)).
Reported: peak tree RSS, and growth = peak - RSS right after `import torch`
(the part the loader is responsible for).

Long run: chute over the tar job and the h5 job for 50 epochs in one
process; RSS after each epoch is printed, and the growth (median of the last
ten epochs against the median of epochs 2-11) must stay under 1% (flat
means no leak).

Results go to benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import current_rss, run_config, save, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "memory"
MB = 1 << 20
BASELINE_MAX_S = 15.0


# -- data ----------------------------------------------------------------------------------


def make_data(quick: bool) -> dict[str, Any]:
    import h5py
    import numpy as np

    images = 600 if quick else 2400
    rows = 20_000 if quick else 100_000
    DATA.mkdir(parents=True, exist_ok=True)
    tar_dir = DATA / f"tar_{images}"
    shards = sorted(str(p) for p in tar_dir.glob("*.tar"))
    if not shards:
        import io

        import webdataset
        from PIL import Image

        tar_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        per_shard = images // 8
        for s in range(8):
            with webdataset.TarWriter(str(tar_dir / f"shard-{s:04d}.tar")) as sink:
                for i in range(per_shard):
                    y = np.linspace(0, 255, 128)[:, None, None]
                    pixels = np.clip(y + rng.normal(0, 20, (128, 128, 3)), 0, 255)
                    buf = io.BytesIO()
                    Image.fromarray(pixels.astype(np.uint8)).save(buf, format="JPEG", quality=85)
                    sink.write({"__key__": f"s{s}_{i:05d}", "jpg": buf.getvalue(), "cls": i % 10})
        shards = sorted(str(p) for p in tar_dir.glob("*.tar"))
    h5 = DATA / f"rows_{rows}.h5"
    if not h5.exists():
        tmp = h5.with_suffix(".tmp")
        with h5py.File(tmp, "w") as f:
            data = np.random.default_rng(1).standard_normal((rows, 64)).astype("f4")
            f.create_dataset("x", data=data, chunks=(1024, 64), compression="gzip", shuffle=True)
            f.create_dataset("y", data=np.arange(rows, dtype="i8"), chunks=(4096,))
        tmp.rename(h5)
    return {"shards": shards, "h5": str(h5), "images": images, "rows": rows}


# -- worker side ----------------------------------------------------------------------------


class H5RowDataset:
    """The usual map-style baseline: h5py opened lazily (once per worker)."""

    def __init__(self, path: str) -> None:
        import h5py

        self.path = path
        with h5py.File(path, "r") as f:
            self.n = len(f["x"])
        self.file: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import h5py
        import torch

        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return {"x": torch.from_numpy(self.file["x"][i]), "y": int(self.file["y"][i])}


def make_loader(cfg: dict[str, Any]) -> Any:
    import torch

    workers = cfg["workers"]
    if cfg["job"] == "tar":
        if cfg["impl"] == "chute":
            import chute

            ds = chute.WebDataset(cfg["shards"], shardshuffle=False).decode("rgb8")
            return chute.DataLoader(ds.to_tuple("jpg", "cls"), batch_size=32, num_workers=workers)
        import webdataset

        ds = webdataset.WebDataset(cfg["shards"], shardshuffle=False).decode("rgb8")
        return torch.utils.data.DataLoader(
            ds.to_tuple("jpg", "cls"), batch_size=32, num_workers=workers
        )
    gen = torch.Generator().manual_seed(0)
    if cfg["impl"] == "chute":
        import chute

        ds = chute.H5Dataset(cfg["h5"], {"x": "x", "y": "y"})
        return chute.DataLoader(
            ds, batch_size=256, shuffle=True, num_workers=workers, generator=gen
        )
    return torch.utils.data.DataLoader(
        H5RowDataset(cfg["h5"]), batch_size=256, shuffle=True, num_workers=workers, generator=gen
    )


def epoch(loader: Any, max_seconds: float = float("inf")) -> int:
    n = 0
    start = time.perf_counter()
    for batch in loader:
        first = batch[0] if isinstance(batch, (list, tuple)) else batch["x"]
        n += len(first)
        if time.perf_counter() - start > max_seconds:
            break
    return n


def worker(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch  # noqa: F401  (the reference point of "growth")

    after_torch = current_rss()
    if cfg["job"] == "long":
        return long_run(cfg, after_torch)
    loader = make_loader(cfg)
    start = time.perf_counter()
    # The per-row h5py baseline needs minutes for an epoch; its peak RSS is
    # reached within seconds (workers started, caches filled), so it stops
    # after BASELINE_MAX_S and reports how many items it got to.
    items = epoch(loader, BASELINE_MAX_S if cfg["impl"] != "chute" else float("inf"))
    return {
        "rss_after_import_torch": after_torch,
        "items": items,
        "seconds": time.perf_counter() - start,
    }


def long_run(cfg: dict[str, Any], after_torch: int) -> dict[str, Any]:
    import gc

    out: dict[str, Any] = {"rss_after_import_torch": after_torch}
    for job in ("tar", "h5"):
        loader = make_loader({**cfg, "job": job, "impl": "chute", "workers": 2})
        rss: list[int] = []
        for e in range(cfg["epochs"]):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(e)
            epoch(loader)
            gc.collect()
            rss.append(current_rss())
            print(f"{job} epoch {e + 1:2d}: RSS {rss[-1] / MB:.1f} MB", file=sys.stderr)
        out[job] = rss
    return out


# -- driver ---------------------------------------------------------------------------------


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    data = make_data(args.quick)
    script = str(Path(__file__).resolve())
    rows: list[dict[str, Any]] = []
    impls = {"tar": ("chute", "torch+webdataset"), "h5": ("chute", "torch+h5py")}
    for job, names in impls.items():
        for workers in (0, 2):
            for name in names:
                cfg = {**data, "job": job, "impl": name.split("+")[0], "workers": workers}
                report = run_config(script, cfg)
                row = {
                    "job": job,
                    "loader": name,
                    "workers": workers,
                    "items": report["items"],
                    "seconds": report["seconds"],
                    "peak_mb": report["peak_tree_rss"] / MB,
                    "growth_mb": (report["peak_tree_rss"] - report["rss_after_import_torch"]) / MB,
                }
                rows.append(row)
                print(f"{job:3s} {name:17s} workers={workers}: peak {row['peak_mb']:.0f} MB")
    for job, names in impls.items():
        for workers in (0, 2):
            pair = {r["loader"]: r for r in rows if r["job"] == job and r["workers"] == workers}
            ours, theirs = pair[names[0]], pair[names[1]]
            ours["peak_vs_torch"] = ours["peak_mb"] / theirs["peak_mb"]
            ours["growth_vs_torch"] = ours["growth_mb"] / max(theirs["growth_mb"], 1e-9)

    long_report = run_config(script, {**data, "job": "long", "epochs": args.epochs})
    long_rows = []
    for job in ("tar", "h5"):
        rss = long_report[job]
        long_rows.append(
            {
                "job": job,
                "epochs": len(rss),
                "epoch1_mb": rss[0] / MB,
                "last_mb": rss[-1] / MB,
                "max_mb": max(rss) / MB,
                # RSS after single epochs swings with the allocator's trimming
                # (glibc gives freed memory back in steps); compare the median
                # of the first ten epochs after the first with the last ten.
                "growth_pct": 100.0
                * (_median(rss[-10:]) - _median(rss[1:11]))
                / _median(rss[1:11]),
            }
        )
    columns = [
        ("job", "job"),
        ("loader", "loader"),
        ("workers", "workers"),
        ("items", "items"),
        ("seconds", "s"),
        ("peak_mb", "peak tree RSS MB"),
        ("growth_mb", "above import torch MB"),
        ("peak_vs_torch", "peak/torch"),
        ("growth_vs_torch", "growth/torch"),
    ]
    print(table(rows, columns))
    print()
    print(
        table(
            long_rows,
            [
                ("job", "long run (chute, 2 threads)"),
                ("epochs", "epochs"),
                ("epoch1_mb", "RSS after epoch 1 MB"),
                ("last_mb", "after last MB"),
                ("max_mb", "max MB"),
                ("growth_pct", "growth % (median last 10 vs epochs 2-11)"),
            ],
        )
    )
    path = save(
        "memory",
        {
            "note": "machine shared with other jobs; peaks sampled every 10 ms",
            "cpu_affinity": len(os.sched_getaffinity(0)),
            "data": {"images": data["images"], "rows": data["rows"]},
            "configs": rows,
            "long_run": long_rows,
            "long_run_rss_per_epoch": {job: long_report[job] for job in ("tar", "h5")},
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
