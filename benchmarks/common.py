"""Shared benchmark machinery: run one configuration in a fresh subprocess,
sample the resident memory of its whole process tree (worker processes
included) while it runs, and collect what it reports."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parent / "data"


def _load_rss() -> ModuleType:
    """chute's RSS sampler (chute/common/rss.py), loaded from its file without
    importing chute: a worker's baseline RSS, and the runs of other loaders,
    must not include chute."""
    package = importlib.util.find_spec("chute")
    if package is None or not package.submodule_search_locations:
        raise ImportError("chute is not installed (or on PYTHONPATH)")
    path = Path(list(package.submodule_search_locations)[0]) / "common" / "rss.py"
    spec = importlib.util.spec_from_file_location("chute_rss_standalone", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rss = _load_rss()


def run_config(script: str, config: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Runs `script --worker CONFIG` and returns its JSON report plus
    peak_tree_rss (bytes): RSS sampled every 10 ms, the process tree
    re-listed every 100 ms (worker processes live for seconds); and
    peak_tree_pss (bytes): the tree's proportional set size, every 100 ms."""
    proc = subprocess.Popen(
        [sys.executable, script, "--worker", json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with rss.PeakRss(proc.pid, interval=0.01, relist_every=10, pss_every=10) as sampled:
        out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark config {config} failed:\n{err[-3000:]}")
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    report["peak_tree_rss"] = sampled.peak
    report["peak_tree_pss"] = sampled.peak_pss
    return report


def current_rss() -> int:
    """RSS of this process, in bytes."""
    return int(rss.process_rss(os.getpid()))


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def save(name: str, payload: dict[str, Any], directory: Path = RESULTS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    payload = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), **payload}
    path.write_text(json.dumps(payload, indent=2))
    return path


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """Plain-text table: columns are (key, heading)."""
    cells = [[h for _, h in columns]]
    for row in rows:
        cells.append([_fmt(row.get(k)) for k, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cached_shards(
    name: str, samples: Callable[[], Iterable[dict[str, Any]]], per_shard: int
) -> list[str]:
    """The shards of data set `name` under benchmarks/data: written once from
    `samples()` with webdataset's TarWriter (`per_shard` samples each), then
    found again by the marker the write leaves."""
    import webdataset

    directory = DATA / name
    marker = directory / "done.json"
    if marker.exists():
        return list(json.loads(marker.read_text()))
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    sink = None
    for i, sample in enumerate(samples()):
        if i % per_shard == 0:
            if sink is not None:
                sink.close()
            path = directory / f"shard-{i // per_shard:06d}.tar"
            paths.append(str(path))
            sink = webdataset.TarWriter(str(path))
        assert sink is not None
        sink.write(sample)
    if sink is not None:
        sink.close()
    marker.write_text(json.dumps(paths))
    return paths
