"""Resident memory of a process and its descendants (torch worker processes),
from /proc, and a thread that samples its peak: the one sampler behind
``chute bench`` and ``benchmarks/``.

Standard library only, and no import of the rest of chute: the benchmarks
load this file on its own, so that a run's memory baseline (or a run of
another loader) does not include chute.
"""

from __future__ import annotations

import os
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_rss(pid: int) -> int:
    """Resident bytes of one process (0 when it is gone or /proc is missing)."""
    # statm is one short line (status formats dozens): the sampler runs beside
    # what it measures, on the same cores, so its own cost matters.
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def process_pss(pid: int) -> int:
    """Proportional set size of one process, in bytes: each shared page
    divided among the processes that map it, so a tree's sum counts a
    shared-memory batch once (0 when it is gone or smaps_rollup is missing).
    The kernel walks the process's page tables to answer: sample it less
    often than RSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return 0
    return 0


def child_pids(pid: int) -> list[int]:
    """The direct children of a process, over all its threads."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except (OSError, ValueError):
        pass
    return out


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants."""
    out: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(child_pids(p))
    return out


def tree_rss(pids: list[int]) -> int:
    """RSS of the processes, shared pages counted in each (as a user adding up
    `top`'s column would)."""
    return sum(process_rss(p) for p in pids)


class PeakRss:
    """Peak RSS of the process tree under `pid` (default: this process) while
    the ``with`` block runs: sampled every `interval` seconds on a thread,
    the tree re-listed every `relist_every` samples. With `pss_every`, also
    the peak of the tree's summed PSS (``peak_pss``), every that many
    samples. Where /proc is missing, the peak of this process is taken from
    getrusage instead (and peak_pss stays 0)."""

    def __init__(
        self,
        pid: int | None = None,
        interval: float = 0.02,
        relist_every: int = 1,
        pss_every: int = 0,
    ) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.interval = interval
        self.relist_every = max(1, relist_every)
        self.pss_every = pss_every
        self.peak = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pids: list[int] = []
        tick = 0
        # At least one sample, however soon the block ends.
        while True:
            if tick % self.relist_every == 0:
                pids = tree_pids(self.pid)
            self.peak = max(self.peak, tree_rss(pids))
            if self.pss_every and tick % self.pss_every == 0:
                self.peak_pss = max(self.peak_pss, sum(process_pss(p) for p in pids))
            tick += 1
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.peak == 0 and self.pid == os.getpid():
            import resource  # Unix only, and needed only without /proc

            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
