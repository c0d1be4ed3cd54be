"""chute.common.rss: the resident-memory figures behind `chute bench` and benchmarks/."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chute.common import rss

MIB = 1 << 20
SHARED = 64 * MIB

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/smaps_rollup").exists(), reason="needs /proc smaps_rollup"
)


def test_pss_counts_a_page_shared_by_two_processes_once() -> None:
    # Both processes map and touch the same 64 MiB of shared memory: the
    # RSS sum counts it twice, the PSS sum once.
    fd = os.memfd_create("chute-test-rss")
    child = None
    try:
        os.ftruncate(fd, SHARED)
        region = mmap.mmap(fd, SHARED, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        region.write(b"\x01" * SHARED)
        reader = (
            "import mmap, sys\n"
            f"m = mmap.mmap({fd}, {SHARED}, mmap.MAP_SHARED, mmap.PROT_READ)\n"
            f"total = sum(m[i] for i in range(0, {SHARED}, 4096))\n"
            "print(total, flush=True)\n"
            "sys.stdin.read()\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", reader],
            pass_fds=(fd,),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert int(child.stdout.readline()) == SHARED // 4096
        pids = [os.getpid(), child.pid]
        rss_sum = rss.tree_rss(pids)
        pss_sum = sum(rss.process_pss(p) for p in pids)
        assert all(rss.process_pss(p) > 0 for p in pids)
        assert rss_sum - pss_sum > SHARED * 3 // 4, (rss_sum, pss_sum)
        region.close()
    finally:
        if child is not None:
            child.communicate("")
        os.close(fd)


def test_pss_of_a_missing_process_is_zero() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert rss.process_pss(gone.pid) == 0


def test_peak_rss_samples_pss_only_when_asked() -> None:
    with rss.PeakRss(interval=0.005) as plain:
        pass
    with rss.PeakRss(interval=0.005, pss_every=1) as sampled:
        pass
    assert plain.peak > 0 and plain.peak_pss == 0
    assert 0 < sampled.peak_pss <= sampled.peak
