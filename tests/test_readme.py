"""The README's Python snippets run as printed, on generated data laid out
where they look for it."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import jpeg_bytes, npy_bytes, write_shards

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    """(line, code) of every ```python block of the README."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shards/train-000000..000127.tar (jpg + cls + nsdgeneral.npy +
    trial.npy), sessions/*.h5 (betas, coco_ids), questions.npy and
    cluster_ids.npy."""
    root = tmp_path_factory.mktemp("readme")
    rng = np.random.default_rng(0)
    images = [jpeg_bytes(rng, 24, 24) for _ in range(16)]
    samples: list[dict[str, object]] = [
        {
            "__key__": f"trial{i:05d}",
            "jpg": images[i % 16],
            "cls": i % 10,
            "nsdgeneral.npy": npy_bytes(rng.standard_normal(50).astype(np.float32)),
            "trial.npy": npy_bytes(np.array([i], dtype=np.int64)),
        }
        for i in range(128 * 12)
    ]
    write_shards(root / "shards", samples, per_shard=12, prefix="train")
    (root / "sessions").mkdir()
    for s in range(2):
        with h5py.File(root / "sessions" / f"s{s}.h5", "w") as f:
            f["betas"] = rng.standard_normal((600, 16)).astype(np.float32)
            f["coco_ids"] = np.arange(600, dtype=np.int64) + 600 * s
    np.save(root / "questions.npy", rng.standard_normal((300, 8)).astype(np.float32))
    np.save(root / "cluster_ids.npy", np.arange(300) % 7)
    return root


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    assert len(python_blocks()) >= 3


@pytest.mark.parametrize("line", [line for line, _ in python_blocks()])
def test_readme_snippet_runs(layout: Path, monkeypatch: pytest.MonkeyPatch, line: int) -> None:
    code = dict(python_blocks())[line]
    monkeypatch.chdir(layout)
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)
