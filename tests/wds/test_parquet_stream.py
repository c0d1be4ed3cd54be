"""chute.ParquetStream: Parquet row groups as the shards of webdataset's
pipeline. Every sample equals pyarrow's reading of the same files (images
pixel-identical to Pillow's decode, the hub's struct column included); the
row groups are shuffled per epoch before the sample buffer; DDP ranks and
torch workers split by row group, disjoint and complete, with equal batch
counts; a state resumes mid-epoch exactly, and elastically on 2, 3 and 6
ranks after 4, locally and over S3 and HTTP; bad files, row groups and
columns raise naming file, row group and column; remote reads survive
dropped connections, short reads and 503s."""

from __future__ import annotations

import io
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import image_samples
from helpers import assert_equal_batch_counts, counts, run_ranks
from PIL import Image
from remote_servers import S3, Fault, FaultProxy, ObjectServer

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
B = 5


def write_file(path: Path, first: int, n: int, group_rows: int, seed: int) -> str:
    samples = image_samples(n, seed=seed, size=(24, 32), png_every=5)
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "image": pa.array(
                [
                    {"bytes": s.get("jpg", s.get("png")), "path": f"{first + i}.jpg"}
                    for i, s in enumerate(samples)
                ],
                IMAGE,
            ),
            "raw": pa.array([s.get("jpg", s.get("png")) for s in samples], pa.binary()),
            "label": pa.array([int(s["cls"]) for s in samples], pa.int64()),
            "score": pa.array(rng.random(n).astype(np.float32)),
            "small": pa.array(rng.integers(-100, 100, n).astype(np.int16)),
            "flag": pa.array(rng.random(n) < 0.5),
            "text": [f"row {first + i}" for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=group_rows, compression="none")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("parquet_stream")
    # Row groups of 8, 8, 8, 3 and 8, 8, 6: uneven, across two files.
    paths = [
        write_file(root / "train-00000.parquet", 0, 27, 8, seed=1),
        write_file(root / "train-00001.parquet", 27, 22, 8, seed=2),
    ]
    reference = pa.concat_tables([pq.read_table(p) for p in paths]).to_pylist()
    return {"paths": paths, "reference": reference, "bytes": {}}


def pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).transpose(2, 0, 1)


def texts(batch: Any) -> list[str]:
    return list(batch[0])


# -- what comes out -----------------------------------------------------------------


def test_chute_wds_keeps_parquet_stream_as_an_alias() -> None:
    # ParquetStream lives in chute.table_streams; code written when it was
    # chute.wds's still finds the same class there.
    from chute.wds import ParquetStream

    assert ParquetStream is wds.ParquetStream is chute.ParquetStream
    assert ParquetStream.__module__ == "chute.table_streams.parquet"
    assert "ParquetStream" in wds.__all__


def test_dict_samples_equal_pyarrow_rows(files: dict[str, Any]) -> None:
    ds = wds.ParquetStream(files["paths"], shardshuffle=False)
    got = list(ds)
    ref = files["reference"]
    assert len(got) == len(ref)
    for sample, row in zip(got, ref, strict=True):
        assert sample["text"] == row["text"] and isinstance(sample["text"], str)
        assert sample["image"] == row["image"]["bytes"] and sample["raw"] == row["raw"]
        assert int(sample["label"]) == row["label"] and sample["label"].dtype == np.int64
        assert sample["score"] == np.float32(row["score"]) and sample["score"].dtype == np.float32
        assert int(sample["small"]) == row["small"] and sample["small"].dtype == np.int16
        assert bool(sample["flag"]) == row["flag"] and sample["flag"].dtype == np.bool_
    assert got[30]["__url__"] == files["paths"][1] + "#row-group=0"
    assert got[30]["__key__"] == "3" and got[30]["__local_path__"] == files["paths"][1]


