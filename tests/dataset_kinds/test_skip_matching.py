"""The samples a handler skipped reach it with the batch they were in, found
by the id the engine gives each as data (``sample_index``), whatever its
message says: ParquetDataset and TarDataset."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chute
import chute.datasets.parquet as parquet
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chute.sources import tarindex
from conftest import png_bytes, write_shards
from PIL import Image

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
BAD_ROWS = (5, 9, 10, 11)  # rows 9-11: a whole batch of three


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
    class Engine(parquet.RowGroupEngine):
        def __init__(self, engine: Any, *args: Any) -> None:
            super().__init__(_Reworded(engine), *args)

    monkeypatch.setattr(parquet, "RowGroupEngine", Engine)
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


def cut_jpeg_shards(tmp_path: Path, bad: int) -> list[str]:
    rng = np.random.default_rng(8)
    samples: list[dict[str, object]] = []
    for i in range(16):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(out, format="JPEG")
        data = out.getvalue()
        samples.append(
            {
                "__key__": f"s{i:05d}",
                "jpg": data[: len(data) // 2] if i == bad else data,
                "cls": str(i).encode(),
            }
        )
    return write_shards(tmp_path, samples, per_shard=16)


def test_a_tar_datasets_stopping_handler_stops_after_the_batch_of_the_bad_sample(
    tmp_path: Path,
) -> None:
    ds = chute.TarDataset(
        cut_jpeg_shards(tmp_path, bad=5),
        decode="rgb8",
        fields=("jpg", "cls"),
        handler=wds.ignore_and_stop,
    )

    def index_batches() -> Iterator[list[int]]:
        yield [0, 1, 2, 3]
        yield [4, 5, 6, 7]
        # The second batch's skip is in before the first batch is collected
        # (the engine decodes ahead): it must still stop after the second.
        deadline = time.monotonic() + 60
        while sum(e.stats()["samples_skipped"] for e in ds._state().live) == 0:
            assert time.monotonic() < deadline, "the engine never skipped sample 5"
            time.sleep(0.005)
        yield [8, 9, 10, 11]
        yield [12, 13, 14, 15]

    got = [b[1].tolist() for b in ds.iter_batches(index_batches(), num_threads=2, prefetch=4)]
    assert got == [[0, 1, 2, 3], [4, 6, 7]]
    assert ds.stats()["samples_skipped"] == 1


def test_a_tar_datasets_skipped_samples_error_names_it_as_data(tmp_path: Path) -> None:
    shards = cut_jpeg_shards(tmp_path, bad=5)
    errors: list[BaseException] = []

    def keep_going(error: BaseException) -> bool:
        errors.append(error)
        return True

    ds = chute.TarDataset(shards, decode="rgb8", fields=("jpg", "cls"), handler=keep_going)
    assert [b[1].tolist() for b in chute.DataLoader(ds, batch_size=8)] == [
        [0, 1, 2, 3, 4, 6, 7],
        list(range(8, 16)),
    ]
    [error] = errors
    offset = tarindex.read_index(shards[0])["samples"][5]["offset"]
    assert (error.sample_index, error.sample_source, error.sample_offset) == (5, 0, offset)  # type: ignore[attr-defined]


def test_a_failed_batch_leaves_later_skips_matched_to_theirs(tmp_path: Path) -> None:
    ds = chute.TarDataset(
        cut_jpeg_shards(tmp_path, bad=5),
        decode="rgb8",
        fields=("jpg", "cls"),
        handler=wds.ignore_and_continue,
    )
    with pytest.raises(ValueError, match="index 100 is out of range for a dataset of length 16"):
        ds.__getitems__([0, 100])
    with pytest.raises(chute.DataError, match=r"member 's00005\.jpg'"):
        ds[5]
    assert [int(row[1]) for row in ds.__getitems__([4, 5, 6])] == [4, 6]
