"""docs/frameworks.md's recipes run as printed (each in a process of its
own, on the data the page describes)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import chute
import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"


def recipes() -> dict[str, str]:
    """The ```python block under each ## heading, by heading."""
    found = {}
    for section in re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.M)[1:]:
        heading = section.splitlines()[0]
        block = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
        if block:
            found[heading] = block.group(1)
    return found


FRAMEWORK = {
    "PyTorch Lightning": "lightning",
    "Hugging Face Accelerate": "accelerate",
    "The transformers Trainer": "transformers",
}


def test_the_page_has_a_recipe_for_each_framework():
    assert sorted(recipes()) == sorted(FRAMEWORK)


@pytest.mark.slow
@pytest.mark.parametrize("heading", sorted(FRAMEWORK))
def test_recipe_runs(heading, framework_data, tmp_path):
    if importlib.util.find_spec(FRAMEWORK[heading]) is None:
        pytest.skip(f"{FRAMEWORK[heading]} is not installed")
    for name in ("x.npy", "id.npy"):
        shutil.copy(framework_data / name, tmp_path / name)
    (tmp_path / "shards").mkdir()
    for shard in framework_data.glob("shard-*.tar"):
        shutil.copy(shard, tmp_path / "shards" / shard.name)
    env = dict(os.environ)
    package_root = str(Path(chute.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-c", recipes()[heading]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
