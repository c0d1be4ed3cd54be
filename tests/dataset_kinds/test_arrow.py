"""ArrowDataset against Hugging Face ``datasets``' own reading of what it
wrote (``save_to_disk`` directories, a ``DatasetDict``, its cache files:
every column of every row, images pixel-equal), pyarrow's reading of
Feather and IPC files, and torch's samplers (order, DDP split, resume,
elastic resume)."""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
import torch
from conftest import image_samples, png_bytes
from helpers import assert_resume_mid_epoch_is_exact, batch_ids, counts, run_ranks
from PIL import Image

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

datasets = pytest.importorskip("datasets")

N = 230  # two shards of record batches of 100 rows at most (datasets' batch for images)


def features() -> Any:
    return datasets.Features(
        {
            "id": datasets.Value("int64"),
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
            "score": datasets.Value("float32"),
            "maybe": datasets.Value("int16"),
            "caption": datasets.Value("string"),
            "pair": datasets.Sequence(datasets.Value("float32"), length=2),
            "grid": datasets.Array2D((2, 3), "int32"),
            "tags": datasets.Sequence(datasets.Value("int32")),
            "meta": {"source": datasets.Value("string"), "rank": datasets.Value("int8")},
        }
    )


def rows_of(samples: list[dict[str, Any]]) -> dict[str, list[Any]]:
    n = len(samples)
    rng = np.random.default_rng(1)
    return {
        "id": list(range(n)),
        "image": [
            {"bytes": s.get("jpg") or s.get("png"), "path": f"{i}.img"}
            for i, s in enumerate(samples)
        ],
        "label": [i % 3 for i in range(n)],
        "score": [float(np.float32(i / 7)) for i in range(n)],
        "maybe": [None if i % 11 == 3 else i - 100 for i in range(n)],
        "caption": [None if i % 13 == 5 else f"row {i}" for i in range(n)],
        "pair": [[i, -i] for i in range(n)],
        "grid": [rng.integers(-5, 5, (2, 3)).tolist() for _ in range(n)],
        "tags": [list(range(i % 4)) for i in range(n)],
        "meta": [{"source": f"s{i % 5}", "rank": i % 7} for i in range(n)],
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("arrow")
    samples = image_samples(N, seed=3, size=(12, 10), png_every=5)
    ds = datasets.Dataset.from_dict(rows_of(samples), features=features())
    ds.save_to_disk(str(root / "saved"), num_shards=2)
    reference = datasets.load_from_disk(str(root / "saved"))
    return {
        "dir": str(root / "saved"),
        "root": root,
        "reference": reference,
        "raw": reference.cast_column("image", datasets.Image(decode=False)),
    }


def pixels(image: Any) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def as_python(value: Any) -> Any:
    return value.tolist() if isinstance(value, torch.Tensor) else value


def all_rows(ds: Any, batch_size: int = 32, **kw: Any) -> list[dict[str, Any]]:
    out = []
    for batch in chute.DataLoader(ds, batch_size=batch_size, **kw):
        n = len(next(iter(batch.values())))
        out.extend({k: v[i] for k, v in batch.items()} for i in range(n))
    return out


# -- values ------------------------------------------------------------------------


def test_every_row_of_a_saved_directory_equals_load_from_disk(saved: dict[str, Any]) -> None:
    names = ["id", "image", "label", "score", "caption", "pair", "grid", "tags", "meta"]
    ds = chute.ArrowDataset(saved["dir"], names, decode="rgb8")
    assert len(ds) == N and len(ds.urls) == 2
    assert len(ds._record_batches) > 2  # several record batches per file
    ref = saved["reference"]
    got = all_rows(ds)
    assert len(got) == N
    for i, row in enumerate(got):
        want = ref[i]
        np.testing.assert_array_equal(row["image"].numpy(), pixels(want["image"]), err_msg=str(i))
        for name in ("id", "label", "score", "pair", "grid"):
            assert as_python(row[name]) == want[name], (i, name)
        for name in ("caption", "tags", "meta"):
            assert row[name] == want[name], (i, name)
    assert got[0]["grid"].dtype == torch.int32 and got[0]["grid"].shape == (2, 3)
    assert got[0]["pair"].dtype == torch.float32 and got[0]["label"].dtype == torch.int64


def test_undecoded_images_are_the_hub_struct_as_datasets_keeps_it(saved: dict[str, Any]) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["image", "id"])
    raw = saved["raw"]
    for i in (0, 99, 100, 229):
        assert ds[i]["image"] == raw[i]["image"] and ds[i]["id"] == i


