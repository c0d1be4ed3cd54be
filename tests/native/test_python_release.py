"""Python objects that native code holds (a row group's buffers handed to a
BlockFeed or a BlockSampleSource) are released on threads Python knows,
never on an engine thread: engine threads never take the GIL. When a parse
thread dropped a row group's buffers itself, it took the GIL to do so, so an
engine deallocated without close() (its threads joined with the GIL held)
waited forever for a thread that waited for the GIL. The scripts run in a
subprocess, whose timeout bounds that hang; a scan of the sources checks that
no native code takes the GIL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import chute
import pytest

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

ROOT = Path(os.environ.get("CHUTE_SOURCE_ROOT") or Path(__file__).resolve().parents[2])

# A BlockFeed of BLOCKS row groups of ROWS rows, served by one reader thread
# with buffers that record the thread that releases them. A parse thread
# buffers a few chunks of samples only, so each one opened ahead stops
# mid-block, holding its block, until the consumer takes more.
FEED = """
import sys, threading
sys.path.insert(0, {python!r})
import numpy as np
from chute import _core

ROWS, BLOCKS, WIDTH = 1000, 4, 64
released_on = []
put = threading.Semaphore(0)


class Tracked(np.ndarray):
    def __del__(self):
        released_on.append(threading.get_ident())


feed = _core.BlockFeed(
    ["raw"], ["raw"], [f"block{{b}}" for b in range(BLOCKS)], [ROWS] * BLOCKS,
    [f"block {{b}}" for b in range(BLOCKS)], [b * ROWS for b in range(BLOCKS)],
    ["blocks"] * BLOCKS,
)


def serve():
    while (request := feed.next_request()) is not None:
        ticket, block = request
        data = np.full(ROWS * WIDTH, block, np.uint8).view(Tracked)
        offsets = np.arange(ROWS + 1, dtype=np.int64) * WIDTH
        feed.put(ticket, block, [(data, offsets, None)])
        del data
        put.release()


reader = threading.Thread(target=serve)
reader.start()
plan = _core.StreamPlan()
plan.urls = [f"block{{b}}" for b in range(BLOCKS)]
plan.block_feed = feed
plan.keep_other_members = True
plan.num_streams = 1
plan.parse_ahead = BLOCKS
plan.batch_size = 16
python_threads = {{threading.get_ident(), reader.ident}}
"""

FULL_EPOCH = """
engine = _core.StreamEngine(plan)
batches = 0
while engine.next() is not None:
    batches += 1
engine.close()
assert batches == ROWS * BLOCKS // 16, batches
"""

DROPPED_WITHOUT_CLOSE = """
engine = _core.StreamEngine(plan)
assert engine.next() is not None
for _ in range(BLOCKS):
    put.acquire()  # every block is held by the parse thread that reads it
del engine  # joins its threads with the GIL held
"""

CHECK = """
feed.close()
reader.join()
assert len(released_on) == BLOCKS, released_on
on_engine_threads = [t for t in released_on if t not in python_threads]
assert not on_engine_threads, f"{{len(on_engine_threads)}} released on engine threads"
print("ok")
"""


def run_feed(body: str) -> None:
    script = (FEED + body + CHECK).format(python=str(Path(chute.__file__).parent.parent))
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError("the engine's threads and the GIL wait for each other") from e
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.strip() == "ok"


def test_row_group_buffers_are_released_on_python_threads() -> None:
    run_feed(FULL_EPOCH)


def test_engine_dropped_without_close_while_its_threads_hold_blocks_does_not_hang() -> None:
    run_feed(DROPPED_WITHOUT_CLOSE)


def test_no_native_code_takes_the_gil() -> None:
    sources = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in {".h", ".cc"} and p.is_file()]
    if not sources:
        pytest.skip("the sources are not beside this installed package")
    offenders = [
        str(p.relative_to(ROOT))
        for p in sources
        if any(
            call in p.read_text(encoding="utf-8")
            for call in ("gil_scoped_acquire", "PyGILState_Ensure")
        )
    ]
    assert not offenders, "drop Python objects through keep_python_alive (bindings/GIL.md)"
