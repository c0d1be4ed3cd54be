"""MDSDataset against Mosaic streaming's own writer and reader: shards
written by streaming's ``MDSWriter`` (every encoding MDSDataset reads, each
shard compression), every sample compared with streaming's
``StreamingDataset`` (images pixel-equal); torch's samplers, resume and
elastic resume; pickles refused unless asked for; shards that no longer
match their index refused, naming them."""

from __future__ import annotations

import io
import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, png_bytes
from helpers import assert_resume_mid_epoch_is_exact, batch_ids, counts, run_ranks, streaming_module
from PIL import Image

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

pytest.importorskip("cramjam")


def writer() -> Any:
    return streaming_module("streaming.base.format.mds.writer").MDSWriter


def streaming_rows(directory: Path, tmp: Path) -> list[dict[str, Any]]:
    """Every sample as streaming's StreamingDataset reads it, from a copy of
    `directory` (it decompresses shards into the directory it reads)."""
    StreamingDataset = streaming_module("streaming.base.dataset").StreamingDataset
    copy = tmp / f"streaming-{directory.name}"
    shutil.copytree(directory, copy)
    ds = StreamingDataset(local=str(copy), shuffle=False, batch_size=1)
    return [ds[i] for i in range(ds.num_samples)]


N = 41

COLUMNS = {
    "jpg": "jpeg",
    "png": "png",
    "webp": "bytes",
    "label": "int",
    "u8": "uint8",
    "i16": "int16",
    "u32": "uint32",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "text": "str",
    "si": "str_int",
    "sf": "str_float",
    "sd": "str_decimal",
    "meta": "json",
    "emb": "ndarray:float32:2,3",
    "seq": "ndarray",
    "seq16": "ndarray:int16",
    "raw": "pil",
    "gray": "pil",
    "frames": "list[jpeg]",
    "album": "jpeg_array",
}


def webp_bytes(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)).save(
        out, format="WEBP", lossless=True
    )
    return out.getvalue()


def samples(n: int = N, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append(
            {
                "jpg": Image.open(io.BytesIO(jpeg_bytes(rng, 12, 10))),
                "png": Image.open(io.BytesIO(png_bytes(rng, 8 + i % 3, 6))),
                "webp": webp_bytes(rng),
                "label": i * 1000 - 7,
                "u8": np.uint8(i),
                "i16": np.int16(-i),
                "u32": np.uint32(i * 70000),
                "f16": np.float16(i / 8),
                "f32": np.float32(i / 3),
                "f64": i / 7,
                "text": f"sample {i} ünï",
                "si": i * 3,
                "sf": i / 4,
                "sd": Decimal(f"{i}.25"),
                "meta": {"i": i, "tags": ["a"] * (i % 3)},
                "emb": rng.standard_normal((2, 3)).astype(np.float32),
                "seq": rng.integers(0, 9, (1 + i % 4, 2)).astype(np.int64),
                "seq16": rng.integers(-5, 5, (3 + i % 2,)).astype(np.int16),
                "raw": Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)),
                "gray": Image.fromarray(rng.integers(0, 256, (3, 2), dtype=np.uint8)),
                "frames": [Image.open(io.BytesIO(jpeg_bytes(rng, 8, 8))) for _ in range(1 + i % 2)],
                "album": [jpeg_bytes(rng, 8, 8) for _ in range(2)],
            }
        )
    return out


def write(directory: Path, rows: list[dict[str, Any]], columns: dict[str, str], **kw: Any) -> Path:
    with writer()(out=str(directory), columns=columns, **kw) as w:
        for row in rows:
            w.write(row)
    return directory


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mds")
    directory = write(root / "plain", samples(), COLUMNS, size_limit=6000)
    return {"dir": directory, "root": root, "reference": streaming_rows(directory, root)}


def pixels(image: Any) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def all_rows(ds: Any, batch_size: int = 8, **kw: Any) -> list[dict[str, Any]]:
    out = []
    for batch in chute.DataLoader(ds, batch_size=batch_size, **kw):
        n = len(next(iter(batch.values())))
        out.extend({k: v[i] for k, v in batch.items()} for i in range(n))
    return out


