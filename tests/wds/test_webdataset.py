"""chute.WebDataset against webdataset 1.0.2 on the same shards."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import pytest
import torch
import webdataset
from helpers import assert_same

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def both(urls: list[str], build: Any, **chute_kwargs: Any) -> tuple[list[Any], list[Any]]:
    ref = list(build(webdataset.WebDataset(urls, shardshuffle=False)))
    got = list(build(chute.WebDataset(urls, shardshuffle=False, **chute_kwargs)))
    return ref, got


@pytest.mark.parametrize("threads", [1, 3])
def test_tiny_batches_equal_webdataset(tiny_shards: list[str], threads: int) -> None:
    ref, got = both(
        tiny_shards, lambda ds: ds.decode().to_tuple("npy", "cls").batched(64), threads=threads
    )
    assert len(got) == 16  # 1000 samples: 15 full batches and a partial one
    assert_same(ref, got)


def test_partial_false_drops_short_batch(tiny_shards: list[str]) -> None:
    ref, got = both(
        tiny_shards, lambda ds: ds.decode().to_tuple("npy", "cls").batched(64, partial=False)
    )
    assert len(got) == 15
    assert_same(ref, got)


@pytest.mark.parametrize(
    "spec", ["rgb8", "torchrgb8", "rgb", "torchrgb", "torch", "l8", "torchl8", "l"]
)
def test_image_specs_equal_webdataset(image_shards: list[str], spec: str) -> None:
    ref, got = both(
        image_shards, lambda ds: ds.decode(spec).to_tuple("jpg;png", "cls", "__key__").batched(10)
    )
    assert_same(ref, got)


def test_unbatched_tuples_equal_webdataset(image_shards: list[str]) -> None:
    ref, got = both(
        image_shards, lambda ds: ds.decode("rgb8").to_tuple("__key__", "jpg;png", "cls")
    )
    assert len(got) == 120
    assert_same(ref, got)


def test_dict_samples_equal_webdataset(image_shards: list[str]) -> None:
    ref, got = both(image_shards, lambda ds: ds.decode("torchrgb8"))
    assert_same(ref, got)
    ref, got = both(image_shards, lambda ds: ds)  # undecoded: bytes, keys and urls
    assert_same(ref, got)


def test_rename_then_tuple_equal_webdataset(fmri_shards: list[str]) -> None:
    def build(ds: Any) -> Any:
        return (
            ds.decode("torch")
            .rename(images="jpg;png", voxels="nsdgeneral.npy", trial="trial.npy")
            .to_tuple("voxels", "images", "trial")
            .batched(8)
        )

    ref, got = both(fmri_shards, build)
    assert_same(ref, got)


def test_python_stages_after_native_prefix(tiny_shards: list[str]) -> None:
    def build(ds: Any) -> Any:
        return (
            ds.decode()
            .to_tuple("npy", "cls")
            .map_tuple(lambda v: v * 2, lambda c: c + 1)
            .select(lambda s: s[1] % 2 == 0)
            .batched(32)
        )

    ref, got = both(tiny_shards, build)
    assert_same(ref, got)


def test_map_before_batched(tiny_shards: list[str]) -> None:
    def build(ds: Any) -> Any:
        return (
            ds.decode()
            .map(lambda s: {"x": s["npy"].sum(), "y": s["cls"]})
            .to_tuple("x", "y")
            .batched(50)
        )

    ref, got = both(tiny_shards, build)
    assert_same(ref, got)


def test_shuffle_is_a_permutation_and_reproducible(tiny_shards: list[str]) -> None:
    def keys(ds: Any) -> list[str]:
        return [k for batch in ds.to_tuple("__key__").batched(100) for k in batch[0]]

    plain = keys(chute.WebDataset(tiny_shards, shardshuffle=False))
    a = keys(chute.WebDataset(tiny_shards, shardshuffle=True, seed=7).shuffle(200, initial=100))
    b = keys(
        chute.WebDataset(tiny_shards, shardshuffle=True, seed=7, threads=1).shuffle(
            200, initial=100
        )
    )
    c = keys(chute.WebDataset(tiny_shards, shardshuffle=True, seed=8).shuffle(200, initial=100))
    assert sorted(a) == sorted(plain) and a != plain
    assert a == b  # threads do not change the order
    assert a != c


def test_epochs_reshuffle_and_set_epoch_replays(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=True, seed=1).shuffle(100).to_tuple("__key__")
    first = [k for (k,) in ds]
    second = [k for (k,) in ds]
    assert first != second and sorted(first) == sorted(second)
    ds.set_epoch(0)
    assert [k for (k,) in ds] == first


def test_shuffle_rng_object(tiny_shards: list[str]) -> None:
    def keys(rng: random.Random) -> list[str]:
        ds = (
            chute.WebDataset(tiny_shards, shardshuffle=False)
            .shuffle(50, initial=50, rng=rng)
            .to_tuple("__key__")
        )
        return [k for (k,) in ds]

    assert keys(random.Random(42)) == keys(random.Random(42))
    assert keys(random.Random(42)) != keys(random.Random(43))


def test_torch_dataloader_workers_same_multiset(tiny_shards: list[str]) -> None:
    def collect(ds: Any) -> list[tuple[str, int]]:
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        return sorted((k, int(c)) for keys, cls in loader for k, c in zip(keys, cls, strict=True))

    build = lambda ds: ds.decode().to_tuple("__key__", "cls").batched(32)  # noqa: E731
    ref = collect(build(webdataset.WebDataset(tiny_shards, shardshuffle=False)))
    got = collect(build(chute.WebDataset(tiny_shards, shardshuffle=False)))
    assert got == ref and len(got) == 1000


def test_users_training_pipeline(fmri_shards: list[str], tmp_path: Any) -> None:
    """The pipeline from our users' scripts, with only the import changed."""
    urls = [f"pipe:cat {u}" for u in fmri_shards]

    def my_split(src: Any) -> Any:
        yield from src

    def build(module: Any) -> Any:
        return (
            module.WebDataset(urls, resampled=True, cache_dir=str(tmp_path), nodesplitter=my_split)
            .shuffle(500, initial=500, rng=random.Random(42))
            .decode("torch")
            .rename(images="jpg;png", voxels="nsdgeneral.npy", trial="trial.npy")
            .to_tuple("voxels", "images", "trial")
            .batched(16, partial=True)
            .with_epoch(7)
        )

    with warnings.catch_warnings():
        # webdataset 1.0.2 warns about shardshuffle=None even for resampled datasets.
        warnings.simplefilter("ignore", UserWarning)
        reference = build(webdataset)
    ref = list(torch.utils.data.DataLoader(reference, batch_size=None, num_workers=1))
    for loader in (
        torch.utils.data.DataLoader(build(wds), batch_size=None, num_workers=1),
        chute.DataLoader(build(wds), batch_size=None, num_workers=1),
    ):
        got = list(loader)
        assert len(got) == len(ref) == 7
        for r, g in zip(ref, got, strict=True):
            assert type(r) is type(g)
            for x, y in zip(r, g, strict=True):
                assert type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape
        # Every row is a real sample: trial i carries voxels of sample i.
        everything = {int(t): v for batch in got for v, t in zip(batch[0], batch[2], strict=True)}
        assert len(everything) > 16


