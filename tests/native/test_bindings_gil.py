"""The bindings release the GIL only around native work, never while
pybind11 registers or drops an instance (its instance table is guarded by
the GIL alone). A constructor that released it through a call guard let two
threads making engines or token files at once corrupt that table: the
process aborted ('Tried to deallocate unregistered instance') or crashed.
The stress cases run in a subprocess, since the failure kills the process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import chute
import pytest

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

ROOT = Path(os.environ.get("CHUTE_SOURCE_ROOT") or Path(__file__).resolve().parents[2])

STRESS = """
import sys, threading, time
sys.path.insert(0, {python!r})
sys.path.insert(0, {tests!r})
from pathlib import Path
import numpy as np
import chute
from chute import _core
from conftest import write_shards

tmp = Path({tmp!r})
tokens = tmp / "tokens.bin"
np.arange(4096, dtype=np.uint16).tofile(tokens)
samples = [{{"__key__": f"s{{i:03d}}", "cls": str(i).encode()}} for i in range(8)]
shards = write_shards(tmp / "shards", samples, per_shard=4)
failures = []
expected = _core.TokenPacker([_core.TokenFile(str(tokens), "raw", "uint16")] * 4, 16).num_sequences

stop = time.monotonic() + {seconds}

def token_files():
    while time.monotonic() < stop:
        files = [_core.TokenFile(str(tokens), "raw", "uint16") for _ in range(4)]
        packer = _core.TokenPacker(files, 16)
        assert packer.num_sequences == expected, packer.num_sequences
        del files, packer

def stream_engines():
    while time.monotonic() < stop:
        ds = chute.WebDataset(shards, shardshuffle=False).to_tuple("__key__", "cls")
        assert sum(1 for _ in ds) == 8

def run(target):
    try:
        target()
    except BaseException as exn:
        failures.append(exn)

threads = [threading.Thread(target=run, args=(t,))
           for t in (token_files, token_files, token_files, stream_engines)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not failures, failures
print("ok")
"""


def test_objects_made_on_many_threads_at_once_keep_the_process_alive(tmp_path: Path) -> None:
    script = STRESS.format(
        python=str(Path(chute.__file__).parent.parent),
        tests=str(Path(__file__).parents[1]),
        tmp=str(tmp_path),
        seconds=4,
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.strip() == "ok"


def _init_definitions(source: str) -> list[str]:
    """The text of each `.def(py::init(...), ...)` in `source`: from the
    `.def(` to its closing parenthesis."""
    found = []
    for match in re.finditer(r"\.def\(\s*py::init", source):
        depth = 0
        for end in range(match.start() + len(".def"), len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                found.append(source[match.start() : end + 1])
                break
    return found


def test_no_constructor_releases_the_gil_through_a_call_guard() -> None:
    bindings = sorted((ROOT / "csrc" / "bindings").glob("*.cc"))
    if not bindings:
        pytest.skip("the sources are not beside this installed package")
    offenders = []
    definitions = 0
    for path in bindings:
        for definition in _init_definitions(path.read_text(encoding="utf-8")):
            definitions += 1
            if "call_guard" in definition:
                offenders.append(f"{path.name}: {definition.splitlines()[0].strip()}")
    assert definitions >= 10, "the scan found too few py::init definitions to be reading them"
    assert not offenders, (
        "release the GIL inside the factory instead (bindings/GIL.md): " + "; ".join(offenders)
    )