def assert_same(ours: dict[str, Any], theirs: dict[str, Any], i: int) -> None:
    for name, encoding in COLUMNS.items():
        got, want = ours[name], theirs[name]
        where = (i, name)
        if encoding in ("jpeg", "png"):
            np.testing.assert_array_equal(got.numpy(), pixels(want), err_msg=str(where))
        elif name == "webp":
            np.testing.assert_array_equal(
                got.numpy(), pixels(Image.open(io.BytesIO(want))), err_msg=str(where)
            )
        elif encoding == "pil":
            np.testing.assert_array_equal(got.numpy(), np.asarray(want), err_msg=str(where))
        elif encoding in ("list[jpeg]", "jpeg_array"):
            assert [pixels(Image.open(io.BytesIO(b))).tolist() for b in got] == [
                pixels(p).tolist() for p in want
            ], where
        elif isinstance(got, torch.Tensor):
            expected = np.asarray(want)
            assert got.numpy().dtype == expected.dtype or encoding in (
                "int",
                "str_int",
                "str_float",
            ), where
            np.testing.assert_array_equal(got.numpy(), expected, err_msg=str(where))
        else:
            assert got == want and type(got) is type(want), where


def test_every_sample_equals_streaming_dataset(written: dict[str, Any]) -> None:
    ds = chute.MDSDataset(
        written["dir"], list(COLUMNS), decode={"jpg": "rgb8", "png": "rgb8", "webp": "rgb8"}
    )
    index = json.loads((written["dir"] / "index.json").read_text())
    assert len(index["shards"]) > 3 and len(ds) == N
    ref = written["reference"]
    got = all_rows(ds, batch_size=1)  # the png column's sizes differ
    assert len(got) == N
    for i, (ours, theirs) in enumerate(zip(got, ref, strict=True)):
        assert_same(ours, theirs, i)
    batch = next(
        iter(
            chute.DataLoader(
                chute.MDSDataset(written["dir"], ["label", "emb", "f16"]), batch_size=5
            )
        )
    )
    assert batch["label"].dtype == torch.int64 and batch["emb"].shape == (5, 2, 3)
    assert batch["f16"].dtype == torch.float16


def test_decode_string_decodes_the_jpeg_and_png_columns(written: dict[str, Any]) -> None:
    ds = chute.MDSDataset(written["dir"], ["jpg", "png", "webp"], decode="rgb8")
    row = ds[7]
    assert row["jpg"].shape == (12, 10, 3) and row["png"].shape[2] == 3
    assert isinstance(row["webp"], bytes)  # bytes are decoded only when named
    np.testing.assert_array_equal(row["jpg"].numpy(), pixels(written["reference"][7]["jpg"]))


@pytest.mark.parametrize("compression", ["zstd", "zstd:7", "gz", "br", "snappy", "bz2"])
def test_compressed_shards_equal_streaming_dataset(tmp_path: Path, compression: str) -> None:
    rows = samples(17, seed=4)
    columns = {"jpg": "jpeg", "label": "int", "text": "str", "emb": "ndarray:float32:2,3"}
    directory = write(tmp_path / "packed", rows, columns, compression=compression, size_limit=3000)
    assert not list(directory.glob("*.mds"))  # only the compressed files
    ref = streaming_rows(directory, tmp_path)
    ds = chute.MDSDataset(directory, decode="torchrgb8")
    got = all_rows(ds, shuffle=True, generator=torch.Generator().manual_seed(2))
    by_label = {int(r["label"]): r for r in got}
    for want in ref:
        row = by_label[want["label"]]
        np.testing.assert_array_equal(row["jpg"].permute(1, 2, 0).numpy(), pixels(want["jpg"]))
        assert row["text"] == want["text"]
        np.testing.assert_array_equal(row["emb"].numpy(), want["emb"])


