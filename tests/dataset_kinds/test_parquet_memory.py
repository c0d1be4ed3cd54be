"""Parquet reading is bounded by the settings, Arrow's pool included: peak
RSS growth of one epoch, measured in a fresh interpreter, against
docs/memory.md's Parquet formula with a generous margin.

The unbounded behaviour this guards against kept, in every reader thread,
the raw column chunks of the last row group it read of each file
(pyarrow's pre-buffering), and Arrow's allocator kept what the reads had
freed: with many files of large row groups, several row groups more than
the settings allow."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import run_json_probe

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MiB = 1 << 20
ROWS_PER_FILE = 500
BLOB_BYTES = 16 * 1024  # a row group: 500 rows of 16 KiB, 8 MiB

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("CHUTE_SANITIZER")),
    reason="a sanitizer's quarantine keeps freed memory resident by design",
)

PROBE = """
import json, os, sys
import pyarrow.parquet  # its libraries' pages are not what is measured
import torch
import chute
from chute.common import rss
cfg = json.loads(sys.argv[1])
base = rss.process_rss(os.getpid())
rows = []
with rss.PeakRss(os.getpid(), interval=0.005) as peak:
    if cfg["kind"] == "dataset":
        ds = chute.ParquetDataset(cfg["files"], cache_bytes=32 << 20, readahead=2)
        for batch in chute.DataLoader(ds, batch_size=64, num_workers=2):
            rows.extend(batch["label"].tolist())
            del batch
    else:
        ds = chute.ParquetStream(cfg["files"], readahead=2, threads=2, shardshuffle=False)
        for blobs, labels in chute.DataLoader(ds.to_tuple("blob", "label").batched(64),
                                              batch_size=None):
            rows.extend(labels.tolist())
            del blobs, labels
print(json.dumps({"growth": peak.peak - base, "rows": rows}))
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    # 16 files of one 8 MiB row group each, incompressible and unencoded:
    # each file's last row group was what every reader thread kept.
    directory = tmp_path_factory.mktemp("parquet_memory")
    rng = np.random.default_rng(0)
    out = []
    for f in range(16):
        path = directory / f"part-{f:02d}.parquet"
        blobs = [rng.bytes(BLOB_BYTES) for _ in range(ROWS_PER_FILE)]
        labels = np.arange(ROWS_PER_FILE, dtype=np.int64) + f * ROWS_PER_FILE
        table = pa.table({"blob": pa.array(blobs, pa.binary()), "label": labels})
        pq.write_table(table, path, compression="none", use_dictionary=False)
        out.append(str(path))
    return out


def growth(kind: str, files: list[str]) -> int:
    config = {"kind": kind, "files": files}
    report = run_json_probe(PROBE, json.dumps(config))
    assert sorted(report["rows"]) == list(range(len(files) * ROWS_PER_FILE))
    return int(report["growth"])


def test_parquet_dataset_holds_what_its_settings_allow(files: list[str]) -> None:
    # Formula (docs/memory.md), G = 8 MiB: cache_bytes 32 + 2 readers ·
    # 2·G = 32 + batches of 1 MiB + the fixed 64: about 130 MiB. With
    # pre-buffering readers and Arrow's freed memory kept: about 250 MiB.
    assert growth("dataset", files) < 160 * MiB


def test_parquet_stream_holds_what_its_settings_allow(files: list[str]) -> None:
    # Formula, G = 8 MiB: (readahead + 1) · G = 24 held by the engine + 2
    # readers · G = 16 + batches + the fixed 64: about 110 MiB. With
    # pre-buffering readers and Arrow's freed memory kept: about 220 MiB.
    assert growth("stream", files) < 160 * MiB
