"""loader.diagnose(): each bottleneck staged on this machine, by factors
large enough that load from other processes cannot turn it into another
(sleeps of milliseconds per item or batch against stages of microseconds),
and the diagnosis must name it, with the figures that show it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import chute
import chute.gpu.device
import chute.loader.dataloader
import chute.loader.progress
import numpy as np
import pytest
import torch
from chute.common.autotune import cores_available
from chute.loader.diagnose import STAGES, format_report
from conftest import image_samples, write_shards

pytestmark = pytest.mark.native

TWO_CORES = cores_available() >= 2


def drain(loader: Any, step_seconds: float = 0.0) -> int:
    """Iterates `loader` to the end; `step_seconds`: a training step that sleeps."""
    batches = 0
    for _ in loader:
        batches += 1
        if step_seconds:
            time.sleep(step_seconds)
    return batches


def check_report(report: dict[str, Any], stage: str) -> None:
    assert report["bottleneck"] == stage, format_report(report)
    assert report["bottleneck"] in STAGES
    assert report["summary"] == f"{stage}-bound: {report['prescription']}"
    evidence = report["evidence"]
    assert evidence["elapsed_seconds"] > 0 and evidence["batches"] > 0
    assert evidence["cores"]["available"] == cores_available()
    assert set(evidence["stages"]) == set(STAGES)
    assert format_report(report).startswith(f"bottleneck: {stage}\n")


def slow_normalize(sample: Any) -> Any:
    time.sleep(0.01)
    return sample


def slow_collate(rows: list[Any]) -> Any:
    time.sleep(0.03)
    return torch.utils.data.default_collate(rows)


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(
        tmp_path_factory.mktemp("jpegs"), image_samples(480, seed=2, size=(192, 256)), 120
    )


def test_nothing_measured_before_an_iteration(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    report = chute.DataLoader(ds, batch_size=50).diagnose()
    assert report["bottleneck"] is None
    assert report["prescription"] == "iterate the loader first: nothing has been measured yet"


def test_a_slow_step_is_the_consumer(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=50, num_workers=1)
    assert drain(loader, step_seconds=0.02) == 20
    report = loader.diagnose()
    check_report(report, "consumer")
    loop = report["evidence"]["loop"]
    assert loop["step_seconds"] >= 20 * 0.02
    assert loop["shares"]["consumer"] > loop["shares"]["wait"]
    assert "nothing to gain here" in report["prescription"]
    # The engine kept batches ready for the loop.
    assert report["evidence"]["queue"]["mean_ready"] >= 1.0


def test_a_slow_map_in_this_process_is_python(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards[:1], shardshuffle=False)
        .decode()
        .to_tuple("npy", "cls")
        .map(slow_normalize)
    )
    loader = chute.DataLoader(ds, batch_size=25, num_workers=0)
    assert drain(loader) == 10
    report = loader.diagnose()
    check_report(report, "python")
    assert "Python (map(slow_normalize)) takes " in report["prescription"]
    # Its name says what it does, and the engine's decode has that option.
    assert report["prescription"].endswith("move .map(slow_normalize) to decode(normalize=...)")
    if TWO_CORES:
        assert (
            f"num_workers={cores_available()} runs it in worker processes"
            in (report["prescription"])
        )
    # The stages' own time is measured: 250 sleeps of 10 ms.
    assert loader.stats()["python_seconds"] >= 250 * 0.01
    assert report["evidence"]["loop"]["shares"]["python"] > 0.5


def test_a_slow_map_in_worker_processes_is_python(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards[:2], shardshuffle=False)
        .decode()
        .to_tuple("npy", "cls")
        .map(slow_normalize)
    )
    loader = chute.DataLoader(ds, batch_size=25, num_workers=2)
    assert drain(loader) == 20
    report = loader.diagnose()
    check_report(report, "python")
    workers = report["evidence"]["workers"]
    assert workers["processes"] == 2 and workers["python_busy"] >= 0.5
    assert report["prescription"].startswith("2 worker processes busy ")
    assert "in Python (map(slow_normalize))" in report["prescription"]
    assert loader.stats()["python_seconds"] >= 500 * 0.01


TRICKLE = """
import sys, time
with open(sys.argv[1], "rb") as f:
    while chunk := f.read(4096):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        time.sleep(0.01)
