"""ParquetDataset's skipped rows reach their batch's handler by the row the
engine names as data (``sample_index``), whatever its message says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import chute
import chute.datasets.parquet as parquet
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import png_bytes

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
BAD_ROWS = (5, 9, 10, 11)  # row group size 4: rows 9-11 sit in row group 2, 10 and 11 in one batch


def broken_images(path: Path) -> str:
    rng = np.random.default_rng(7)
    images = []
    for i in range(14):
        good = png_bytes(rng, 6, 5)
        images.append({"bytes": good[:30] if i in BAD_ROWS else good, "path": f"{i}.png"})
    table = pa.table({"image": pa.array(images, IMAGE), "label": pa.array(range(14), pa.int64())})
    pq.write_table(table, path, row_group_size=4)
    return str(path)


def labels(ds: Any, **kw: Any) -> list[list[int]]:
    return [b["label"].tolist() for b in chute.DataLoader(ds, **kw)]


def test_each_skipped_rows_error_names_its_row_as_data(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def keep_going(error: BaseException) -> bool:
        errors.append(error)
        return True

    ds = chute.ParquetDataset(
        broken_images(tmp_path / "broken.parquet"), decode="rgb8", handler=keep_going
    )
    assert labels(ds, batch_size=3) == [[0, 1, 2], [3, 4], [6, 7, 8], [12, 13]]
    assert [e.sample_index for e in errors] == list(BAD_ROWS)  # type: ignore[attr-defined]
    # The row group holding it and its row there, as the message words them.
    for error in errors:
        index = error.sample_index  # type: ignore[attr-defined]
        assert (error.sample_source, error.sample_offset) == (index // 4, index % 4)  # type: ignore[attr-defined]
        assert f"row group {index // 4}, row {index % 4} (sample {index})" in str(error)


class _Reworded:
    """The native engine, its skipped rows' messages worded without their row."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def take_skipped(self) -> list[Exception]:
        out = []
        for error in self._engine.take_skipped():
            reworded = type(error)(re.sub(r" \(sample \d+\)", "", str(error)))
            for field in ("sample_index", "sample_source", "sample_offset"):
                setattr(reworded, field, getattr(error, field, None))
            out.append(reworded)
        return out


def test_skips_are_matched_to_their_batch_without_reading_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Engine(parquet._Engine):
        def __init__(self, engine: Any, *args: Any) -> None:
            super().__init__(_Reworded(engine), *args)

    monkeypatch.setattr(parquet, "_Engine", Engine)
    ds = chute.ParquetDataset(
        broken_images(tmp_path / "broken.parquet"), decode="rgb8", handler=wds.warn_and_continue
    )
    with pytest.warns(chute.SkippedSampleWarning) as caught:
        got = labels(ds, batch_size=3)
    assert got == [[0, 1, 2], [3, 4], [6, 7, 8], [12, 13]]
    assert len(caught) == 4 and all("(sample" not in str(w.message) for w in caught)
    assert ds.stats()["samples_skipped"] == 4
    # Shuffled: the engine decodes batches ahead, so skips of later batches
    # wait for theirs.
    with pytest.warns(chute.SkippedSampleWarning) as caught:
        shuffled = labels(ds, batch_size=4, shuffle=True)
    assert len(caught) == 4
    assert sorted(i for batch in shuffled for i in batch) == [0, 1, 2, 3, 4, 6, 7, 8, 12, 13]
    # A row asked for alone raises its own error.
    with (
        pytest.warns(chute.SkippedSampleWarning),
        pytest.raises(chute.DataError, match=r"row group 1, row 1, column 'image'"),
    ):
        ds[5]
