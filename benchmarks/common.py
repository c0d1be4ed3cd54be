"""Shared benchmark machinery: run one configuration in a fresh subprocess,
sample the resident memory of its whole process tree (worker processes
included) while it runs, and collect what it reports."""

from __future__ import annotations

import itertools
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _statm_rss(pid: int) -> int:
    # statm is one short line; status formats dozens. The sampler runs beside
    # the benchmark on the same 2 cores, so its own cost matters.
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants."""
    out: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(_children(p))
    return out


def tree_rss(pids: list[int]) -> int:
    """RSS of the processes (shared pages counted in each, as a user's `top`
    would add them up)."""
    return sum(_statm_rss(p) for p in pids)


def run_config(script: str, config: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Runs `script --worker CONFIG` and returns its JSON report plus
    peak_tree_rss (bytes): RSS sampled every 10 ms, the process tree
    re-listed every 100 ms (worker processes live for seconds)."""
    proc = subprocess.Popen(
        [sys.executable, script, "--worker", json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        pids: list[int] = []
        for tick in itertools.count():
            if done.is_set():
                return
            if tick % 10 == 0:
                pids = tree_pids(proc.pid)
            peak = max(peak, tree_rss(pids))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark config {config} failed:\n{err[-3000:]}")
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    report["peak_tree_rss"] = peak
    return report


def current_rss() -> int:
    return _rss_bytes(os.getpid())


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
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
