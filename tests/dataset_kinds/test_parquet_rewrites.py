"""A Parquet file rewritten after a ParquetDataset opened it: rows are read
through the footer read at open, whose offsets may then point at another
column's or row group's pages, so a rewrite is refused (naming the file)
unless the footer is still the one read at open."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import chute
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import rewrite_with_its_times_set_back

N = 100
LABELS = np.arange(N, dtype=np.int64)
OTHER = LABELS + 1000
CHANGED = r"file '.*data.parquet', row group \d: the file changed after the dataset opened it"


def write(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path, row_group_size=50, compression="none", write_statistics=False)


def labels_first() -> pa.Table:
    return pa.table({"label": LABELS, "other": OTHER})


def other_first() -> pa.Table:
    """The same columns in the other order: the file has the same size, and
    the footer read at open says the label column is where `other` now is."""
    return pa.table({"other": OTHER, "label": LABELS})


def rewrite_in_place(path: Path, table: pa.Table) -> None:
    rewrite_with_its_times_set_back(path, lambda: write(path, table))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    out = tmp_path / "data.parquet"
    write(out, labels_first())
    return out


def test_a_copy_opened_after_a_rewrite_refuses_it(path: Path) -> None:
    ds = chute.ParquetDataset(str(path), ["label"])
    assert int(ds[0]["label"]) == 0
    copy = pickle.loads(pickle.dumps(ds))  # as a worker process gets it
    replacement = path.with_suffix(".new")
    write(replacement, other_first())
    assert replacement.stat().st_size == path.stat().st_size
    os.replace(replacement, path)
    with pytest.raises(chute.DataError, match=CHANGED + r" \(size \d+, now \d+\): its footer"):
        copy[0]
    assert int(chute.ParquetDataset(str(path), ["label"])[0]["label"]) == 0  # opened anew


def test_an_in_place_rewrite_with_its_time_set_back_is_refused(path: Path) -> None:
    ds = chute.ParquetDataset(str(path), ["label"], cache_bytes=0)
    assert int(ds[0]["label"]) == 0  # the file is open now
    rewrite_in_place(path, other_first())
    with pytest.raises(chute.DataError, match=CHANGED):
        ds[60]


def test_a_rewrite_under_worker_processes_is_refused(path: Path) -> None:
    ds = chute.ParquetDataset(str(path), ["label"])
    rewrite_in_place(path, other_first())
    loader = chute.DataLoader(ds, batch_size=10, num_workers=2)
    with pytest.raises(chute.DataError, match=CHANGED):
        list(loader)


def test_a_rewrite_between_state_and_resume_is_refused(path: Path) -> None:
    ds = chute.ParquetDataset(str(path), ["label"], cache_bytes=0)
    loader = chute.DataLoader(ds, batch_size=10, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    rewrite_in_place(path, other_first())
    loader.load_state_dict(state)  # the same dataset object: its identity matches
    with pytest.raises(chute.DataError, match=CHANGED):
        list(loader)


def test_changes_that_keep_the_footer_read_on(path: Path) -> None:
    ds = chute.ParquetDataset(str(path), ["label", "other"], cache_bytes=0)
    assert int(ds[0]["label"]) == 0
    rewrite_with_its_times_set_back(path, lambda: path.chmod(0o600))  # the same bytes
    assert int(ds[60]["label"]) == 60
    rewrite_in_place(path, labels_first())  # the same bytes written again
    rows = [b for b in chute.DataLoader(ds, batch_size=25)]
    assert [int(x) for b in rows for x in b["label"]] == LABELS.tolist()
    assert [int(x) for b in rows for x in b["other"]] == OTHER.tolist()