def test_decoded_batches_equal_pillow_and_pyarrow(files: dict[str, Any]) -> None:
    ds = (
        wds.ParquetStream(
            files["paths"], ["text", "image", "raw", "label", "score"], shardshuffle=False
        )
        .decode("torchrgb8")
        .to_tuple("image", "raw", "label", "score", "text")
        .batched(7)
    )
    ref = files["reference"]
    seen = 0
    for images, raw, labels, scores, text in ds:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 24, 32)
        assert torch.equal(images, raw)  # the struct's bytes and the binary column
        for i, t in enumerate(text):
            row = ref[int(t.split()[1])]
            assert np.array_equal(images[i].numpy(), pillow(row["image"]["bytes"]))
            assert labels[i] == row["label"] and scores[i] == np.float32(row["score"])
        assert isinstance(labels, np.ndarray) and labels.dtype == np.int64
        seen += len(text)
    assert seen == len(ref)


def test_train_transforms_run_natively(files: dict[str, Any]) -> None:
    def make() -> Any:
        return (
            wds.ParquetStream(files["paths"], ["image", "label"], shardshuffle=True, seed=3)
            .shuffle(10)
            .decode(
                "torchrgb8",
                size=(16, 16),
                crop="random_resized",
                flip=True,
                normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
                dtype=torch.float16,
            )
            .to_tuple("image", "label")
            .batched(8)
        )

    first, again = list(make()), list(make())
    assert first[0][0].shape == (8, 3, 16, 16) and first[0][0].dtype == torch.float16
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    ds = make()
    assert ds.stats()["python_items"] == 0


def test_hub_files_written_by_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    samples = image_samples(12, seed=4, size=(20, 28), png_every=4)
    images = [Image.open(io.BytesIO(s.get("jpg", s.get("png")))) for s in samples]  # type: ignore[arg-type]
    hub = datasets.Dataset.from_dict(
        {"image": images, "label": [int(s["cls"]) for s in samples]}
    ).cast_column("image", datasets.Image())
    path = str(tmp_path / "hub.parquet")
    hub.to_parquet(path, batch_size=5)
    ref = pq.read_table(path).to_pylist()
    ds = wds.ParquetStream(path, shardshuffle=False).decode("rgb8").to_tuple("image", "label")
    got = list(ds)
    assert len(got) == len(ref)
    for (image, label), row in zip(got, ref, strict=True):
        assert np.array_equal(image, pillow(row["image"]["bytes"]).transpose(1, 2, 0))
        assert label == row["label"]


def test_a_dataloader_makes_tensors(files: dict[str, Any]) -> None:
    ds = wds.ParquetStream(files["paths"], ["label", "text"], shardshuffle=False)
    batches = list(chute.DataLoader(ds.to_tuple("label", "text"), batch_size=10))
    labels = torch.cat([b[0] for b in batches])
    assert labels.tolist() == [r["label"] for r in files["reference"]]
    assert list(batches[0][1]) == [r["text"] for r in files["reference"][:10]]


# -- order ---------------------------------------------------------------------------


def group_sequence(ds: Any) -> list[str]:
    """The row groups in the order the samples came from them."""
    out: list[str] = []
    for sample in ds:
        if not out or out[-1] != sample["__url__"]:
            out.append(sample["__url__"])
    return out


def test_row_groups_are_shuffled_per_epoch_with_the_seed(files: dict[str, Any]) -> None:
    def order(seed: int, epoch: int) -> list[str]:
        ds = wds.ParquetStream(files["paths"], ["text"], shardshuffle=True, seed=seed)
        ds.set_epoch(epoch)
        return group_sequence(ds)

    in_order = group_sequence(wds.ParquetStream(files["paths"], ["text"], shardshuffle=False))
    first = order(1, 0)
    # Each row group once, whole (its rows together), in another order.
    assert sorted(first) == sorted(in_order) and len(first) == 7
    assert first != in_order
    assert order(1, 0) == first
    assert order(1, 1) != first and order(2, 0) != first


