"""ParquetDataset against pyarrow's own reading of the same files (every
column of every row), Pillow (decoded images), TarDataset (the same training
transforms over the same images) and torch's samplers (order, DDP split,
resume, elastic resume)."""

from __future__ import annotations

import collections
import io
import itertools
import json
import pickle
import re
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import image_samples, png_bytes, write_shards
from helpers import assert_resume_mid_epoch_is_exact, batch_ids, counts, run_ranks
from PIL import Image

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

N = 47  # rows over two files of uneven row groups
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hub_table(samples: list[dict[str, Any]], first: int) -> pa.Table:
    """Columns as the hub writes an image dataset, and one of every other kind."""
    n = len(samples)
    images = [
        {"bytes": s.get("jpg") or s.get("png"), "path": f"{first + i:05d}.jpg"}
        for i, s in enumerate(samples)
    ]
    return pa.table(
        {
            "id": pa.array(np.arange(first, first + n, dtype=np.int64)),
            "image": pa.array(images, IMAGE),
            "label": pa.array([int(s["cls"]) for s in samples], pa.int16()),
            "score": pa.array(np.linspace(0, 1, n, dtype=np.float32) + first),
            "flag": pa.array([(first + i) % 3 == 0 for i in range(n)]),
            "caption": pa.array([None if i % 5 == 4 else f"row {first + i}" for i in range(n)]),
            "raw": pa.array([s.get("jpg") or s.get("png") for s in samples], pa.binary()),
            "tags": pa.array([[first + i, i % 4] for i in range(n)], pa.list_(pa.int32())),
        }
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("parquet")
    samples = image_samples(N, seed=3, size=(24, 30), png_every=6)
    a, b = root / "part-0.parquet", root / "part-1.parquet"
    pq.write_table(hub_table(samples[:30], 0), a, row_group_size=8)  # 8, 8, 8, 6
    pq.write_table(hub_table(samples[30:], 30), b, row_group_size=5)  # 5, 5, 5, 2
    tar = [dict(s, __key__=f"{i:06d}") for i, s in enumerate(samples)]
    return {
        "files": [str(a), str(b)],
        "samples": samples,
        "reference": pa.concat_tables([pq.read_table(a), pq.read_table(b)]).to_pylist(),
        "tar": write_shards(root / "tar", tar, per_shard=20),
    }


def pillow(data: bytes, mode: str = "RGB") -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def as_python(value: Any) -> Any:
    return value.tolist() if isinstance(value, torch.Tensor) else value


# -- values ------------------------------------------------------------------------


def test_every_column_of_every_row_equals_pyarrow(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(data["files"])
    ref = data["reference"]
    assert len(ds) == N and ds.columns == list(ref[0])
    rows = []
    for batch in chute.DataLoader(ds, batch_size=7):
        assert isinstance(batch["id"], torch.Tensor) and batch["label"].dtype == torch.int16
        assert batch["flag"].dtype == torch.bool and batch["score"].dtype == torch.float32
        n = len(batch["id"])
        rows.extend({k: as_python(v)[i] for k, v in batch.items()} for i in range(n))
    assert rows == ref
    # One row at a time, and negative indices as a sequence takes them.
    assert {k: as_python(v) for k, v in ds[12].items()} == ref[12]
    assert {k: as_python(v) for k, v in ds[-1].items()} == ref[-1]
    with pytest.raises(IndexError, match="index 47 is out of range for a dataset of length 47"):
        ds[N]


def test_projection_reads_only_the_columns_asked_for(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(data["files"], columns=["caption", "id"])
    batch = next(iter(chute.DataLoader(ds, batch_size=N)))
    assert list(batch) == ["caption", "id"]
    assert batch["caption"] == [r["caption"] for r in data["reference"]]


@pytest.mark.parametrize("spec", ["torchrgb8", "rgb8", "l8"])
def test_decoded_images_equal_pillow(data: dict[str, Any], spec: str) -> None:
    # decode=spec decodes the image structs; {column: spec} names a binary column.
    ds = chute.ParquetDataset(data["files"], ["image", "raw", "id"], decode=spec)
    named = chute.ParquetDataset(data["files"], ["raw"], decode={"raw": spec})
    mode = "L" if spec == "l8" else "RGB"
    got = [b for batch in chute.DataLoader(ds, batch_size=9) for b in batch["image"]]
    raw = [b for batch in chute.DataLoader(named, batch_size=9) for b in batch["raw"]]
    for i, s in enumerate(data["samples"]):
        expected = pillow(s.get("jpg") or s.get("png"), mode)
        for image in (got[i], raw[i]):
            pixels = image.permute(1, 2, 0).numpy() if spec == "torchrgb8" else image.numpy()
            np.testing.assert_array_equal(pixels, expected)
    # Undecoded binary columns stay bytes.
    assert ds[4]["raw"] == data["reference"][4]["raw"]


def test_train_transforms_equal_tar_dataset_over_the_same_images(data: dict[str, Any]) -> None:
    opts: dict[str, Any] = {
        "size": (16, 16),
        "crop": "random_resized",
        "flip": True,
        "normalize": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        "dtype": torch.float16,
    }
    ours = chute.ParquetDataset(data["files"], ["image", "label"], "torchrgb8", seed=5, **opts)
    tar = chute.TarDataset(data["tar"], "torchrgb8", ("jpg;png", "cls"), seed=5, **opts)
    firsts = []
    for epoch in (0, 1):
        ours.set_epoch(epoch)
        tar.set_epoch(epoch)
        a = list(chute.DataLoader(ours, batch_size=10))
        b = list(chute.DataLoader(tar, batch_size=10))
        for x, y in zip(a, b, strict=True):
            assert x["image"].dtype == torch.float16 and x["image"].shape[1:] == (3, 16, 16)
            assert torch.equal(x["image"], y[0])
            assert x["label"].tolist() == y[1].tolist()
        firsts.append(a[0]["image"])
    assert not torch.equal(firsts[0], firsts[1])  # the draws change with the epoch


# -- order, ranks, resume -------------------------------------------------------------


class _Rows(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def test_shuffle_is_torchs_seeded_permutation(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(data["files"], ["id"], cache_bytes=0, readahead=2)

    def ids(loader: Any) -> list[list[int]]:
        return [b["id"].tolist() for b in loader]

    ours = ids(
        chute.DataLoader(ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(4))
    )
    torch_order = ids(
        {"id": b}
        for b in torch.utils.data.DataLoader(
            _Rows(), batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(4)
        )
    )
    assert ours == torch_order
    assert sorted(itertools.chain(*ours)) == list(range(N))
    other = ids(
        chute.DataLoader(ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(5))
    )
    assert other != ours
    # cache_bytes=0 keeps only the row groups of the batches in flight.
    assert ds.stats()["row_group_bytes_held"] == 0


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_ranks_are_disjoint_complete_and_equal(
    data: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = chute.ParquetDataset(data["files"], ["id"])
    seen, counts = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        loader = chute.DataLoader(ds, batch_size=4, distributed=True, seed=11, drop_last=False)
        loader.set_epoch(2)
        batches = [b["id"].tolist() for b in loader]
        sampler = torch.utils.data.DistributedSampler(_Rows(), world, rank, seed=11)
        sampler.set_epoch(2)
        assert list(itertools.chain(*batches)) == list(sampler)
        counts.append(len(batches))
        seen.extend(itertools.chain(*batches))
    assert len(set(counts)) == 1
    assert set(seen) == set(range(N))


def test_resume_mid_epoch_is_exact(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(
        data["files"], ["id", "image"], decode="torchrgb8", seed=2, size=8, crop="random", flip=True
    )

    def loader() -> chute.DataLoader[Any]:
        return chute.DataLoader(
            ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(9)
        )

    assert_resume_mid_epoch_is_exact(loader, ["id", "image"])


@pytest.mark.parametrize("world", [2, 3, 6])
def test_elastic_resume_delivers_every_row_once(
    data: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = chute.ParquetDataset(data["files"], ["id"])

    def loader() -> chute.DataLoader[Any]:
        return chute.DataLoader(ds, batch_size=3, distributed=True, shuffle=True, seed=3)

    first, states = run_ranks(monkeypatch, 4, loader, batch_ids, batches=2)
    second, _ = run_ranks(monkeypatch, world, loader, batch_ids, state=states[0])
    seen = counts(first, second)
    assert set(seen) == set(range(N)) and set(seen.values()) == {1}
    assert len({len(rank) for rank in second}) == 1  # equal batch counts


def test_state_of_other_files_is_refused(data: dict[str, Any], tmp_path: Path) -> None:
    state_loader = chute.DataLoader(chute.ParquetDataset(data["files"], ["id"]), batch_size=5)
    it = iter(state_loader)
    next(it)
    state = state_loader.state_dict()
    assert state["loader"]["dataset"]["type"] == "ParquetDataset"
    # The same rows and columns in other files, and the same path rewritten with other row groups.
    copy = tmp_path / "copy.parquet"
    pq.write_table(pa.concat_tables([pq.read_table(f) for f in data["files"]]), copy)
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        chute.DataLoader(chute.ParquetDataset([str(copy)], ["id"]), batch_size=5).load_state_dict(
            state
        )
    same_path = tmp_path / "again"
    same_path.mkdir()
    files = []
    for k, f in enumerate(data["files"]):
        target = same_path / f"part-{k}.parquet"
        pq.write_table(pq.read_table(f), target, row_group_size=3)
        files.append(str(target))
    ours = chute.DataLoader(chute.ParquetDataset(files, ["id"]), batch_size=5)
    next(iter(ours))
    good = ours.state_dict()
    pq.write_table(pq.read_table(files[0]), files[0], row_group_size=4)
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        chute.DataLoader(chute.ParquetDataset(files, ["id"]), batch_size=5).load_state_dict(good)


def test_pickles_without_native_state(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(data["files"], ["id", "image"], decode="torchrgb8")
    first = ds[20]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._proc is None
    again = copy[20]
    assert again["id"] == first["id"] and torch.equal(again["image"], first["image"])


def ids_of(rows: list[dict[str, Any]]) -> list[int]:
    return [int(r["id"]) for r in rows]


def test_worker_processes_of_both_loaders(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(data["files"], ["id"])
    ref = [r["id"] for r in data["reference"]]
    # chute's workers run a custom collate_fn; torch's pickle the dataset.
    ours = chute.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=ids_of)
    assert [i for batch in ours for i in batch] == ref
    theirs = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    assert [i for batch in theirs for i in batch["id"].tolist()] == ref


def test_row_groups_beyond_the_cache_bound_are_dropped(data: dict[str, Any]) -> None:
    ds = chute.ParquetDataset(data["files"], ["id", "image"], decode="torchrgb8", cache_bytes=1)
    ids = [b["id"].tolist() for b in chute.DataLoader(ds, batch_size=4, shuffle=True)]
    assert sorted(itertools.chain(*ids)) == list(range(N))
    state = ds._state()
    assert state.sources[0].blocks_held <= 1  # what the last batch left, at most
    assert ds.stats()["row_groups_read"] >= 8


# -- the command line ----------------------------------------------------------------------


def test_inspect_and_bench_read_parquet(
    data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from chute.cli.main import main

    assert main(["inspect", "--first", "2", data["files"][0]]) == 0
    out = capsys.readouterr().out
    assert "part-0.parquet: Parquet file" in out
    assert "rows: 30   row groups: 4 (6..8 rows each)" in out
    assert "    image: struct<bytes: binary, path: string> -> image" in out
    assert "    label: int16 -> tensor" in out and "    caption: string -> list" in out
    assert "  row 0 image: png 30x24" in out and "  row 1 image: jpeg 30x24" in out
    assert (
        main(
            [
                "bench",
                *data["files"],
                "--decode",
                "torchrgb8",
                "--size",
                "16",
                "--json",
                "--columns",
                "image,label",
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    (result,) = json.loads(capsys.readouterr().out)
    assert result["loader"] == "chute (parquet)" and result["samples"] == N
    with pytest.raises(SystemExit) as usage:
        main(["bench", data["files"][0], data["tar"][0]])
    assert usage.value.code == 2
    assert "all of one kind (the first is parquet); this is not one" in capsys.readouterr().err


# -- bad input ---------------------------------------------------------------------------


def test_missing_column_names_the_file(data: dict[str, Any]) -> None:
    with pytest.raises(
        ValueError, match=r"'.*part-0.parquet' has no column 'nope' \(its columns: id, image"
    ):
        chute.ParquetDataset(data["files"], ["id", "nope"])


def test_decoding_a_column_that_is_not_binary(data: dict[str, Any]) -> None:
    with pytest.raises(
        ValueError,
        match=r"column 'caption' of '.*part-0.parquet' is string, not binary: it cannot be decoded",
    ):
        chute.ParquetDataset(data["files"], decode={"caption": "rgb8"})
    with pytest.raises(
        ValueError, match=r"decode='rgb8' decodes the image columns .* none of \['id'\]"
    ):
        chute.ParquetDataset(data["files"], ["id"], decode="rgb8")
    with pytest.raises(ValueError, match=r"decode options \['size'\] need decode="):
        chute.ParquetDataset(data["files"], ["id"], size=8)
    with pytest.raises(FileNotFoundError):
        chute.ParquetDataset(str(Path(data["files"][0]).with_name("absent.parquet")))


def test_file_that_is_not_parquet(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + bytes(100) + b"garbage!")
    with pytest.raises(chute.DataError, match=r"'.*bad.parquet' is not a readable Parquet file"):
        chute.ParquetDataset(str(bad))


def test_corrupt_row_group_names_file_and_row_group(data: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "cut.parquet"
    pq.write_table(pq.read_table(data["files"][0]), path, row_group_size=8, compression="none")
    chunk = pq.read_metadata(path).row_group(2).column(0)
    raw = bytearray(path.read_bytes())
    raw[chunk.data_page_offset : chunk.data_page_offset + 16] = b"\xff" * 16
    path.write_bytes(bytes(raw))
    ds = chute.ParquetDataset(str(path), ["id"])
    assert ds[3]["id"] == 3  # row group 0 is fine
    with pytest.raises(chute.DataError, match=r"file '.*cut.parquet', row group 2: "):
        ds[17]
    with pytest.raises(chute.DataError, match=r"file '.*cut.parquet', row group 2: "):
        list(chute.DataLoader(ds, batch_size=8))


def test_file_cut_after_open_raises(data: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "cut-later.parquet"
    pq.write_table(pq.read_table(data["files"][0]), path, row_group_size=8)
    ds = chute.ParquetDataset(str(path), ["id", "raw"], cache_bytes=0)
    assert ds[0]["id"] == 0  # the file is open now
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3)
    with pytest.raises(chute.DataError, match=r"file '.*cut-later.parquet', row group 3: "):
        ds[29]


def test_corrupt_image_names_file_row_group_row_and_column(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    good = png_bytes(rng, 8, 8)
    images = [{"bytes": good, "path": "a"}] * 5 + [{"bytes": good[:30], "path": "b"}]
    path = tmp_path / "broken.parquet"
    pq.write_table(pa.table({"image": pa.array(images, IMAGE)}), path, row_group_size=4)
    ds = chute.ParquetDataset(str(path), decode="rgb8")
    assert ds[0]["image"].shape == (8, 8, 3)
    with pytest.raises(
        chute.DataError,
        match=r"file '.*broken.parquet', row group 1, row 1 \(sample 5\), column 'image'",
    ):
        list(chute.DataLoader(ds, batch_size=3))


# -- nulls in numeric columns ----------------------------------------------------------------


def null_table(path: Path) -> Path:
    """Three numeric columns with nulls (rows 5 and 9), one without."""
    n = 12
    nulls = {5, 9}
    pq.write_table(
        pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "label": pa.array([None if i in nulls else i for i in range(n)], pa.int16()),
                "score": pa.array([None if i in nulls else i / 4 for i in range(n)], pa.float32()),
                "flag": pa.array([None if i in nulls else i % 2 == 0 for i in range(n)]),
                "count": pa.array([None if i in nulls else i for i in range(n)], pa.uint8()),
            }
        ),
        path,
        row_group_size=4,
    )
    return path


def test_null_in_a_numeric_column_names_file_row_group_row_and_column(tmp_path: Path) -> None:
    ds = chute.ParquetDataset(str(null_table(tmp_path / "nulls.parquet")), ["id", "label"])
    assert ds[4]["label"] == 4
    where = (
        r"file '.*nulls.parquet', row group 1, row 1 \(sample 5\), column 'label': null, which a "
        r"tensor cannot hold; ParquetDataset\(fill_null=\{'label': value\}\) fills it"
    )
    with pytest.raises(chute.DataError, match=where):
        ds[5]
    with pytest.raises(chute.DataError, match=where):
        list(chute.DataLoader(ds, batch_size=4))


def test_fill_null_fills_each_null_with_its_columns_value(tmp_path: Path) -> None:
    path = null_table(tmp_path / "nulls.parquet")
    fills = {"label": -1, "score": float("nan"), "flag": False, "count": 255}
    ds = chute.ParquetDataset(str(path), fill_null=fills)
    table = pq.read_table(path)
    expected = {c: table.column(c).fill_null(v).to_pylist() for c, v in fills.items()}
    expected["id"] = list(range(12))
    got: dict[str, list[Any]] = collections.defaultdict(list)
    for batch in chute.DataLoader(ds, batch_size=5):
        assert batch["label"].dtype == torch.int16 and batch["count"].dtype == torch.uint8
        assert batch["flag"].dtype == torch.bool and batch["score"].dtype == torch.float32
        for name, value in batch.items():
            got[name].extend(value.tolist())
    for name, values in expected.items():
        np.testing.assert_array_equal(np.array(got[name]), np.array(values), err_msg=name)
    assert ds[9]["label"] == -1 and ds[9]["count"] == 255 and ds[8]["label"] == 8


@pytest.mark.parametrize(
    ("fills", "message"),
    [
        ({"count": -1}, "fill_null: -1 is not a value of column 'count' (uint8)"),
        ({"label": 40000}, "fill_null: 40000 is not a value of column 'label' (int16)"),
        ({"label": 0.5}, "fill_null: 0.5 is not a value of column 'label' (int16)"),
        ({"label": True}, "fill_null: True is not a value of column 'label' (int16)"),
        ({"flag": 1}, "fill_null: 1 is not a value of column 'flag' (bool)"),
        ({"score": "0"}, "fill_null: '0' is not a value of column 'score' (float)"),
        ({"name": 0}, "fill_null names column 'name', which is not among ['id', 'label', "),
    ],
)
def test_fill_null_refuses_values_the_column_cannot_hold(
    tmp_path: Path, fills: dict[str, Any], message: str
) -> None:
    path = null_table(tmp_path / "nulls.parquet")
    with pytest.raises(ValueError, match=re.escape(message)):
        chute.ParquetDataset(str(path), ["id", "label", "score", "flag", "count"], fill_null=fills)


def test_fill_null_of_a_column_that_is_not_numeric(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as e:
        chute.ParquetDataset(data["files"], ["id", "caption"], fill_null={"caption": 0})
    assert (
        str(e.value)
        == "fill_null: column 'caption' is string, not numeric (its nulls come back as None)"
    )


# -- images that do not decode: the handler --------------------------------------------------


BAD_ROWS = (5, 9, 10, 11)  # rows 9-11: a whole batch of three


def broken_images(path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(4)
    good = [png_bytes(rng, 6, 5) for _ in range(14)]
    images = [
        {"bytes": b[:30] if i in BAD_ROWS else b, "path": f"{i}.png"} for i, b in enumerate(good)
    ]
    table = pa.table({"image": pa.array(images, IMAGE), "label": pa.array(range(14), pa.int64())})
    pq.write_table(table, path, row_group_size=4)
    return {"path": str(path), "pixels": [pillow(b) for b in good]}


def batches_of(ds: Any, **kw: Any) -> list[tuple[list[int], torch.Tensor]]:
    return [(b["label"].tolist(), b["image"]) for b in chute.DataLoader(ds, **kw)]


def test_warn_and_continue_drops_the_rows_whose_image_does_not_decode(tmp_path: Path) -> None:
    data = broken_images(tmp_path / "broken.parquet")
    ds = chute.ParquetDataset(data["path"], decode="rgb8", handler=wds.warn_and_continue)
    with pytest.warns(chute.SkippedSampleWarning) as caught:
        got = batches_of(ds, batch_size=3)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 4
    assert re.search(
        r"broken.parquet', row group 1, row 1 \(sample 5\), column 'image'", messages[0]
    )
    # Row 5 leaves its batch shorter, rows 9-11 leave no batch; every column alike.
    assert [labels for labels, _ in got] == [[0, 1, 2], [3, 4], [6, 7, 8], [12, 13]]
    for labels, images in got:
        assert images.shape == (len(labels), 6, 5, 3)
        for label, image in zip(labels, images, strict=True):
            np.testing.assert_array_equal(image.numpy(), data["pixels"][label])
    assert ds.stats()["samples_skipped"] == 4
    # Shuffled and in worker processes (a custom collate_fn), the same rows come out.
    with pytest.warns(chute.SkippedSampleWarning):
        shuffled = batches_of(ds, batch_size=4, shuffle=True)
    assert sorted(i for labels, _ in shuffled for i in labels) == [0, 1, 2, 3, 4, 6, 7, 8, 12, 13]
    quiet = chute.ParquetDataset(data["path"], decode="rgb8", handler=wds.ignore_and_continue)
    in_workers = chute.DataLoader(quiet, batch_size=3, num_workers=2, collate_fn=labels_of)
    assert [labels for labels in in_workers] == [[0, 1, 2], [3, 4], [6, 7, 8], [12, 13]]
    # One row asked for alone has nothing to give: its error is raised.
    with pytest.raises(chute.DataError, match=r"row group 1, row 1 \(sample 5\), column 'image'"):
        quiet[5]


def labels_of(rows: list[dict[str, Any]]) -> list[int]:
    return [int(r["label"]) for r in rows]


def test_a_stopping_handler_ends_the_epoch_at_the_first_bad_row(tmp_path: Path) -> None:
    data = broken_images(tmp_path / "broken.parquet")
    ds = chute.ParquetDataset(data["path"], decode="rgb8", handler=wds.ignore_and_stop)
    assert [labels for labels, _ in batches_of(ds, batch_size=3)] == [[0, 1, 2], [3, 4]]
    loud = chute.ParquetDataset(data["path"], decode="rgb8", handler=wds.warn_and_stop)
    with pytest.warns(chute.SkippedSampleWarning, match=r"row 1 \(sample 5\)"):
        assert [labels for labels, _ in batches_of(loud, batch_size=4)] == [[0, 1, 2, 3], [4, 6, 7]]


def test_a_null_image_is_skipped_by_the_handler_like_one_that_does_not_decode(
    tmp_path: Path,
) -> None:
    good = png_bytes(np.random.default_rng(5), 6, 5)
    images = [{"bytes": good, "path": "a"}, None, {"bytes": good, "path": "c"}]
    path = tmp_path / "null-image.parquet"
    pq.write_table(pa.table({"image": pa.array(images, IMAGE), "label": [0, 1, 2]}), path)
    ds = chute.ParquetDataset(str(path), decode="rgb8", handler=wds.ignore_and_continue)
    [batch] = list(chute.DataLoader(ds, batch_size=3))
    assert batch["label"].tolist() == [0, 2] and batch["image"].shape == (2, 6, 5, 3)
