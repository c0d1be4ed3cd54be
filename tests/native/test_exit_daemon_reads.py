"""A daemon thread inside a native read when the interpreter finalizes is
parked, not aborted. Python ends such a thread with pthread_exit once it
takes the GIL back; unwinding through py::gil_scoped_release's destructor
(noexcept) called std::terminate ("terminate called without an active
exception"). The reads that chute's own daemon threads make (tokenize_shards'
reader reads tar shards so) release the GIL through ReleasedGil instead.
The case runs in a subprocess, since the failure kills the process."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import chute
import pytest

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

# The read ends (its pipe's `sleep` passes) while the main thread is still
# finalizing: an object of __main__ whose teardown waits longer.
EXIT_DURING_READ = """
import sys, threading, time
sys.path.insert(0, {python!r})
from chute import _core
started = threading.Event()
def read():
    started.set()
    _core.read_tar_samples({url!r})
threading.Thread(target=read, daemon=True).start()
started.wait()
class SlowTeardown:
    def __init__(self):
        self.sleep = time.sleep  # the module may be gone when it runs
    def __del__(self):
        self.sleep(3)
keeper = SlowTeardown()
print("exiting", flush=True)
"""


def write_shard(path: Path) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(3):
            data = f"sample {i}".encode()
            info = tarfile.TarInfo(f"s{i}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_exit_while_a_daemon_thread_reads_a_tar_shard(tmp_path: Path) -> None:
    shard = tmp_path / "shard.tar"
    write_shard(shard)
    python_dir = str(Path(chute.__file__).parent.parent)
    url = f"pipe:sleep 1; cat {shlex.quote(str(shard))}"
    script = textwrap.dedent(EXIT_DURING_READ.format(python=python_dir, url=url))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert "terminate called" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "exiting"
