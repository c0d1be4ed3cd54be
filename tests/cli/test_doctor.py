"""chute doctor: a dataset read as chute bench reads it, and the report of
loader.diagnose() printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chute.cli import main
from chute.cli.kinds import openable_plurals
from chute.loader.diagnose import STAGES
from conftest import image_samples, write_shards


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(
        tmp_path_factory.mktemp("doctor"), image_samples(160, seed=8, size=(192, 256)), 80
    )


def test_doctor_names_decode_on_one_thread(
    jpegs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "doctor",
        *jpegs,
        "--decode",
        "rgb8",
        "--to-tuple",
        "jpg cls",
        "--workers",
        "1",
        "--batch-size",
        "16",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("chute doctor (WebDataset): 160 samples in ")
    assert lines[1] == "bottleneck: decode", out
    assert "1 decode thread" in lines[2]


def test_doctor_with_a_slow_step_is_consumer_bound_as_json(
    jpegs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "doctor",
        jpegs[0],
        "--decode",
        "torchrgb8",
        "--size",
        "64",
        "--to-tuple",
        "jpg,cls",
        "--batch-size",
        "8",
        "--step-ms",
        "40",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert report["samples"] == 80 and report["bottleneck"] == "consumer"
    assert report["kind"] == "WebDataset"
    assert report["evidence"]["threads"]["auto"] is True  # --workers auto by default
    assert set(report["evidence"]["stages"]) == set(STAGES)


def test_doctor_stops_at_the_limit(jpegs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "doctor",
        *jpegs,
        "--decode",
        "torchrgb8",
        "--to-tuple",
        "jpg cls",
        "--limit",
        "50",
        "--batch-size",
        "10",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert report["samples"] == 50 and report["evidence"]["batches"] == 5


def test_doctor_bad_arguments(
    jpegs: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "doctor")
    # Every kind that opens paths is named, from the registry.
    assert f"doctor needs at least one path ({openable_plurals()})" in err and code == 2
    assert "Arrow IPC files" in err and "tar shards" in err
    code, _, err = run(capsys, "doctor", jpegs[0], "--workers", "many")
    assert code == 2 and "--workers takes 'auto' or a count >= 0, not 'many'" in err
    code, _, err = run(capsys, "doctor", jpegs[0], "--decode", "jpegish")
    assert code == 2 and "--decode 'jpegish'" in err
    code, _, err = run(capsys, "doctor", jpegs[0], "--batch-size", "0")
    assert code == 2 and "--batch-size must be >= 1, not 0" in err
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    code, _, err = run(capsys, "doctor", str(other))
    assert code == 2 and f"{other}: neither " in err
    code, _, err = run(capsys, "doctor", jpegs[0], "--columns", "x")
    assert code == 2 and "--columns goes with ArrowDataset, MDSDataset, ParquetDataset or" in err
    code, _, err = run(capsys, "doctor", jpegs[0], "--kind", "ParquetDataset")
    assert code == 2 and "--kind ParquetDataset: does not read tar shards" in err


def test_doctor_opens_the_kind_named(jpegs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # TarDataset: map-style, its batches by index; "auto" tunes its gathering threads.
    code, out, _ = run(
        capsys,
        "doctor",
        *jpegs,
        "--kind",
        "TarDataset",
        "--decode",
        "torchrgb8",
        "--size",
        "32",
        "--batch-size",
        "20",
        "--step-ms",
        "40",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert report["kind"] == "TarDataset" and report["samples"] == 160
    assert report["evidence"]["batches"] == 8
    assert report["bottleneck"] == "consumer"
    assert report["evidence"]["threads"]["auto"] is True


def test_doctor_reads_parquet_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    path = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"x": list(range(300)), "y": [0.5 * i for i in range(300)]}), path)
    # No decoded column: the engine never sees these batches, the dataset
    # counts them. The step outlasts the first batch's start-up.
    code, out, _ = run(capsys, "doctor", str(path), "--batch-size", "30", "--step-ms", "300")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("chute doctor (ParquetDataset): 300 samples in ")
    assert lines[1] == "bottleneck: consumer", out
    assert ", 10 batches, " in lines[3], out