def test_resize_collates_different_sizes(tmp_path: Any) -> None:
    from conftest import image_samples, write_shards

    urls = write_shards(
        tmp_path, image_samples(10, size=(30, 50)) + image_samples(10, seed=1, size=(64, 48)), 10
    )
    ds = (
        chute.WebDataset(urls, shardshuffle=False)
        .decode("torchrgb8", size=(24, 24))
        .to_tuple("jpg;png")
        .batched(20)
    )
    (images,) = next(iter(ds))
    assert images.shape == (20, 3, 24, 24) and images.dtype == torch.uint8
    with pytest.raises(chute.DataError, match="shape"):
        list(chute.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg").batched(20))


def test_missing_field_names_shard_and_sample(tiny_shards: list[str]) -> None:
    ds = (
        chute.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("npy", "jpg").batched(8)
    )
    with pytest.raises(chute.DataError, match=r"shard-000000.tar.*sample0000000.*offset 0.*jpg"):
        list(ds)


def test_corrupt_jpeg_raises_or_skips(tmp_path: Any) -> None:
    from conftest import image_samples, write_shards

    samples = image_samples(12)
    good = samples[5]["jpg"]
    assert isinstance(good, bytes)
    samples[5]["jpg"] = good[: len(good) // 2]  # truncated body, valid header
    samples[8]["jpg"] = b"not a jpeg at all"
    urls = write_shards(tmp_path, samples, 12)

    def build(h: Any) -> Any:
        return (
            chute.WebDataset(urls, shardshuffle=False, handler=h)
            .decode("rgb8")
            .to_tuple("jpg", "cls")
        )

    with pytest.raises(
        chute.DataError, match=r"shard-000000.tar', member 'img000005.jpg' at offset \d+"
    ):
        list(build(wds.reraise_exception))
    ds = build(wds.ignore_and_continue)
    rows = list(ds)
    assert len(rows) == 10
    assert ds.stats()["samples_skipped"] == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(build(wds.warn_and_continue))) == 10
    assert sum("img000008" in str(w.message) or "img000005" in str(w.message) for w in caught) == 2


def test_gnu_tar_shards(tmp_path: Any) -> None:
    import subprocess

    root = tmp_path / "src"
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    for i in range(5):
        (deep / f"s{i}.txt").write_text(f"text {i}")
        (deep / f"s{i}.cls").write_text(str(i))
    for fmt in ("gnu", "pax", "ustar"):
        shard = tmp_path / f"{fmt}.tar"
        cmd = ["tar", f"--format={fmt}", "--sort=name", "-cf", str(shard), "-C", str(root), "."]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            assert fmt == "ustar"  # ustar cannot hold the 120-character path: fine
            continue
        ref, got = both([str(shard)], lambda ds: ds.decode().to_tuple("__key__", "txt", "cls"))
        assert len(got) == 5
        assert_same(ref, got)


def test_brace_expansion(tiny_shards: list[str]) -> None:
    pattern = tiny_shards[0].replace("000000", "{000000..000003}")
    got = [k for (k,) in chute.WebDataset(pattern, shardshuffle=False).to_tuple("__key__")]
    assert len(got) == 1000


def test_with_epoch_counts_batches_and_repeats(tiny_shards: list[str]) -> None:
    # 250 samples: each pass over the shard ends in a partial batch, and the
    # shard is read again to fill the epoch, as webdataset does.
    ref, got = both(tiny_shards[:1], lambda ds: ds.to_tuple("__key__").batched(100).with_epoch(5))
    assert [len(b[0]) for b in got] == [100, 100, 50, 100, 100]
    assert got[3][0][0] == "sample0000000"
    assert_same(ref, got)


def test_empty_worker_raises_like_webdataset(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards[:1], shardshuffle=False).to_tuple("__key__")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    with pytest.raises(ValueError, match="No samples found"):
        list(loader)


def test_failing_pipe_command_reports_status_and_stderr(tiny_shards: list[str]) -> None:
    urls = [f"pipe:cat {tiny_shards[0]}", "pipe:echo 'no such bucket' >&2; exit 7"]
    ds = chute.WebDataset(urls, shardshuffle=False).to_tuple("__key__")
    with pytest.raises(chute.ReadError, match=r"(?s)status 7.*no such bucket"):
        list(ds)


def test_stalled_pipe_times_out(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(["pipe:sleep 20"], shardshuffle=False, pipe_timeout=0.5).to_tuple(
        "__key__"
    )
    with pytest.raises(TimeoutError):
        list(ds)


def test_bad_npy_header_names_member(tmp_path: Any) -> None:
    from conftest import tiny_samples, write_shards

    samples: list[dict[str, object]] = []
    for s in tiny_samples(6):
        s["npy"] = npy(s["npy"])
        samples.append(s)
    samples[3]["npy"] = b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4',  " + b"\x00" * 40
    urls = write_shards(tmp_path, samples, 6)
    ds = chute.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "cls").batched(2)
    with pytest.raises(chute.DataError, match=r"member 'sample0000003.npy' at offset \d+"):
        list(ds)
    skipping = chute.WebDataset(urls, shardshuffle=False, handler=wds.ignore_and_continue)
    batches = list(skipping.decode().to_tuple("npy", "cls").batched(2))
    assert [len(c) for _, c in batches] == [2, 2, 1]


def test_truncated_shard_names_offset(tiny_shards: list[str], tmp_path: Any) -> None:
    data = Path(tiny_shards[0]).read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 100])
    ds = chute.WebDataset([str(cut)], shardshuffle=False).decode().to_tuple("npy", "cls")
    with pytest.raises(chute.DataError, match=r"cut.tar.*offset \d+"):
        list(ds)


