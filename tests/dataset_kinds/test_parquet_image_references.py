"""Image columns that `datasets`' `to_parquet` writes as references (null
`bytes`, a `path`): read from the file at the path, pixel-equal to
`datasets`' own reading of the same file; a null image says so, naming file,
row group and row, never an internal column name."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
from PIL import Image

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")

# The null values' members are native (scripts/sanitize.sh runs it).
pytestmark = pytest.mark.native


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def image_files(directory: Path, count: int) -> list[str]:
    """`count` small images, PNG and JPEG, of varied sizes, as files."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 256, (12 + i % 3, 16, 3), dtype=np.uint8)
        name = f"img{i:02d}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(pixels).save(directory / name)
        paths.append(name)
    return paths


def embedded(pixels_seed: int) -> bytes:
    pixels = np.random.default_rng(pixels_seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def write_with_datasets(path: Path, images: list[Any]) -> None:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    table = datasets.Dataset.from_dict(
        {"image": images, "label": list(range(len(images)))}, features=features
    )
    table.to_parquet(str(path), batch_size=4)


def as_datasets_reads(path: Path, cache: Path) -> list[np.ndarray]:
    read = datasets.Dataset.from_parquet(str(path), cache_dir=str(cache))
    return [np.asarray(row["image"].convert("RGB")) for row in read]


def hwc(image: Any) -> np.ndarray:
    return np.asarray(image).transpose(1, 2, 0)


def test_references_by_absolute_path_read_as_datasets_reads_them(tmp_path: Path) -> None:
    names = image_files(tmp_path / "images", 10)
    images: list[Any] = [str(tmp_path / "images" / n) for n in names]
    images[3] = {"bytes": embedded(3), "path": None}  # embedded rows beside references
    path = tmp_path / "refs.parquet"
    write_with_datasets(path, images)
    rows = pq.read_table(path).column("image").to_pylist()
    assert rows[0]["bytes"] is None and rows[0]["path"] == images[0]  # what datasets wrote
    expected = as_datasets_reads(path, tmp_path / "cache")

    ds = chute.ParquetDataset(path, decode="torchrgb8")
    assert len(ds) == len(expected)
    for i, want in enumerate(expected):
        assert np.array_equal(hwc(ds[i]["image"]), want), i
    got = [im for b in chute.DataLoader(ds, batch_size=3, num_workers=2) for im in b["image"]]
    assert all(np.array_equal(hwc(g), w) for g, w in zip(got, expected, strict=True))
    stream = chute.ParquetStream(path, shardshuffle=False).decode("rgb8").to_tuple("image", "label")
    streamed = list(stream)
    assert [int(label) for _, label in streamed] == list(range(len(expected)))
    assert all(np.array_equal(g, w) for (g, _), w in zip(streamed, expected, strict=True))


def test_relative_references_read_from_the_directory_or_image_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = image_files(tmp_path / "data" / "images", 5)
    monkeypatch.chdir(tmp_path / "data")
    path = tmp_path / "rel.parquet"
    write_with_datasets(path, [os.path.join("images", n) for n in names])
    assert pq.read_table(path).column("image").to_pylist()[1]["path"] == "images/" + names[1]
    expected = as_datasets_reads(path, tmp_path / "cache")  # opened from the current directory

    here = chute.ParquetDataset(path, decode="torchrgb8")
    assert all(np.array_equal(hwc(here[i]["image"]), w) for i, w in enumerate(expected))
    monkeypatch.chdir(tmp_path)
    based = chute.ParquetDataset(path, decode="torchrgb8", image_base=tmp_path / "data")
    assert all(np.array_equal(hwc(based[i]["image"]), w) for i, w in enumerate(expected))
    stream = chute.ParquetStream(path, shardshuffle=False, image_base=str(tmp_path / "data"))
    streamed = list(stream.decode("rgb8").to_tuple("image"))
    assert all(np.array_equal(g[0], w) for g, w in zip(streamed, expected, strict=True))


def test_a_reference_to_a_missing_file_names_row_group_row_and_path(tmp_path: Path) -> None:
    names = image_files(tmp_path / "images", 6)
    path = tmp_path / "refs.parquet"
    write_with_datasets(path, [str(tmp_path / "images" / n) for n in names])
    (tmp_path / "images" / names[5]).unlink()  # row 1 of row group 1
    ds = chute.ParquetDataset(path, decode="torchrgb8")
    assert ds[0]["image"].shape[0] == 3
    message = (
        rf"file '.*refs.parquet', row group 1, row 1: column 'image' holds no image bytes but "
        rf"a path, '.*/{names[5]}', which does not read: No such file"
    )
    with pytest.raises(chute.DataError, match=message):
        ds[5]
    with pytest.raises(chute.DataError, match=message):
        list(chute.ParquetStream(path, shardshuffle=False).decode("rgb8").to_tuple("image"))


@pytest.mark.parametrize("null", [None, {"bytes": None, "path": None}])
def test_a_null_image_says_it_is_null_naming_file_row_group_and_row(
    tmp_path: Path, null: Any
) -> None:
    path = tmp_path / "nulls.parquet"
    images = [{"bytes": embedded(k), "path": None} for k in range(6)]
    images[5] = null
    if null is None:
        write_with_datasets(path, images)
    else:  # datasets' writer refuses it; other writers do not
        image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        table = pa.table({"image": pa.array(images, image), "label": list(range(6))})
        pq.write_table(table, path, row_group_size=4)
    ds = chute.ParquetDataset(path, decode="torchrgb8")
    with pytest.raises(chute.DataError) as raised:
        ds[5]
    text = str(raised.value)
    assert "file '" in text and "row group 1, row 1 (sample 5): column 'image' is null" in text
    assert "c0" not in text and "not found" not in text
    with pytest.raises(chute.DataError) as streamed:
        list(chute.ParquetStream(path, shardshuffle=False).decode("rgb8").to_tuple("image"))
    assert "row group 1, row 1: column 'image' is null" in str(streamed.value)