def test_pickle_columns_are_refused_unless_asked_for(tmp_path: Path) -> None:
    directory = write(
        tmp_path / "pkl", [{"obj": {"a": i}, "n": i} for i in range(5)], {"obj": "pkl", "n": "int"}
    )
    with pytest.raises(ValueError, match=r"column 'obj' of .* is encoded as 'pkl' \(a pickle\)"):
        chute.MDSDataset(directory)
    assert [int(r["n"]) for r in all_rows(chute.MDSDataset(directory, ["n"]))] == list(range(5))
    ds = chute.MDSDataset(directory, allow_unsafe_types=True)
    assert [r["obj"] for r in all_rows(ds)] == [{"a": i} for i in range(5)]


def test_split_subdirectories_and_several_directories(tmp_path: Path) -> None:
    columns = {"n": "int"}
    write(tmp_path / "a" / "train", [{"n": i} for i in range(7)], columns, size_limit=60)
    write(tmp_path / "b" / "train", [{"n": 100 + i} for i in range(5)], columns, size_limit=60)
    ds = chute.MDSDataset([tmp_path / "a", tmp_path / "b"], split="train")
    assert [int(r["n"]) for r in all_rows(ds)] == [*range(7), *range(100, 105)]


# -- order, ranks, resume -------------------------------------------------------------


