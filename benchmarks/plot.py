"""Charts of the saved benchmark results: benchmarks/results/*.json -> *.png.

    python benchmarks/plot.py                    # every result file
    python benchmarks/plot.py results/h5.json    # some of them

Each known result format gets one PNG next to it (chute against the
pure-Python loaders, per job), plus ``<name>_threads.png`` when the file holds
throughput at several thread counts. Formats:

- ``wds*.json`` (bench_wds.py): ``rows`` of {job, loader, workers,
  samples_per_s, peak_rss_mib}; optional ``thread_scaling`` rows of {job,
  threads, samples_per_s} (``bench_wds.py --threads 1,2,4``).
- ``h5*.json`` (bench_h5.py): ``results`` of {label, samples_per_s, mb_per_s,
  config: {group, kind, comp, shuffle, workers | threads}}.
- ``decode_limit.json`` (decode_limit.py): chute and Pillow images/s.

Files in another format are reported and skipped. Needs matplotlib
(``pip install chute[bench]``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CHUTE = "#d1495b"
PYTHON = "#8d99ae"
OTHER = "#2e86ab"


def _bars(ax: Axes, labels: list[str], values: list[float], colors: list[str], unit: str) -> None:
    """Horizontal bars with the value written at the end of each; log scale
    when the values span more than 20x (chute vs Python is often 100x)."""
    y = list(range(len(labels)))
    ax.barh(y, values, color=colors)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(unit)
    for i, v in enumerate(values):
        ax.annotate(
            f" {v:,.0f}" if v >= 10 else f" {v:.2g}",
            (v, i),
            va="center",
            fontsize=8,
        )
    ax.margins(x=0.25)
    ax.grid(axis="x", alpha=0.3)


def _color(loader: str) -> str:
    return CHUTE if "chute" in loader.lower() or "arraydataset" in loader.lower() else PYTHON


def plot_wds(name: str, data: dict[str, Any], out: Path) -> list[Path]:
    rows = data["rows"]
    jobs = list(dict.fromkeys(r["job"] for r in rows))
    fig, axes = plt.subplots(2, len(jobs), figsize=(6 * len(jobs), 6.5), squeeze=False)
    for col, job in enumerate(jobs):
        job_rows = [r for r in rows if r["job"] == job]
        labels = [
            f"{'chute' if 'chute' in r['loader'] else 'torch + webdataset'}\n"
            f"{'threads' if 'chute' in r['loader'] else 'workers'}={r['workers']}"
            for r in job_rows
        ]
        colors = [_color(r["loader"]) for r in job_rows]
        _bars(axes[0][col], labels, [r["samples_per_s"] for r in job_rows], colors, "samples/s")
        axes[0][col].set_title(f"{job}: throughput (higher is better)")
        _bars(axes[1][col], labels, [r["peak_rss_mib"] for r in job_rows], colors, "MiB")
        axes[1][col].set_title(f"{job}: peak RSS, all processes (lower is better)")
    _caption(fig, name, data)
    paths = [_save(fig, out / f"{name}.png")]
    scaling = data.get("thread_scaling")
    if scaling:
        paths.append(_plot_scaling(name, scaling, "job", out))
    return paths


def _plot_scaling(name: str, rows: list[dict[str, Any]], series: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key in dict.fromkeys(r[series] for r in rows):
        points = sorted((r["threads"], r["samples_per_s"]) for r in rows if r[series] == key)
        xs = [p[0] for p in points]
        ax.plot(xs, [p[1] for p in points], marker="o", label=str(key))
        ax.set_xticks(sorted({r["threads"] for r in rows}))
    ax.set_xlabel("native threads")
    ax.set_ylabel("samples/s")
    ax.set_yscale("log")
    ax.set_title(f"{name}: chute throughput against threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the lines
    return _save(fig, out / f"{name}_threads.png")


def plot_h5(name: str, data: dict[str, Any], out: Path) -> list[Path]:
    results = data["results"]
    groups = list(dict.fromkeys(r["config"]["group"] for r in results))
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups) + 0.8), squeeze=False)
    titles = {
        "a": "small rows: rows/s",
        "b": "large rows, sequential and shuffled: MB/s",
        "c": "in-memory arrays: rows/s",
    }
    for ax, group in zip((a[0] for a in axes), groups, strict=True):
        rows = [r for r in results if r["config"]["group"] == group]
        by_mb = group == "b"
        values = [float(r["mb_per_s"] if by_mb else r["samples_per_s"]) for r in rows]
        colors = [
            OTHER if r["config"]["kind"] == "pagecache" else _color(r["config"]["kind"])
            for r in rows
        ]
        labels = [r["label"].split(" ", 1)[1] if r["label"][:2] == f"{group} " else r["label"]
                  for r in rows]  # fmt: skip
        _bars(ax, labels, values, colors, "MB/s" if by_mb else "rows/s")
        ax.set_title(titles.get(group, f"group {group}"))
    _caption(fig, name, data)
    paths = [_save(fig, out / f"{name}.png")]
    scaling = [
        {
            "series": f"{r['config'].get('comp', '')} "
            + ("shuffle" if r["config"].get("shuffle") else "seq"),
            "threads": r["config"]["threads"],
            "samples_per_s": r["samples_per_s"],
        }
        for r in results
        if "threads" in r["config"] and r.get("samples_per_s") and r["config"]["group"] == "a"
    ]
    if len({s["threads"] for s in scaling}) > 1:
        paths.append(_plot_scaling(name, scaling, "series", out))
    return paths


def plot_decode(name: str, data: dict[str, Any], out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(6.5, 2.6))
    _bars(
        ax,
        ["chute (libjpeg-turbo)", f"Pillow {data.get('pillow', '')}".strip()],
        [data["chute_images_per_s"], data["pil_images_per_s"]],
        [CHUTE, PYTHON],
        "images/s, one thread",
    )
    size = data.get("size", ["?", "?"])
    ax.set_title(f"JPEG decode, {size[0]}x{size[1]}, from memory ({data['speedup']:.2f}x)")
    _caption(fig, name, data)
    return [_save(fig, out / f"{name}.png")]


def _caption(fig: Any, name: str, data: dict[str, Any]) -> None:
    machine = data.get("machine")  # a dict in bench_wds.py, the arch string elsewhere
    cpus = (machine.get("cpus") if isinstance(machine, dict) else None) or data.get(
        "cpus", data.get("cpu_count")
    )
    bits = [f"benchmarks/results/{name}.json"]
    if cpus:
        bits.append(f"{cpus} CPUs")
    if data.get("date"):
        bits.append(str(data["date"]))
    fig.text(0.01, 0.005, ", ".join(bits), fontsize=7, color="#555555")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plotter_for(data: Any) -> Callable[[str, dict[str, Any], Path], list[Path]] | None:
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("rows"), list) and data["rows"] and "job" in data["rows"][0]:
        return plot_wds
    if isinstance(data.get("results"), list) and data["results"] and "config" in data["results"][0]:
        return plot_h5
    if "chute_images_per_s" in data and "pil_images_per_s" in data:
        return plot_decode
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="result files (default: all)")
    parser.add_argument("--out", type=Path, help="directory for the PNGs (default: beside each)")
    args = parser.parse_args(argv)
    files = args.files or sorted(RESULTS.glob("*.json"))
    if not files:
        print(f"no result files in {RESULTS}", file=sys.stderr)
        return 1
    status = 0
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            status = 1
            continue
        plot = plotter_for(data)
        if plot is None:
            print(f"{path}: unknown result format, skipped", file=sys.stderr)
            continue
        out = args.out or path.parent
        out.mkdir(parents=True, exist_ok=True)
        for png in plot(path.stem, data, out):
            print(f"wrote {png}")
    return status


if __name__ == "__main__":
    sys.exit(main())