def test_the_sample_buffer_shuffles_after_the_row_groups(files: dict[str, Any]) -> None:
    def run(seed: int, buffer: int) -> list[str]:
        ds = wds.ParquetStream(files["paths"], ["text"], shardshuffle=True, seed=seed)
        return [s["text"] for s in (ds.shuffle(buffer) if buffer else ds)]

    groups_only, buffered = run(1, 0), run(1, 12)
    assert sorted(buffered) == sorted(groups_only) and buffered != groups_only
    assert run(1, 12) == buffered and run(2, 12) != buffered


# -- DDP, workers, resume ------------------------------------------------------------


@pytest.fixture(scope="module")
def even_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Twelve row groups of 6 rows (two files): they divide over 2 and 3 ranks of 2 workers."""
    root = tmp_path_factory.mktemp("parquet_even")
    return [
        write_file(root / "a.parquet", 0, 36, 6, seed=5),
        write_file(root / "b.parquet", 36, 36, 6, seed=6),
    ]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_and_workers_split_by_row_group(
    monkeypatch: pytest.MonkeyPatch, even_files: list[str], world: int
) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    per_rank: list[list[str]] = []
    batch_counts = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        ds = wds.ParquetStream(even_files, ["text"], shardshuffle=True, seed=7)
        loader = torch.utils.data.DataLoader(
            ds.to_tuple("text").batched(6), batch_size=None, num_workers=2
        )
        batches = [texts(b) for b in loader]
        batch_counts.append(len(batches))
        per_rank.append([t for b in batches for t in b])
    everything = [t for rank in per_rank for t in rank]
    assert sorted(everything) == sorted(f"row {i}" for i in range(72))  # disjoint, complete
    assert len(set(batch_counts)) == 1


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_ranks_of_torch_workers_yield_equal_batch_counts_and_no_repeats(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Any], world: int
) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    batch_counts, seen = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        ds = wds.ParquetStream(files["paths"], ["text"], shardshuffle=False)
        loader = torch.utils.data.DataLoader(
            ds.to_tuple("text").batched(3), batch_size=None, num_workers=2
        )
        batches = [texts(b) for b in loader]
        batch_counts.append(len(batches))
        seen += [t for b in batches for t in b]
    # Worker w of every rank yields the batches of the one with the fewest
    # rows (its last batch short; no row group is read again): the ranks'
    # totals agree.
    groups = [8, 8, 8, 3, 8, 8, 6]
    expected = sum(
        -(-min(sum(groups[r::world][w::2]) for r in range(world)) // 3) for w in range(2)
    )
    assert batch_counts == [expected] * world
    assert len(seen) == len(set(seen))


def test_uneven_ranks_yield_equal_batch_counts(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Any]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    batch_counts, seen = [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        ds = wds.ParquetStream(files["paths"], ["text"], shardshuffle=True, seed=7)
        batches = [texts(b) for b in ds.to_tuple("text").batched(4)]
        batch_counts.append(len(batches))
        seen += [t for b in batches for t in b]
    # Row groups of 8, 8, 8, 3, 8, 8, 6 over 3 ranks: the fewest (13 or 14
    # rows of 4) cap every rank.
    assert len(set(batch_counts)) == 1 and len(set(seen)) == len(seen)


def pipeline(paths: list[str], **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        ds = wds.ParquetStream(paths, ["text", "label"], shardshuffle=True, seed=11, **kw)
        return ds.shuffle(10, initial=5).to_tuple("text", "label").batched(B)

    return make


def test_exact_resume_mid_epoch_equals_the_uninterrupted_run(files: dict[str, Any]) -> None:
    make = pipeline(files["paths"])
    whole = make()
    whole.set_epoch(3)
    expected = [texts(b) for b in whole]
    first = make()
    first.set_epoch(3)
    it = iter(first)
    head = [texts(b) for b in itertools.islice(it, 4)]
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [texts(b) for b in resumed] == expected
    # A state of other files (another footer) is refused.
    other = wds.ParquetStream(files["paths"][:1], ["text", "label"], shardshuffle=True, seed=11)
    with pytest.raises(ValueError, match="another dataset"):
        other.shuffle(10, initial=5).to_tuple("text", "label").batched(B).load_state_dict(state)


def test_a_state_of_rewritten_files_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    write_file(path, 0, 20, 5, seed=9)
    make = pipeline([str(path)])
    first = make()
    next(iter(first))
    state = first.state_dict()
    write_file(path, 0, 20, 5, seed=10)  # the same row groups, other values
    with pytest.raises(ValueError, match="footers="):
        make().load_state_dict(state)


def elastic_run(paths: list[str], **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        ds = wds.ParquetStream(paths, ["text"], shardshuffle=True, seed=5, elastic=True, **kw)
        return ds.shuffle(12, initial=6).to_tuple("text").batched(B)

    return make


ROWS = 49  # rows of `files`


@pytest.mark.parametrize("world", [2, 3, 6])
def test_elastic_resume_on_another_world_size(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Any], world: int
) -> None:
    make = elastic_run(files["paths"])
    first, states = run_ranks(monkeypatch, 4, make, texts, batches=1)
    assert all(s["elastic"] == states[0]["elastic"] for s in states)
    assert_equal_batch_counts(first, 1)
    second, _ = run_ranks(monkeypatch, world, make, texts, state=states[0])
    seen = counts(first, second)
    assert len(seen) == ROWS
    assert_equal_batch_counts(second, -(-(ROWS - 20) // (world * B)))
    # Only the pads of the last round repeat (as DistributedSampler pads).
    left = ROWS - 20
    pads = world * -(-left // (world * B)) * B - left
    assert sum(seen.values()) - ROWS <= pads


# -- errors --------------------------------------------------------------------------


def test_missing_and_unsupported_columns_name_the_file(files: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"'.*train-00000.parquet' has no column 'nope'"):
        wds.ParquetStream(files["paths"], ["text", "nope"], shardshuffle=False)
    with pytest.raises(ValueError, match=r"column 'label' of '.*train-00000.parquet' is int64"):
        ds = wds.ParquetStream(files["paths"], shardshuffle=False)
        list(ds.decode("torchrgb8", only=["image", "label"]))


def test_webdataset_points_parquet_urls_to_parquet_stream(files: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"train-00001.parquet' is a Parquet file.*ParquetStream"):
        wds.WebDataset(["shard-0.tar", files["paths"][1]], shardshuffle=False)


def test_an_unsupported_column_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"ids": [[1, 2], [3]]}), path)
    with pytest.raises(ValueError, match=r"column 'ids' of '.*lists.parquet' is list<"):
        wds.ParquetStream(str(path), shardshuffle=False)


def test_a_truncated_file_is_named_at_open(files: dict[str, Any], tmp_path: Path) -> None:
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(Path(files["paths"][0]).read_bytes()[:-100])
    with pytest.raises(chute.DataError, match=r"'.*cut.parquet' is not a readable Parquet file"):
        wds.ParquetStream([files["paths"][1], str(cut)], shardshuffle=False)


def corrupt_row_group(src: str, dst: Path, group: int) -> None:
    """A copy of `src` whose row group `group` has a broken page header."""
    data = bytearray(Path(src).read_bytes())
    chunk = pq.ParquetFile(src).metadata.row_group(group).column(0)
    at = chunk.data_page_offset
    data[at : at + 24] = b"\xff" * 24
    dst.write_bytes(bytes(data))


def test_a_corrupt_row_group_names_file_and_group_and_the_handler_skips_it(
    files: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.parquet"
    corrupt_row_group(files["paths"][0], bad, 1)
    ds = wds.ParquetStream([str(bad)], ["image", "text"], shardshuffle=False)
    with pytest.raises(chute.DataError, match=r"file '.*bad.parquet', row group 1: "):
        list(ds)
    skipping = wds.ParquetStream(
        [str(bad)], ["image", "text"], wds.ignore_and_continue, shardshuffle=False
    )
    got = [s["text"] for s in skipping]
    assert got == [f"row {i}" for i in range(27) if not 8 <= i < 16]


def test_an_image_that_does_not_decode_names_row_group_row_and_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broken.parquet"
    blobs = [b"not an image" if i == 5 else _png() for i in range(8)]
    pq.write_table(pa.table({"raw": pa.array(blobs, pa.binary())}), path, row_group_size=4)
    ds = wds.ParquetStream(str(path), shardshuffle=False).decode("rgb8").to_tuple("raw")
    with pytest.raises(
        chute.DataError, match=r"file '.*broken.parquet', row group 1, row 1, column 'raw'"
    ):
        list(ds)
    skipping = wds.ParquetStream(str(path), shardshuffle=False).decode(
        "rgb8", handler=wds.ignore_and_continue
    )
    assert len(list(skipping.to_tuple("raw"))) == 7


def _png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), 9, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_a_missing_field_names_row_group_and_row(tmp_path: Path) -> None:
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"label": pa.array([1, None, 3, 4], pa.int64())}), path)
    with pytest.raises(ValueError, match=r"file '.*nulls.parquet', row group 0, row 1"):
        list(wds.ParquetStream(str(path), shardshuffle=False).to_tuple("label"))


# -- remote --------------------------------------------------------------------------

remote = pytest.importorskip("chute.remote")


def remote_options(**overrides: Any) -> Any:
    settings: dict[str, Any] = {"range_bytes": 64 << 10, "backoff_s": 0.01, "max_backoff_s": 0.05}
    settings.update(overrides)
    return remote.RemoteOptions(**settings)


@pytest.fixture(params=["http", "s3"])
def served(
    request: pytest.FixtureRequest, object_server: ObjectServer, files: dict[str, Any]
) -> Iterator[tuple[list[str], dict[str, Any], FaultProxy]]:
    """The files behind a fault proxy: their urls, the storage options, the proxy."""
    pytest.importorskip("obstore")
    blobs = {Path(p).name: Path(p).read_bytes() for p in files["paths"]}
    if request.param == "http":
        for name, data in blobs.items():
            object_server.objects[f"/pq/{name}"] = data
        with FaultProxy(object_server.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield [f"{proxy.url}/pq/{n}" for n in blobs], {}, proxy
    else:
        s3: S3 = request.getfixturevalue("moto_s3")
        bucket = "pqs-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
        s3.bucket(bucket, {f"pq/{n}": d for n, d in blobs.items()})
        with FaultProxy(s3.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            yield (
                [f"s3://{bucket}/pq/{n}" for n in blobs],
                {"storage_options": s3.storage_options(proxy.url)},
                proxy,
            )


def test_remote_rows_equal_pyarrow_and_only_columns_asked_are_fetched(
    served: Any, files: dict[str, Any]
) -> None:
    urls, settings, proxy = served
    ds = wds.ParquetStream(
        urls, ["image", "text"], shardshuffle=False, remote=remote_options(**settings)
    )
    got = list(ds.decode("torchrgb8").to_tuple("image", "text"))
    ref = files["reference"]
    assert [t for _, t in got] == [r["text"] for r in ref]
    assert all(
        np.array_equal(i.numpy(), pillow(r["image"]["bytes"]))
        for (i, _), r in zip(got, ref, strict=True)
    )
    gets = [r for r in proxy.requests if r.method == "GET"]
    assert gets and all(r.range for r in gets)
    labels = wds.ParquetStream(
        urls, ["label"], shardshuffle=False, remote=remote_options(**settings)
    )
    proxy.requests.clear()  # after the footers
    assert [int(s["label"]) for s in labels] == [r["label"] for r in ref]
    fetched = sum(
        int(r.range.split("-")[1]) - int(r.range.split("=")[1].split("-")[0]) + 1
        for r in proxy.requests
        if r.method == "GET" and r.range
    )
    assert 0 < fetched < sum(Path(p).stat().st_size for p in files["paths"]) // 10


@pytest.mark.parametrize("kind", ["drop", "short", "status-503"])
def test_remote_faults_are_retried_with_the_rows_intact(
    served: Any, files: dict[str, Any], kind: str
) -> None:
    urls, settings, proxy = served
    ds = wds.ParquetStream(
        urls, ["raw", "text"], shardshuffle=False, remote=remote_options(**settings)
    )
    kind, _, status = kind.partition("-")
    fault = proxy.add(Fault(kind, status=int(status or 500), times=3))
    got = list(ds)
    assert fault.hit.is_set()
    assert [(s["text"], s["raw"]) for s in got] == [
        (r["text"], r["raw"]) for r in files["reference"]
    ]


def test_a_lasting_remote_failure_names_file_and_row_group(served: Any) -> None:
    urls, settings, proxy = served
    ds = wds.ParquetStream(
        urls, ["label"], shardshuffle=False, remote=remote_options(retries=1, **settings)
    )
    proxy.add(Fault("status", status=503, times=1000))
    with pytest.raises(chute.ReadError, match=r"file '.*train-00000.parquet', row group 0"):
        list(ds)


def test_remote_elastic_resume_on_another_world_size(
    monkeypatch: pytest.MonkeyPatch, served: Any, files: dict[str, Any]
) -> None:
    urls, settings, _ = served
    make = elastic_run(urls, remote=remote_options(**settings))
    first, states = run_ranks(monkeypatch, 4, make, texts, batches=1)
    for world in (2, 3, 6):
        second, _ = run_ranks(monkeypatch, world, make, texts, state=states[0])
        seen = counts(first, second)
        assert len(seen) == ROWS
        assert_equal_batch_counts(second, -(-(ROWS - 20) // (world * B)))


def test_hub_urls_and_the_node_cache(
    object_server: ObjectServer,
    files: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    pytest.importorskip("obstore")
    names = [Path(p).name for p in files["paths"]]
    for name, path in zip(names, files["paths"], strict=True):
        object_server.objects[f"/datasets/org/pets/resolve/main/data/{name}"] = Path(
            path
        ).read_bytes()
    monkeypatch.setenv("HF_ENDPOINT", object_server.url)
    urls = [f"hf://datasets/org/pets/data/{name}" for name in names]
    expected = [r["text"] for r in files["reference"]]

    def run() -> list[str]:
        ds = wds.ParquetStream(
            urls, ["text"], shardshuffle=False, remote=remote_options(cache_dir=str(tmp_path))
        )
        return [s["text"] for s in ds]

    assert run() == expected
    gets = object_server.count("GET")
    assert run() == expected
    # Only the footers again (at open): the row groups come from the node cache.
    assert object_server.count("GET") - gets <= len(urls)


# -- the readers' lifetime -----------------------------------------------------------


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chute-parquet-stream"]


def context_switches(thread: threading.Thread) -> int:
    """How often the kernel let `thread` run (each wait that ended counts)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return sum(
        int(value)
        for name, _, value in (line.partition(":") for line in status.splitlines())
        if name.endswith("ctxt_switches")
    )


@pytest.mark.parametrize("end", ["drop", "close"])
def test_idle_readers_sleep_until_asked_and_end_with_their_plan(
    files: dict[str, Any], end: str
) -> None:
    before = set(reader_threads())
    ds = wds.ParquetStream(files["paths"], ["label"], shardshuffle=False, readahead=2)
    it = iter(ds)
    next(it)
    readers = [t for t in reader_threads() if t not in before]
    assert len(readers) == 2
    # The engine has asked for what it reads ahead; the consumer takes no
    # more, so the readers have nothing to do.
    time.sleep(0.5)
    woken = [context_switches(t) for t in readers]
    time.sleep(1.0)
    # A reader that polled would have woken some twenty times meanwhile; a
    # few are left to a row group the engine may still have asked for late.
    assert all(context_switches(t) - w < 5 for t, w in zip(readers, woken, strict=True))
    if end == "drop":
        del it
    else:
        ds.close()
    for t in readers:
        t.join(10)
        assert not t.is_alive()