"""


def test_shards_that_trickle_in_are_storage(tiny_shards: list[str], tmp_path: Path) -> None:
    script = tmp_path / "trickle.py"
    script.write_text(TRICKLE)
    # About 400 KB per second: a shard of 250 tiny samples takes half a second.
    urls = [f"pipe:{sys.executable} {script} {url}" for url in tiny_shards[:2]]
    ds = chute.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=50, num_workers=1)
    assert drain(loader) == 10
    report = loader.diagnose()
    check_report(report, "storage")
    evidence = report["evidence"]
    assert evidence["loop"]["shares"]["wait"] > 0.5
    assert evidence["engine"]["busy"] < 0.5
    assert 0 < evidence["storage"]["mb_per_second"] < 5
    assert "MB/s with 1 shard read at once" in report["prescription"]


def test_jpeg_decode_on_one_thread_is_decode(jpeg_shards: list[str]) -> None:
    # HWC uint8 at full size: the rows go straight from the codec to the
    # batch, with no transform at all, whatever the build's optimisation.
    ds = chute.WebDataset(jpeg_shards, shardshuffle=False).decode("rgb8").to_tuple("jpg")
    loader = chute.DataLoader(ds, batch_size=16, num_workers=1)
    assert drain(loader) == 30
    report = loader.diagnose()
    check_report(report, "decode")
    evidence = report["evidence"]
    assert evidence["engine"]["busy"] > 0.5
    assert evidence["stages"]["transform"]["seconds"] == 0
    assert evidence["threads"]["decode"] == 1
    if TWO_CORES:
        assert f"of {cores_available()} cores busy: num_workers=" in report["prescription"]


def test_small_images_blown_up_are_transform(tmp_path: Path) -> None:
    # Half a second or more of resampling on one thread, the decodes a
    # fraction of that: start-up costs stay small beside it.
    urls = write_shards(tmp_path, image_samples(600, seed=4, size=(16, 16)), 150)
    ds = (
        chute.WebDataset(urls, shardshuffle=False)
        .decode("torchrgb", size=(384, 384), crop="center", normalize=((0.5,), (0.25,)))
        .to_tuple("jpg")
    )
    loader = chute.DataLoader(ds, batch_size=8, num_workers=1)
    assert drain(loader) == 75
    report = loader.diagnose()
    check_report(report, "transform")
    stages = report["evidence"]["stages"]
    assert stages["transform"]["seconds"] > stages["decode"]["seconds"]
    assert loader.stats()["transform_seconds"] > 0


def test_a_slow_collate_fn_is_collate(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards[:1], shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=25, num_workers=0, collate_fn=slow_collate)
    assert drain(loader) == 10
    report = loader.diagnose()
    check_report(report, "collate")
    assert loader.stats()["collate_seconds"] >= 10 * 0.03
    assert "leave collate_fn out" in report["prescription"]


def test_a_slow_collate_fn_of_a_map_style_dataset_is_collate() -> None:
    ds = chute.ArrayDataset(x=np.arange(200, dtype=np.float32))
    loader = chute.DataLoader(ds, batch_size=20, num_workers=0, collate_fn=slow_collate)
    assert drain(loader) == 10
    check_report(loader.diagnose(), "collate")


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_columns_gathered_in_python_are_counted_and_tuned(kind: str, tmp_path: Path) -> None:
    # No decoded column: the native engine never sees these batches (the
    # dataset gathers them), yet they are counted, and "auto" tunes it.
    x = np.arange(400, dtype=np.float32)
    pa = pytest.importorskip("pyarrow")
    if kind == "arrow":
        path = tmp_path / "x.arrow"
        table = pa.table({"x": x})
        with pa.ipc.new_stream(str(path), table.schema) as w:
            w.write_table(table, max_chunksize=100)
        ds: Any = chute.ArrowDataset(str(path))
    else:
        import pyarrow.parquet as pq

        path = tmp_path / "x.parquet"
        pq.write_table(pa.table({"x": x}), path, row_group_size=100)
        ds = chute.ParquetDataset(str(path))
    loader = chute.DataLoader(ds, batch_size=40, num_workers="auto")
    seen = [b["x"] for b in loader]
    assert torch.equal(torch.cat(seen), torch.from_numpy(x))
    figures = loader.stats()
    assert figures["batches"] == 10 and figures["samples_yielded"] == 400
    report = loader.diagnose()
    assert report["bottleneck"] in STAGES, report
    assert report["evidence"]["batches"] == 10
    assert report["evidence"]["threads"]["auto"] is True


class SlowCopies:
    """Stands in for CudaCopies: each batch's copy took 50 ms on the device."""

    def __init__(self, device: Any = None) -> None:
        pass

    def start(self, batch: Any) -> tuple[Any, None]:
        return batch, None

    def hand_over(self, moved: Any, event: None) -> Any:
        return moved

    def finished(self, event: None) -> bool:
        return True

    def wait(self, event: None) -> None:
        pass

    def seconds(self, event: None) -> float:
        return 0.05


def test_copies_that_keep_the_copy_engine_busy_are_transfer(
    tiny_shards: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chute.gpu.device, "cuda_available", lambda: True)
    monkeypatch.setattr(chute.loader.dataloader, "CudaCopies", SlowCopies)
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=50, device="cuda")
    assert drain(loader, step_seconds=0.005) == 20
    report = loader.diagnose()
    check_report(report, "transfer")
    stats = loader.stats()
    assert stats["transfer_seconds"] == pytest.approx(20 * 0.05)
    assert stats["transfer_bytes"] == 1000 * (64 * 4 + 8)
    assert "decode(dtype='uint8')" in report["prescription"]


def test_progress_shows_the_bottleneck(
    tiny_shards: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(chute.loader.progress, "STATUS_SECONDS", 0.0)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the plain line
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=100, num_workers=1, progress=True)
    drain(loader, step_seconds=0.02)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("chute: 10 batches, ") and last.endswith(" samples/s, consumer-bound")


def test_the_progress_bar_shows_the_bottleneck(
    tiny_shards: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setattr(chute.loader.progress, "STATUS_SECONDS", 0.0)
    ds = chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds, batch_size=100, num_workers=1, progress=True)
    drain(loader, step_seconds=0.02)
    assert "bound=consumer" in capsys.readouterr().err
