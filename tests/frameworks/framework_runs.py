"""How tests/frameworks/ start the framework runs (in a process of their
own, or two under torchrun: gloo, CPU) and read what they delivered; their
data is conftest's ``framework_data``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import chute
from conftest import FRAMEWORK_SAMPLES as SAMPLES

RUNS = Path(__file__).parent / "runs"
__all__ = ["SAMPLES", "assert_exactly_once_per_epoch", "by_epoch", "counts", "run"]


def run(script: str, out: Path, *args: str, ranks: int = 1, timeout: float = 600) -> list[Any]:
    """Runs runs/`script` OUT ARGS... in one process, or `ranks` under
    torchrun; returns each rank's record (runs/shared.py: write)."""
    env = dict(os.environ)
    # The children import the chute the tests import, installed or in-tree.
    package_root = str(Path(chute.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    cmd = [*launcher, str(RUNS / script), str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def by_epoch(*parts: list[list[Any]]) -> dict[int, list[int]]:
    """The ids of runs' (epoch, ids) steps, in order, by epoch."""
    epochs: dict[int, list[int]] = defaultdict(list)
    for part in parts:
        for epoch, ids in part:
            epochs[int(epoch)] += ids
    return dict(epochs)


def counts(epochs: dict[int, list[int]]) -> dict[int, tuple[int, int]]:
    """(ids, distinct ids) by epoch: what a failure reports."""
    return {epoch: (len(ids), len(set(ids))) for epoch, ids in sorted(epochs.items())}


def assert_exactly_once_per_epoch(ranks: list[dict[int, list[int]]], epochs: int) -> None:
    """Each epoch, over all ranks, delivers every sample once."""
    for epoch in range(epochs):
        seen = sorted(i for rank in ranks for i in rank.get(epoch, []))
        distinct = len(set(seen))
        assert seen == list(range(SAMPLES)), f"epoch {epoch}: {len(seen)} ids, {distinct} distinct"
