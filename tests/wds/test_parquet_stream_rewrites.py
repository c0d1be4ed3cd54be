"""A Parquet file rewritten after a ParquetStream read its footer: its row
groups would be read through the footer read then, so a rewrite is refused,
naming the file and row group (chute.ParquetDataset's rule)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

N = 60
CHANGED = r"file '.*data.parquet', row group \d: the file changed after the dataset opened it"


def write(path: Path, label_first: bool) -> None:
    label, other = np.arange(N, dtype=np.int64), np.arange(N, dtype=np.int64) + 1000
    columns = {"label": label, "other": other} if label_first else {"other": other, "label": label}
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table(columns), tmp, row_group_size=10, compression="none")
    os.replace(tmp, path)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    out = tmp_path / "data.parquet"
    write(out, label_first=True)
    return out


def test_a_stream_over_a_rewritten_file_refuses_it(path: Path) -> None:
    stream = wds.ParquetStream(str(path), ["label"], shardshuffle=False).to_tuple("label")
    assert [int(x) for (x,) in stream] == list(range(N))
    write(path, label_first=False)  # the same size, the label column elsewhere
    with pytest.raises(chute.DataError, match=CHANGED):
        list(stream)


@pytest.mark.parametrize("elastic", [False, True])
def test_a_rewrite_between_state_and_resume_is_refused(path: Path, elastic: bool) -> None:
    stream = (
        wds.ParquetStream(str(path), ["label"], shardshuffle=True, seed=2, elastic=elastic)
        .to_tuple("label")
        .batched(4)
    )
    head = list(itertools.islice(iter(stream), 2))
    assert len(head) == 2
    state = stream.state_dict()
    write(path, label_first=False)
    stream.load_state_dict(state)  # the same stream object: its footers match
    with pytest.raises(chute.DataError, match=CHANGED):
        list(stream)
