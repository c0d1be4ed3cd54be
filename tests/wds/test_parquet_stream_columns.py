"""Columns a ParquetStream cannot hand over as they are: one named like a
field the stream sets itself (files converted from webdataset shards keep
their ``__key__`` and ``__url__``), and a column asked for twice."""

from __future__ import annotations

from pathlib import Path

import chute
import chute.wds as wds
import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def path(tmp_path: Path) -> str:
    out = tmp_path / "from-shards.parquet"
    table = pa.table(
        {
            "__key__": ["sample-07", "sample-11"],
            "__url__": ["shard-3.tar", "shard-3.tar"],
            "label": pa.array([4, 9], pa.int64()),
        }
    )
    pq.write_table(table, out)
    return str(out)


@pytest.mark.parametrize("columns", [None, ["label", "__key__"], ["__url__"]])
def test_a_column_named_like_a_field_the_stream_sets_is_refused(path: str, columns) -> None:
    with pytest.raises(
        ValueError,
        match=r"column '__(key|url)__' of '.*from-shards\.parquet' has the name of a field "
        r"ParquetStream sets itself .* read the other columns \(columns=\[.*\]\), or the file "
        r"with chute\.ParquetDataset",
    ):
        wds.ParquetStream(path, columns, shardshuffle=False)
    # The stream reads the others; ParquetDataset returns those columns as they are.
    assert [int(s["label"]) for s in wds.ParquetStream(path, ["label"], shardshuffle=False)] == [
        4,
        9,
    ]
    assert chute.ParquetDataset(path)[1]["__key__"] == "sample-11"


def test_a_column_asked_for_twice_is_refused(path: str) -> None:
    for make in (chute.ParquetDataset, wds.ParquetStream):
        with pytest.raises(ValueError, match=r"columns names 'label' twice: \['label', 'label'\]"):
            make(path, ["label", "label"])