class _Rows(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


@pytest.fixture(scope="module")
def numbered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(9)
    rows = [{"id": i, "jpg": Image.open(io.BytesIO(jpeg_bytes(rng, 16, 16)))} for i in range(N)]
    return write(
        tmp_path_factory.mktemp("numbered") / "d",
        rows,
        {"id": "int", "jpg": "jpeg"},
        size_limit=5000,
        compression="zstd",
    )


def test_shuffle_and_ranks_are_torchs(numbered: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = chute.MDSDataset(numbered, ["id"])
    ours = [
        b["id"].tolist()
        for b in chute.DataLoader(
            ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(4)
        )
    ]
    theirs = [
        b.tolist()
        for b in torch.utils.data.DataLoader(
            _Rows(), batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(4)
        )
    ]
    assert ours == theirs
    seen = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        loader = chute.DataLoader(ds, batch_size=4, distributed=True, seed=11, drop_last=False)
        sampler = torch.utils.data.DistributedSampler(_Rows(), 3, rank, seed=11)
        got = [i for b in loader for i in b["id"].tolist()]
        assert got == list(sampler)
        seen.extend(got)
    assert set(seen) == set(range(N))


def test_resume_mid_epoch_is_exact(numbered: Path) -> None:
    ds = chute.MDSDataset(
        numbered, decode="torchrgb8", seed=2, size=8, crop="random_resized", flip=True
    )

    def loader() -> chute.DataLoader[Any]:
        return chute.DataLoader(
            ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(9)
        )

    state = assert_resume_mid_epoch_is_exact(loader, ["id", "jpg"])
    assert state["loader"]["dataset"]["type"] == "MDSDataset"


@pytest.mark.parametrize("world", [2, 3])
def test_elastic_resume_delivers_every_sample_once(
    numbered: Path, world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = chute.MDSDataset(numbered, ["id"])

    def loader() -> chute.DataLoader[Any]:
        return chute.DataLoader(ds, batch_size=3, distributed=True, shuffle=True, seed=3)

    first, states = run_ranks(monkeypatch, 4, loader, batch_ids, batches=2)
    second, _ = run_ranks(monkeypatch, world, loader, batch_ids, state=states[0])
    seen = counts(first, second)
    assert set(seen) == set(range(N)) and set(seen.values()) == {1}


def test_a_state_of_another_index_is_refused(numbered: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(numbered, copy)
    loader = chute.DataLoader(chute.MDSDataset(copy, ["id"]), batch_size=5)
    next(iter(loader))
    state = loader.state_dict()
    index = json.loads((copy / "index.json").read_text())
    index["shards"] = index["shards"][:-1]
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"another dataset"):
        chute.DataLoader(chute.MDSDataset(copy, ["id"]), batch_size=5).load_state_dict(state)


def test_worker_processes(numbered: Path) -> None:
    ds = chute.MDSDataset(numbered, ["id"])
    theirs = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    assert [i for b in theirs for i in b["id"].tolist()] == list(range(N))
    ours = chute.DataLoader(
        ds, batch_size=4, num_workers=2, collate_fn=lambda rows: [int(r["id"]) for r in rows]
    )
    assert [i for b in ours for i in b] == list(range(N))


# -- errors ---------------------------------------------------------------------------


def test_a_directory_without_an_index(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="MDS index"):
        chute.MDSDataset(tmp_path)


def test_a_shard_that_no_longer_matches_its_index(numbered: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(numbered, copy)
    ds = chute.MDSDataset(copy, ["id"], cache_bytes=0)
    assert ds[0]["id"] == 0
    victim = sorted(copy.glob("shard.*"))[1]
    victim.write_bytes(victim.read_bytes()[:-5])
    with pytest.raises(
        chute.DataError, match=rf"shard '.*{victim.name}': \d+ bytes where the index says"
    ):
        list(chute.DataLoader(ds, batch_size=8))


def test_a_handler_drops_samples_whose_image_does_not_decode(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = [{"n": i, "img": png_bytes(rng, 5, 4)[: 30 if i in (2, 5) else None]} for i in range(8)]
    directory = write(tmp_path / "bad", rows, {"n": "int", "img": "bytes"}, size_limit=400)
    strict = chute.MDSDataset(directory, decode={"img": "rgb8"})
    with pytest.raises(
        chute.DataError, match=r"shard '.*shard.00001.mds', row 1 \(sample 2\), column 'img'"
    ):
        list(chute.DataLoader(strict, batch_size=4))
    ds = chute.MDSDataset(directory, decode={"img": "rgb8"}, handler=wds.ignore_and_continue)
    assert [b["n"].tolist() for b in chute.DataLoader(ds, batch_size=4)] == [[0, 1, 3], [4, 6, 7]]


# -- remote -------------------------------------------------------------------------------


def test_remote_directories_over_http_and_s3(
    numbered: Path, object_server: Any, request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("obstore")
    remote = pytest.importorskip("chute.remote")
    files = {p.name: p.read_bytes() for p in numbered.iterdir()}
    local = [
        b["id"].tolist()
        for b in chute.DataLoader(chute.MDSDataset(numbered, decode="torchrgb8"), batch_size=7)
    ]
    for name, data in files.items():
        object_server.objects[f"/mds/{name}"] = data
    options = remote.RemoteOptions(backoff_s=0.01, max_backoff_s=0.05)
    over_http = chute.MDSDataset(f"{object_server.url}/mds", decode="torchrgb8", remote=options)
    reference = chute.MDSDataset(numbered, decode="torchrgb8")
    for a, b in zip(
        chute.DataLoader(over_http, batch_size=7),
        chute.DataLoader(reference, batch_size=7),
        strict=True,
    ):
        assert a["id"].tolist() == b["id"].tolist() and torch.equal(a["jpg"], b["jpg"])
    assert [b["id"].tolist() for b in chute.DataLoader(over_http, batch_size=7)] == local
    s3 = request.getfixturevalue("moto_s3")
    s3.bucket("mds-remote", {f"d/{n}": d for n, d in files.items()})
    over_s3 = chute.MDSDataset("s3://mds-remote/d", ["id"], storage_options=s3.storage_options())
    assert [int(r["id"]) for r in all_rows(over_s3)] == list(range(N))
    with pytest.raises(
        chute.ReadError, match=r"cannot read the MDS index: .*nothing-here/index.json"
    ):
        chute.MDSDataset("s3://mds-remote/nothing-here", storage_options=s3.storage_options())


# -- hashes ---------------------------------------------------------------------------


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def hashed(directory: Path, **kw: Any) -> Path:
    """12 samples in 4 shards, each file's sha1 and xxh64 in the index; the
    last column a fixed-size int, so a flipped last byte leaves the layout
    whole and changes a value."""
    rows = [{"label": f"row {i}", "n": i} for i in range(12)]
    return write(directory, rows, {"label": "str", "n": "int"}, hashes=["sha1", "xxh64"], **kw)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_shard_whose_hash_differs_is_refused(tmp_path: Path, compression: str | None) -> None:
    directory = hashed(tmp_path / "d", size_limit=280, compression=compression)
    index = json.loads((directory / "index.json").read_text())
    assert len(index["shards"]) == 4 and index["shards"][1]["hashes"] == ["sha1", "xxh64"]
    assert [int(r["n"]) for r in all_rows(chute.MDSDataset(directory))] == list(range(12))
    entry = index["shards"][1]
    info = entry["zip_data"] if compression else entry["raw_data"]
    victim = directory / info["basename"]
    flip_last_byte(victim)
    xxhash = pytest.importorskip("xxhash")
    found = xxhash.xxh64(victim.read_bytes()).hexdigest()
    with pytest.raises(chute.DataError) as caught:
        list(chute.DataLoader(chute.MDSDataset(directory), batch_size=4))
    message = str(caught.value)
    assert f"shard '{victim}': its xxh64 hash is {found} where the index says " in message
    assert info["hashes"]["xxh64"] in message
    # A shard that does not read is an error whatever the row handler says.
    ds = chute.MDSDataset(directory, handler=wds.ignore_and_continue)
    with pytest.raises(chute.DataError, match=r"its xxh64 hash is"):
        list(chute.DataLoader(ds, batch_size=4))


def test_hashlib_algorithms_are_verified_and_unknown_ones_skipped(tmp_path: Path) -> None:
    directory = hashed(tmp_path / "d", size_limit=280)
    index = json.loads((directory / "index.json").read_text())
    for entry in index["shards"]:
        entry["raw_data"]["hashes"] = {
            "not-an-algorithm": "00",
            "sha1": entry["raw_data"]["hashes"]["sha1"],
        }
    (directory / "index.json").write_text(json.dumps(index))
    victim = directory / index["shards"][0]["raw_data"]["basename"]
    flip_last_byte(victim)
    with pytest.raises(
        chute.DataError, match=rf"shard '{victim}': its sha1 hash is [0-9a-f]{{40}}"
    ):
        chute.MDSDataset(directory)[0]
    for entry in index["shards"]:
        entry["raw_data"]["hashes"] = {"not-an-algorithm": "00"}
    (directory / "index.json").write_text(json.dumps(index))
    assert int(chute.MDSDataset(directory)[0]["n"]) == 0  # nothing computable: read unverified


def test_each_shard_is_hashed_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    directory = hashed(tmp_path / "d", size_limit=280)
    index = json.loads((directory / "index.json").read_text())
    for entry in index["shards"]:
        entry["raw_data"]["hashes"] = {"sha1": entry["raw_data"]["hashes"]["sha1"]}
    (directory / "index.json").write_text(json.dumps(index))
    hashed_bytes: list[int] = []
    real = hashlib.sha1

    def counting(data: bytes = b"", **kw: Any) -> Any:
        hashed_bytes.append(len(data))
        return real(data, **kw)

    monkeypatch.setattr(hashlib, "sha1", counting)
    ds = chute.MDSDataset(directory, cache_bytes=0)  # every batch reads its shards again
    for _ in range(3):
        assert [int(r["n"]) for r in all_rows(ds, batch_size=2)] == list(range(12))
    assert len(hashed_bytes) == len(index["shards"])
    # A worker process checks the shards it reads itself.
    flip_last_byte(directory / index["shards"][0]["raw_data"]["basename"])
    monkeypatch.undo()
    for context in ("fork", "spawn"):
        loader = torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=1, multiprocessing_context=context
        )
        with pytest.raises(chute.DataError, match=r"its sha1 hash is"):
            list(loader)
