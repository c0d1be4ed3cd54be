"""The data-kind registry (``chute.kinds``): formats told by content, the
command line built from it alone, and a kind added by one registration."""

from __future__ import annotations

import ast
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, TextIO

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chute.cli import main
from chute.kinds import (
    DataKind,
    FileFormat,
    OpenSpec,
    PathError,
    Target,
    file_formats,
    format_of,
    kind_named,
    registered_kinds,
)
from chute.kinds import registry as kinds_registry
from conftest import tiny_samples, write_shards


def test_each_format_is_told_by_its_content(tmp_path: Path):
    tar = write_shards(tmp_path / "tar", tiny_samples(3), per_shard=3)[0]
    disguised = tmp_path / "shard.h5"  # extensions lie
    disguised.write_bytes(Path(tar).read_bytes())
    with h5py.File(tmp_path / "rows.bin5", "w") as f:
        f["x"] = np.arange(4)
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "t.dat")
    np.save(tmp_path / "tokens.npy", np.arange(10, dtype=np.uint16))
    found = {
        name: format_of(Target(str(tmp_path / name))).name
        for name in ("shard.h5", "rows.bin5", "t.dat", "tokens.npy")
    }
    assert found == {
        "shard.h5": "tar",
        "rows.bin5": "hdf5",
        "t.dat": "parquet",
        "tokens.npy": "tokens",
    }
    assert format_of(Target(tar)).name == "tar"
    junk = tmp_path / "notes.txt"
    junk.write_text("hello" * 200)
    with pytest.raises(PathError, match="neither ") as info:
        format_of(Target(str(junk)))
    assert all(f.noun in str(info.value) for f in file_formats())
    with pytest.raises(PathError, match="no such file"):
        format_of(Target(str(tmp_path / "missing.tar")))
    with pytest.raises(PathError, match="is a directory"):
        format_of(Target(str(tmp_path)))


def test_every_kind_says_how_its_samples_are_counted():
    from chute.sources.sample_counts import registered_sample_counters

    counters = registered_sample_counters()
    for kind in registered_kinds():
        assert kind.name and kind.summary, kind
        if kind.index_driven:
            assert kind.sample_counter is None, kind  # map-style: the sampler's len()
        else:
            assert kind.sample_counter in counters, kind  # a stream: its format's counter
    with pytest.raises(ValueError, match="the kinds are: "):
        kind_named("NoSuchDataset")


def test_a_kind_registered_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        kinds_registry.register_kind(registered_kinds()[0])


def _literals(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_the_command_line_names_no_kind_and_no_format():
    """The commands read every kind and format from the registry: no string
    in chute/cli is a kind's or a format's name (what comparing with one, or
    branching on one, would need)."""
    import chute.cli

    names = {k.name for k in registered_kinds()} | {f.name for f in file_formats()}
    cli = Path(chute.cli.__file__).parent
    found = {p.name: _literals(p) & names for p in sorted(cli.glob("*.py"))}
    assert {p: n for p, n in found.items() if n} == {}


class _LinesFile(FileFormat):
    """A toy format for the test: text files whose first line is ``#lines``."""

    name = "lines"
    noun = "a lines file"
    plural = "lines files"

    def claims(self, target: Target) -> bool:
        return not target.is_dir() and target.head(7) == b"#lines\n"

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        with open(target.path, encoding="utf-8") as f:
            rows = f.read().splitlines()[1:]
        return {"path": target.path, "kind": self.name, "rows": len(rows), "problems": []}

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        print(f"{report['path']}: {report['rows']} lines", file=out)


class _LinesKind(DataKind):
    name = "LinesDataset"
    summary = "the test's lines files"
    files = _LinesFile()

    def open(self, spec: OpenSpec) -> Any:
        from chute import ArrayDataset

        rows = [line for p in spec.paths for line in Path(p).read_text().splitlines()[1:]]
        return ArrayDataset(x=np.array([int(r) for r in rows], dtype=np.int64))


def test_a_new_kind_is_one_registration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Registering a kind (and its format) is all it takes for inspect,
    bench's --kind and the format messages to know it."""
    monkeypatch.setattr(kinds_registry, "_KINDS", dict(kinds_registry._KINDS))
    kinds_registry.register_kind(_LinesKind())
    path = tmp_path / "a.txt"
    path.write_text("#lines\n1\n2\n3\n")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["inspect", "--json", str(path)]) == 0
    assert json.loads(out.getvalue()) == [
        {"path": str(path), "kind": "lines", "rows": 3, "problems": []}
    ]
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing")
    with pytest.raises(PathError, match="nor a lines file"):
        format_of(Target(str(junk)))
    label, loader = kind_named("LinesDataset").bench_loader(
        OpenSpec(paths=[str(path)], batch_size=2)
    )
    assert label == "chute (LinesDataset)"
    assert [b["x"].tolist() for b in loader] == [[1, 2], [3]]
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "LinesDataset" in out.getvalue()
