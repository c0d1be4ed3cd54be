"""Files cut while chute has them mapped: a clear error, never a dead process,
also when other code installed its own SIGBUS handler after chute's first
use (faulthandler.enable() does). Each case runs in a subprocess, since the
failure being guarded against kills the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import chute
import pytest

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

PRELUDE = """
import faulthandler, os, sys
sys.path.insert(0, {python!r})
sys.path.insert(0, {tests!r})
from pathlib import Path
import numpy as np
import chute
from conftest import write_shards
tmp = Path({tmp!r})
"""


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """`body` in a fresh interpreter that imports the chute under test."""
    script = PRELUDE.format(
        python=str(Path(chute.__file__).parent.parent),
        tests=str(Path(__file__).parents[1]),  # tests/, where conftest is
        tmp=str(tmp_path),
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


TAR_CUT = """
samples = [{"__key__": f"k{i:04d}", "bin": os.urandom(20000)} for i in range(200)]
warm = Path(write_shards(tmp / "w", samples[:10], 10)[0])
list(chute.WebDataset([str(warm)], shardshuffle=False).to_tuple("__key__"))  # chute's first use
if "{when}" == "before":
    faulthandler.enable()
path = Path(write_shards(tmp / "s", samples, 200)[0])
ds = chute.WebDataset([str(path)], shardshuffle=False, prefetch=1, threads=1)
it = iter(ds.to_tuple("__key__", "bin").batched(4))
next(it)
if "{when}" == "during":
    faulthandler.enable()
os.truncate(path, os.path.getsize(path) // 3 + 100)
try:
    for _ in it:
        pass
except chute.DataError as e:
    print("DataError:", e)
"""


@pytest.mark.parametrize("when", ["before", "during"])
def test_tar_shard_cut_while_mapped_with_faulthandler(tmp_path: Path, when: str) -> None:
    done = run(tmp_path, TAR_CUT.replace("{when}", when))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DataError:" in done.stdout and "truncated" in done.stdout
    if when == "before":
        assert "Fatal Python error" not in done.stderr
    # Enabled mid-read, faulthandler may see one fault before chute's handler
    # is back (and print its report); the process goes on regardless.


def test_hdf5_rows_cut_while_mapped_with_faulthandler(tmp_path: Path) -> None:
    done = run(
        tmp_path,
        """
        import chute_testing
        path = tmp / "rows.bin"
        path.write_bytes(bytes(range(256)) * 256)
        chute_testing.mapped_read(str(path), 0, 100)  # chute's first use
        faulthandler.enable()
        os.truncate(path, 8000)
        try:
            chute_testing.mapped_read(str(path), 0, 64 << 10)
        except chute.ReadError as e:
            print("ReadError:", e)
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ReadError:" in done.stdout and "Fatal Python error" not in done.stderr


@pytest.mark.parametrize("faulthandler_on", [False, True])
def test_array_dataset_over_a_npy_cut_while_mapped(tmp_path: Path, faulthandler_on: bool) -> None:
    done = run(
        tmp_path,
        f"""
        path = tmp / "emb.npy"
        np.save(path, np.arange(400_000, dtype="f4").reshape(100_000, 4))
        ds = chute.ArrayDataset(emb=path)
        first = next(iter(chute.DataLoader(ds, batch_size=64)))["emb"]
        assert first[1].tolist() == [4.0, 5.0, 6.0, 7.0]
        if {faulthandler_on}:
            faulthandler.enable()
        os.truncate(path, 128 + 16 * 30_000 + 5)  # rows 30,000 and on are cut off
        loader = chute.DataLoader(ds, batch_size=1000, num_workers=2)
        seen = 0
        try:
            for batch in loader:
                assert batch["emb"][-1, 0].item() == 4.0 * (seen + 999)  # never zeros
                seen += 1000
        except chute.ReadError as e:
            print("ReadError at", seen, ":", e)
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ReadError at 30000 " in done.stdout, done.stdout  # 30 whole batches, then the cut
    assert "emb.npy" in done.stdout and "rows 30000 and on are gone" in done.stdout


def test_faults_that_are_not_chutes_still_reach_faulthandler(tmp_path: Path) -> None:
    # chute puts its handler back over faulthandler's and keeps that one for
    # the faults that are not its own: faulthandler still reports them and
    # the process still dies of them.
    done = run(
        tmp_path,
        """
        import mmap
        samples = [{"__key__": f"k{i}", "bin": os.urandom(100)} for i in range(4)]
        warm = Path(write_shards(tmp / "w", samples, 4)[0])
        faulthandler.enable()
        list(chute.WebDataset([str(warm)], shardshuffle=False).to_tuple("__key__"))
        path = tmp / "other.bin"
        path.write_bytes(b"x" * 65536)
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), 65536)
            os.truncate(path, 0)
            print(m[40000])
        """,
    )
    # Under a sanitizer its own handler ends the process after faulthandler's report.
    deaths = {-signal.SIGBUS} | ({-signal.SIGABRT} if os.environ.get("CHUTE_SANITIZER") else set())
    assert done.returncode in deaths, (done.returncode, done.stderr[-2000:])
    assert "Fatal Python error: Bus error" in done.stderr