def test_nulls_in_a_numeric_column(saved: dict[str, Any]) -> None:
    ref = saved["reference"]
    with pytest.raises(
        chute.DataError,
        match=r"record batch 0, row 3 \(sample 3\), column 'maybe': null, which a tensor "
        r"cannot hold; ArrowDataset\(fill_null=\{'maybe': value\}\) fills it",
    ):
        chute.ArrowDataset(saved["dir"], ["maybe"])[3]
    ds = chute.ArrowDataset(saved["dir"], ["maybe"], fill_null={"maybe": -1})
    got = [int(r["maybe"]) for r in all_rows(ds)]
    assert got == [-1 if v is None else v for v in ref["maybe"]]
    with pytest.raises(ValueError, match=r"fill_null: 40000 is not a value of column 'maybe'"):
        chute.ArrowDataset(saved["dir"], ["maybe"], fill_null={"maybe": 40000})


def test_a_dataset_dict_directory_reads_the_split_named(saved: dict[str, Any]) -> None:
    root = saved["root"] / "dict"
    whole = saved["raw"]
    datasets.DatasetDict(
        {"train": whole.select(range(150)), "test": whole.select(range(150, N))}
    ).save_to_disk(str(root))
    with pytest.raises(ValueError, match=r"holds a DatasetDict of splits \['train', 'test'\]"):
        chute.ArrowDataset(str(root))
    test = chute.ArrowDataset(str(root), ["id"], split="test")
    assert [int(r["id"]) for r in all_rows(test)] == list(range(150, N))


def test_cache_files_with_image_paths_read_the_files(tmp_path: Path) -> None:
    # datasets keeps images made from files as their paths (bytes null) in its cache.
    rng = np.random.default_rng(2)
    paths = []
    for k in range(6):
        p = tmp_path / f"img{k}.png"
        p.write_bytes(png_bytes(rng, 7, 9))
        paths.append(str(p))

    def rows() -> Any:
        for i in range(20):
            yield {"image": paths[i % 6] if i % 4 else os.path.basename(paths[i % 6]), "n": i}

    gen = datasets.Dataset.from_generator(
        rows,
        features=datasets.Features({"image": datasets.Image(), "n": datasets.Value("int32")}),
        writer_batch_size=6,
        cache_dir=str(tmp_path / "cache"),
    )
    [cache_file] = [f["filename"] for f in gen.cache_files]
    held = pa.ipc.open_stream(pa.memory_map(cache_file)).read_all().column("image").to_pylist()
    assert held[1]["bytes"] is None and held[0]["path"] == "img0.png"
    ds = chute.ArrowDataset(cache_file, decode="rgb8", base=tmp_path)
    got = all_rows(ds, batch_size=5)
    for i, row in enumerate(got):
        np.testing.assert_array_equal(row["image"].numpy(), pixels(Image.open(paths[i % 6])))
        assert int(row["n"]) == i
    # Without base, a relative path is the current directory's, as datasets opens it.
    elsewhere = chute.ArrowDataset(cache_file, decode="rgb8")
    with pytest.raises(chute.ReadError, match=r"column 'image': the image at path 'img0.png'"):
        elsewhere[0]