def npy(array: Any) -> bytes:
    from conftest import npy_bytes

    return npy_bytes(array)


def test_webloader_rebatches_like_webdataset(tiny_shards: list[str]) -> None:
    def run(module: Any) -> list[int]:
        ds = module.WebDataset(tiny_shards, shardshuffle=False).decode().to_tuple("cls").batched(16)
        loader = (
            module.WebLoader(ds, batch_size=None, num_workers=0)
            .unbatched()
            .batched(100)
            .with_epoch(7)
        )
        return [len(b[0]) for b in loader]

    assert run(wds) == run(webdataset) == [100] * 7


@pytest.mark.parametrize("drop_last", [False, True])
def test_dataloader_batch_size_collates_like_torch(
    image_shards: list[str], drop_last: bool
) -> None:
    def build(module: Any) -> Any:
        return (
            module.WebDataset(image_shards, shardshuffle=False)
            .decode("torchrgb8")
            .to_tuple("jpg;png", "cls", "__key__")
        )

    ref = list(torch.utils.data.DataLoader(build(webdataset), batch_size=32, drop_last=drop_last))
    got = list(chute.DataLoader(build(chute.wds), batch_size=32, drop_last=drop_last))
    assert len(got) == (3 if drop_last else 4)
    assert_same(ref, got)


def test_dataloader_batch_size_dict_samples_and_custom_collate(tiny_shards: list[str]) -> None:
    def build(module: Any) -> Any:
        return module.WebDataset(tiny_shards[:1], shardshuffle=False).decode()

    ref = list(torch.utils.data.DataLoader(build(webdataset), batch_size=100))
    got = list(chute.DataLoader(build(chute.wds), batch_size=100))
    for r in ref:
        del r["__local_path__"]
    for g in got:
        g.pop("__local_path__", None)
    assert_same(ref, got)
    firsts = [
        b
        for b in chute.DataLoader(
            build(chute.wds), batch_size=100, collate_fn=lambda rows: rows[0]["__key__"]
        )
    ]
    assert firsts == ["sample0000000", "sample0000100", "sample0000200"]