@pytest.mark.parametrize("compression", ["uncompressed", "lz4", "zstd"])
def test_feather_and_ipc_files_equal_pyarrow(tmp_path: Path, compression: str) -> None:
    samples = image_samples(25, seed=6, size=(8, 8))
    table = pa.table(
        {
            "image": pa.array([s["jpg"] for s in samples], pa.binary()),
            "x": pa.array(np.arange(25, dtype=np.float64) / 3),
            "v": pa.array([[i, i + 1, i + 2] for i in range(25)], pa.list_(pa.int8(), 3)),
            "s": [f"#{i}" for i in range(25)],
        }
    )
    path = tmp_path / "t.feather"
    feather.write_feather(table, path, compression=compression, chunksize=6)
    stream = tmp_path / "t.arrows"
    with pa.ipc.new_stream(stream, table.schema) as w:
        w.write_table(table, max_chunksize=7)
    for f in (path, stream):
        ds = chute.ArrowDataset(str(f), decode={"image": "rgb8"})
        got = all_rows(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
        by_s = {r["s"]: r for r in got}
        for i, s in enumerate(samples):
            row = by_s[f"#{i}"]
            np.testing.assert_array_equal(
                row["image"].numpy(), pixels(Image.open(io.BytesIO(s["jpg"])))
            )
            assert float(row["x"]) == table.column("x")[i].as_py()
            assert row["v"].tolist() == [i, i + 1, i + 2] and row["v"].dtype == torch.int8


def test_train_transforms_equal_parquet_over_the_same_images(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    table = pa.ipc.open_stream(
        pa.memory_map(str(Path(saved["dir"]) / "data-00000-of-00002.arrow"))
    ).read_all()
    pq.write_table(table.select(["image", "id"]), tmp_path / "same.parquet", row_group_size=30)
    opts = dict(decode="torchrgb8", seed=3, size=8, crop="random_resized", flip=True)
    ours = chute.ArrowDataset(
        str(Path(saved["dir"]) / "data-00000-of-00002.arrow"), ["image", "id"], **opts
    )
    theirs = chute.ParquetDataset(str(tmp_path / "same.parquet"), ["image", "id"], **opts)
    for a, b in zip(
        chute.DataLoader(ours, batch_size=16), chute.DataLoader(theirs, batch_size=16), strict=True
    ):
        assert a["id"].tolist() == b["id"].tolist()
        assert torch.equal(a["image"], b["image"])


# -- order, ranks, resume -------------------------------------------------------------


class _Rows(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def test_shuffle_is_torchs_seeded_permutation(saved: dict[str, Any]) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["id"], cache_bytes=0, readahead=2)

    def ids(loader: Any) -> list[list[int]]:
        return [b["id"].tolist() for b in loader]

    ours = ids(
        chute.DataLoader(
            ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(4)
        )
    )
    theirs = ids(
        {"id": b}
        for b in torch.utils.data.DataLoader(
            _Rows(), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(4)
        )
    )
    assert ours == theirs and sorted(itertools.chain(*ours)) == list(range(N))


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_ranks_are_disjoint_complete_and_equal(
    saved: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["id"])
    seen, counts = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        loader = chute.DataLoader(ds, batch_size=8, distributed=True, seed=11, drop_last=False)
        loader.set_epoch(2)
        batches = [b["id"].tolist() for b in loader]
        sampler = torch.utils.data.DistributedSampler(_Rows(), world, rank, seed=11)
        sampler.set_epoch(2)
        assert list(itertools.chain(*batches)) == list(sampler)
        counts.append(len(batches))
        seen.extend(itertools.chain(*batches))
    assert len(set(counts)) == 1 and set(seen) == set(range(N))


def test_resume_mid_epoch_is_exact(saved: dict[str, Any]) -> None:
    ds = chute.ArrowDataset(
        saved["dir"], ["id", "image"], decode="torchrgb8", seed=2, size=8, crop="random", flip=True
    )

    def loader() -> chute.DataLoader[Any]:
        return chute.DataLoader(
            ds, batch_size=20, shuffle=True, generator=torch.Generator().manual_seed(9)
        )

    state = assert_resume_mid_epoch_is_exact(loader, ["id", "image"])
    assert state["loader"]["dataset"]["type"] == "ArrowDataset"


@pytest.mark.parametrize("world", [2, 3, 6])
def test_elastic_resume_delivers_every_row_once(
    saved: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["id"])

    def loader() -> chute.DataLoader[Any]:
        return chute.DataLoader(ds, batch_size=9, distributed=True, shuffle=True, seed=3)

    first, states = run_ranks(monkeypatch, 4, loader, batch_ids, batches=2)
    second, _ = run_ranks(monkeypatch, world, loader, batch_ids, state=states[0])
    seen = counts(first, second)
    assert set(seen) == set(range(N)) and set(seen.values()) == {1}
    assert len({len(rank) for rank in second}) == 1


def test_state_of_other_files_is_refused(saved: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(saved["dir"], copy)
    ours = chute.DataLoader(chute.ArrowDataset(str(copy), ["id"]), batch_size=5)
    next(iter(ours))
    good = ours.state_dict()
    # The same rows written again in record batches of another size.
    path = copy / "data-00000-of-00002.arrow"
    table = pa.ipc.open_stream(path.read_bytes()).read_all()
    with pa.ipc.new_stream(str(path) + ".tmp", table.schema) as w:
        w.write_table(table, max_chunksize=33)
    os.replace(str(path) + ".tmp", path)
    with pytest.raises(ValueError, match=r"another dataset \(its files"):
        chute.DataLoader(chute.ArrowDataset(str(copy), ["id"]), batch_size=5).load_state_dict(good)


def test_pickles_without_native_state(saved: dict[str, Any]) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["id", "image"], decode="torchrgb8")
    first = ds[120]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._proc is None and copy._per_process == {}
    again = copy[120]
    assert again["id"] == first["id"] and torch.equal(again["image"], first["image"])


def ids_of(rows: list[dict[str, Any]]) -> list[int]:
    return [int(r["id"]) for r in rows]


def test_worker_processes_of_both_loaders(saved: dict[str, Any]) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["id", "caption"])
    ours = chute.DataLoader(ds, batch_size=16, num_workers=2, collate_fn=ids_of)
    assert [i for batch in ours for i in batch] == list(range(N))
    theirs = torch.utils.data.DataLoader(
        chute.ArrowDataset(saved["dir"], ["id"]), batch_size=16, num_workers=2
    )
    assert [i for batch in theirs for i in batch["id"].tolist()] == list(range(N))


def test_blocks_beyond_the_cache_bound_are_dropped(saved: dict[str, Any]) -> None:
    ds = chute.ArrowDataset(saved["dir"], ["id", "image"], decode="torchrgb8", cache_bytes=1)
    ids = [b["id"].tolist() for b in chute.DataLoader(ds, batch_size=32, shuffle=True)]
    assert sorted(itertools.chain(*ids)) == list(range(N))
    assert ds._state().sources[0].blocks_held <= 1  # what the last batch left, at most
    # One batch at a time, each block dropped once its batch is done: read again.
    again = chute.ArrowDataset(saved["dir"], ["id"], cache_bytes=1, readahead=1)
    batches = list(again.iter_batches([[0], [150], [1], [151]], num_threads=1, prefetch=1))
    assert [b["id"].tolist() for b in batches] == [[0], [150], [1], [151]]
    assert again.stats()["blocks_read"] == 4


def test_more_files_than_mappings_and_no_mapping_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chute.datasets import arrow

    paths = []
    for k in range(arrow._MAPPINGS + 6):
        path = tmp_path / f"part-{k:03d}.arrow"
        feather.write_feather(pa.table({"n": [2 * k, 2 * k + 1]}), path, compression="uncompressed")
        paths.append(str(path))
    ds = chute.ArrowDataset(str(tmp_path / "part-*.arrow"))
    expected = list(range(2 * len(paths)))
    assert [int(r["n"]) for r in all_rows(ds, batch_size=7, shuffle=True)] != expected
    assert sorted(int(r["n"]) for r in all_rows(ds, batch_size=7, shuffle=True)) == expected
    assert len(ds._mappings) == arrow._MAPPINGS
    # When the process can map no more files, record batches are read into memory.
    monkeypatch.setattr(arrow._core, "_map_file", lambda path: None)
    unmapped = chute.ArrowDataset(str(tmp_path / "part-*.arrow"))
    assert [int(r["n"]) for r in all_rows(unmapped, batch_size=7)] == expected
    assert unmapped._mappings == {} and unmapped.stats()["block_bytes_held"] > 0


# -- errors ---------------------------------------------------------------------------


def test_missing_column_and_not_binary(saved: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"data-00000-of-00002.arrow' has no column 'nope'"):
        chute.ArrowDataset(saved["dir"], ["id", "nope"])
    with pytest.raises(ValueError, match=r"column 'caption' of '.*' is string, not binary"):
        chute.ArrowDataset(saved["dir"], ["caption"], decode={"caption": "rgb8"})


def test_files_that_are_not_arrow(tmp_path: Path) -> None:
    bad = tmp_path / "x.arrow"
    bad.write_bytes(b"\x00" * 3 + b"not arrow at all" * 10)
    with pytest.raises(chute.DataError, match=r"'.*x.arrow' is not a readable Arrow IPC file"):
        chute.ArrowDataset(str(bad))
    empty = tmp_path / "e.arrow"
    empty.write_bytes(b"")
    with pytest.raises(chute.DataError, match=r"it is empty"):
        chute.ArrowDataset(str(empty))
    with pytest.raises(FileNotFoundError, match="no state.json here"):
        chute.ArrowDataset(str(tmp_path))
    v1 = tmp_path / "v1.feather"
    with pytest.warns(DeprecationWarning):  # pyarrow still writes them
        feather.write_feather(pa.table({"a": [1, 2]}), v1, version=1)
    with pytest.raises(chute.DataError, match=r"Feather version 1 file"):
        chute.ArrowDataset(str(v1))
    dictionary = tmp_path / "d.arrow"
    feather.write_feather(
        pa.table({"a": pa.array(["x", "y", "x"]).dictionary_encode()}), dictionary
    )
    with pytest.raises(chute.DataError, match=r"dictionary-encoded columns"):
        chute.ArrowDataset(str(dictionary))


def test_file_cut_after_open_raises_naming_it(saved: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "cut.arrow"
    shutil.copy(Path(saved["dir"]) / "data-00000-of-00002.arrow", path)
    ds = chute.ArrowDataset(str(path), ["id", "image"], decode="rgb8")
    assert ds[0]["id"] == 0
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3)
    with pytest.raises(chute.ReadError, match=r"file '.*cut.arrow' was cut to \d+ bytes after"):
        list(chute.DataLoader(ds, batch_size=16))


def test_file_rewritten_in_place_with_another_layout_raises(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "rewritten.arrow"
    shutil.copy(Path(saved["dir"]) / "data-00001-of-00002.arrow", path)
    ds = chute.ArrowDataset(str(path), ["id"], cache_bytes=0)
    first = ds[0]["id"]
    table = pa.ipc.open_stream(path.read_bytes()).read_all()
    with pa.ipc.new_stream(str(path), table.schema) as w:
        w.write_table(table.slice(1), max_chunksize=10)
    with pytest.raises(
        chute.DataError, match=r"rewritten.arrow', record batch \d+: the file changed"
    ):
        list(chute.DataLoader(ds, batch_size=8))
    assert int(first) == 115


def test_a_handler_drops_rows_whose_image_does_not_decode(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    good = [png_bytes(rng, 6, 5) for _ in range(10)]
    images = [b[:30] if i in (3, 7) else b for i, b in enumerate(good)]
    path = tmp_path / "broken.arrow"
    feather.write_feather(
        pa.table({"image": pa.array(images, pa.binary()), "label": range(10)}), path, chunksize=4
    )
    strict = chute.ArrowDataset(str(path), decode={"image": "rgb8"})
    with pytest.raises(
        chute.DataError, match=r"broken.arrow', record batch 0, row 3 \(sample 3\), column 'image'"
    ):
        list(chute.DataLoader(strict, batch_size=5))
    ds = chute.ArrowDataset(str(path), decode={"image": "rgb8"}, handler=wds.ignore_and_continue)
    got = [b["label"].tolist() for b in chute.DataLoader(ds, batch_size=5)]
    assert got == [[0, 1, 2, 4], [5, 6, 8, 9]] and ds.stats()["samples_skipped"] == 2


def test_decode_string_needs_an_image_column(tmp_path: Path) -> None:
    path = tmp_path / "plain.arrow"
    feather.write_feather(pa.table({"a": [1]}), path)
    with pytest.raises(ValueError, match=re.escape("decode='rgb8' decodes the image columns")):
        chute.ArrowDataset(str(path), decode="rgb8")


def test_arrays_read_the_same_without_datasets_imported(saved: dict[str, Any]) -> None:
    # Without datasets in the process its Array2D type is unknown to pyarrow:
    # the shape comes from the field's extension metadata instead.
    code = (
        "import json, sys, chute\n"
        f"ds = chute.ArrowDataset({saved['dir']!r}, ['grid', 'pair'])\n"
        "assert 'datasets' not in sys.modules\n"
        "print(json.dumps([{k: v.tolist() for k, v in ds[i].items()} for i in (0, 150)]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    rows = json.loads(out.stdout)
    ref = saved["reference"]
    assert rows == [{"grid": ref[i]["grid"], "pair": ref[i]["pair"]} for i in (0, 150)]
