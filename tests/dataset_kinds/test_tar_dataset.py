"""TarDataset: tar shards read by offset through their index, as a map-style
dataset whose samples are webdataset's and whose batches are torch's.

References are built with the real libraries: webdataset decodes the samples
(shards in order, samples in archive order), and torch's DataLoader batches
a map-style dataset of them with the same sampler arguments."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
import torch.utils.data
import webdataset
from chute.common.errors import MemberDecodeError
from chute.sources import tarindex
from chute.wds import ignore_and_continue, warn_and_continue
from conftest import jpeg_bytes, npy_bytes, png_bytes, write_shards

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

# ---------------------------------------------------------------- data


def _samples(n: int, seed: int, size: tuple[int, int] | None = (24, 32)) -> list[dict[str, Any]]:
    """Images (a png every 5th), labels, text and json; `size` None: every
    image a different size."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        h, w = size if size is not None else (int(rng.integers(8, 40)), int(rng.integers(8, 40)))
        sample: dict[str, Any] = {"__key__": f"s{i:05d}", "cls": int(rng.integers(0, 100))}
        if i % 5 == 0:
            sample["png"] = png_bytes(rng, h, w)
        else:
            sample["jpg"] = jpeg_bytes(rng, h, w)
        sample["txt"] = f"caption {i} " + "é" * (i % 3)
        sample["json"] = {"i": i, "w": i / 4, "tag": "ab"[i % 2]}
        sample["feat.npy"] = npy_bytes(rng.standard_normal(4).astype(np.float32))
        out.append(sample)
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("tards"), _samples(60, 1), per_shard=25)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("uneven"), _samples(30, 2, None), per_shard=10)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Small samples, 300 per shard: what read coalescing is about."""
    rng = np.random.default_rng(4)
    samples = [
        {"__key__": f"t{i:06d}", "npy": rng.standard_normal(8).astype(np.float32), "cls": i}
        for i in range(900)
    ]
    return write_shards(tmp_path_factory.mktemp("tiny"), samples, per_shard=300)


def _copy_shards(paths: list[str], to: Path) -> list[str]:
    to.mkdir(parents=True, exist_ok=True)
    out = []
    for p in paths:
        target = to / Path(p).name
        shutil.copy2(p, target)
        out.append(str(target))
    return out


def _writable(value: Any) -> Any:
    """webdataset's decoded arrays are read-only views of Pillow's buffers,
    which torch warns about when it collates them; a writable copy is equal."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_writable(v) for v in value)
    if isinstance(value, dict):
        return {k: _writable(v) for k, v in value.items()}
    return value


def reference(
    paths: list[str], decode: Any, fields: Any, handler: Any = webdataset.reraise_exception
) -> list[Any]:
    """webdataset's samples of `paths`, as TarDataset(paths, decode, fields) promises them."""
    ds = webdataset.WebDataset(paths, shardshuffle=False)
    if decode is not None:
        specs = (decode,) if isinstance(decode, str) else tuple(decode)
        ds = ds.decode(*(s for s in specs if s != ""), handler=handler)  # "": no image decoder
    if isinstance(fields, dict):
        ds = ds.to_tuple(*fields.values())
        names = list(fields)
        return [_writable(dict(zip(names, s, strict=True))) for s in ds]
    if fields is not None:
        ds = ds.to_tuple(*fields)
    return [_writable(s) for s in ds]


class ListDataset(torch.utils.data.Dataset[Any]):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def assert_same(a: Any, b: Any, where: str = "batch") -> None:
    """Equal values of equal types, recursively (tensors: dtype and shape too)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def both_loaders(
    ds: chute.TarDataset, ref: list[Any], num_workers: int = 0, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    """Batches of chute.DataLoader over `ds` and of torch's over `ref`, with
    the same arguments and a generator seeded alike."""
    ours = list(
        chute.DataLoader(
            ds, num_workers=num_workers, generator=torch.Generator().manual_seed(7), **kwargs
        )
    )
    theirs = list(
        torch.utils.data.DataLoader(
            ListDataset(ref), generator=torch.Generator().manual_seed(7), **kwargs
        )
    )
    return ours, theirs


# ---------------------------------------------------------------- samples


@pytest.mark.parametrize(
    ("decode", "fields"),
    [
        ("rgb8", ("jpg;png", "cls")),
        ("torchrgb8", ("jpg;png", "cls", "__key__")),
        ("l8", None),
        ("rgb", ("jpg;png", "txt", "json", "feat.npy")),
        (None, ("cls", "txt")),
        ("", ("jpg;png", "cls")),
    ],
)
def test_samples_equal_webdataset(shards: list[str], decode: Any, fields: Any) -> None:
    ds = chute.TarDataset(shards, decode=decode, fields=fields)
    ref = reference(shards, decode, fields)
    assert len(ds) == len(ref) == 60
    for i in range(len(ds)):
        assert_same(_writable(ds[i]), ref[i], f"sample {i}")
    assert_same(
        [_writable(s) for s in ds.__getitems__([5, 0, 59, 5])], [ref[5], ref[0], ref[59], ref[5]]
    )


def test_dict_fields_name_the_output(shards: list[str]) -> None:
    fields = {"image": "jpg;png", "label": "cls", "key": "__key__"}
    ds = chute.TarDataset(shards, decode="torchrgb8", fields=fields)
    ref = reference(shards, "torchrgb8", fields)
    for i in (0, 1, 33):
        assert_same(ds[i], ref[i])
    ours, theirs = both_loaders(ds, ref, batch_size=9, shuffle=True)
    assert_same(ours, theirs)


# ---------------------------------------------------------------- batches


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    ("decode", "fields", "options"),
    [
        ("rgb8", ("jpg;png", "cls"), {}),
        ("torchrgb8", ("jpg;png", "cls", "txt", "json"), {}),
        ("torchrgb", ("jpg;png", "json"), {}),
        ("rgb8", ("jpg;png", "feat.npy", "__key__", "__url__"), {}),
        ("torchrgb8", ("jpg;png", "cls"), {"size": (16, 16), "crop": "center"}),
    ],
)
def test_loader_batches_equal_torch(
    shards: list[str], decode: str, fields: Any, options: dict[str, Any], num_workers: int
) -> None:
    ds = chute.TarDataset(shards, decode=decode, fields=fields, **options)
    if options:
        # The reference resizes as the engine does: take ds's own samples, which
        # test_samples_equal_webdataset ties to webdataset for the plain decode.
        ref = [_writable(ds[i]) for i in range(len(ds))]
    else:
        ref = reference(shards, decode, fields)
    ours, theirs = both_loaders(
        ds, ref, num_workers=num_workers, batch_size=8, shuffle=True, drop_last=False
    )
    assert len(ours) == len(theirs) == 8
    assert_same(ours, theirs)


@pytest.mark.parametrize("decode", [None, ""])
def test_dict_samples_batch_as_torch_collates_them(tiny: list[str], decode: Any) -> None:
    ds = chute.TarDataset(tiny, decode=decode)
    ref = reference(tiny, decode, None)
    assert set(ds[0]) == {"__key__", "__url__", "__local_path__", "npy", "cls"}
    assert_same(ds[123], ref[123])
    ours, theirs = both_loaders(ds, ref, batch_size=50, shuffle=True)
    assert_same(ours, theirs)


def test_dict_samples_with_other_members_fail_as_in_torch(shards: list[str]) -> None:
    """Samples with a png where others have a jpg: torch's collate of such
    dicts fails on the first key a sample lacks, and so does ours."""
    ds = chute.TarDataset(shards, decode="rgb8")
    ref = reference(shards, "rgb8", None)
    assert_same(_writable(ds[5]), ref[5])
    with pytest.raises(KeyError):
        list(torch.utils.data.DataLoader(ListDataset(ref), batch_size=10))
    with pytest.raises(KeyError):
        list(chute.DataLoader(ds, batch_size=10))


def test_loader_sequential_and_drop_last(shards: list[str]) -> None:
    ds = chute.TarDataset(shards, decode="rgb8", fields=("jpg;png", "cls"))
    ref = reference(shards, "rgb8", ("jpg;png", "cls"))
    ours, theirs = both_loaders(ds, ref, batch_size=16, shuffle=False, drop_last=True)
    assert len(ours) == 3
    assert_same(ours, theirs)


def test_variable_size_images_batch_as_lists(uneven: list[str]) -> None:
    ds = chute.TarDataset(uneven, decode="rgb8", fields=("jpg;png", "cls"))
    ref = reference(uneven, "rgb8", ("jpg;png", "cls"))
    shapes = {s[0].shape for s in ref}
    assert len(shapes) > 1
    ours, theirs = both_loaders(ds, ref, batch_size=6, shuffle=True, collate_fn=_as_lists)
    assert_same(ours, theirs)
    # torch's default collate cannot stack them, and neither do we.
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(chute.DataLoader(ds, batch_size=6))


def _as_lists(batch: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(column) for column in zip(*batch, strict=True)]


def test_torch_dataloader_worker_processes(shards: list[str]) -> None:
    ds = chute.TarDataset(shards, decode="rgb8", fields=("jpg;png", "cls", "txt"))
    ds[0]  # native state in this process: the workers must rebuild their own
    ref = reference(shards, "rgb8", ("jpg;png", "cls", "txt"))
    kwargs: dict[str, Any] = {"batch_size": 7, "shuffle": True}
    ours = list(
        torch.utils.data.DataLoader(
            ds, num_workers=2, generator=torch.Generator().manual_seed(1), timeout=60, **kwargs
        )
    )
    theirs = list(
        torch.utils.data.DataLoader(
            ListDataset(ref), generator=torch.Generator().manual_seed(1), **kwargs
        )
    )
    assert_same(ours, theirs)


def test_pickles_without_native_state(shards: list[str]) -> None:
    ds = chute.TarDataset(shards, decode="rgb8", fields=("jpg;png", "cls"))
    first = ds[3]
    assert ds._proc is not None
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._proc is None
    assert_same(copy[3], first)


@pytest.mark.parametrize("world_size", [2, 3])
def test_distributed_partition_equals_distributed_sampler(
    shards: list[str], world_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = chute.TarDataset(shards, decode=None, fields=("__key__", "cls"))
    ref = reference(shards, None, ("__key__", "cls"))
    seen: list[str] = []
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        loader = chute.DataLoader(ds, batch_size=5, distributed=True, seed=11)
        loader.set_epoch(2)
        ours = list(loader)
        sampler = torch.utils.data.DistributedSampler(
            ListDataset(ref), num_replicas=world_size, rank=rank, shuffle=True, seed=11
        )
        sampler.set_epoch(2)
        theirs = list(torch.utils.data.DataLoader(ListDataset(ref), batch_size=5, sampler=sampler))
        assert_same(ours, theirs)
        seen.extend(k for batch in ours for k in batch[0])
    assert set(seen) == {r[0] for r in ref}


def test_len_and_indices_like_a_sequence(shards: list[str]) -> None:
    ds = chute.TarDataset(shards, fields=("__key__",))
    n = len(ds)
    assert n == 60
    assert ds[-1] == ds[n - 1] == ("s00059",)
    assert ds[-n] == ds[0]
    for bad in (n, -n - 1, 10**9):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    with pytest.raises(ValueError, match="out of range for a dataset of length 60"):
        ds.__getitems__([0, 60])
    assert [r[0] for r in ds.__getitems__([-1, 0])] == ["s00059", "s00000"]


def test_urls_as_webdataset_takes_them(shards: list[str]) -> None:
    directory = os.path.dirname(shards[0])
    pattern = os.path.join(directory, "shard-{000000..000002}.tar")
    by_glob = chute.TarDataset(os.path.join(directory, "shard-*.tar"), fields=("__key__",))
    by_braces = chute.TarDataset(pattern, fields=("__key__",))
    by_list = chute.TarDataset(["file:" + s for s in shards], fields=("__key__",))
    assert len(by_glob) == len(by_braces) == len(by_list) == 60
    assert by_glob[30] == by_braces[30] == by_list[30]
    with pytest.raises(ValueError, match="local shards"):
        chute.TarDataset("pipe:cat " + shards[0])
    with pytest.raises(FileNotFoundError):
        chute.TarDataset(os.path.join(directory, "nothing-*.tar"))


# ---------------------------------------------------------------- the index


def test_missing_index_is_built_and_cached(shards: list[str], tmp_path: Path) -> None:
    paths = _copy_shards(shards, tmp_path)
    for p in paths:
        assert not tarindex.index_path(p).exists()
    ds = chute.TarDataset(paths, fields=("__key__",))
    assert len(ds) == 60
    for p in paths:
        doc = tarindex.read_index(p)
        assert doc["version"] == 2 and doc["shard"] == os.path.abspath(p)
    # The grouping is the engine reader's: the same keys and offsets.
    engine = _chute_samples(paths[0])
    assert [(s["key"], s["offset"]) for s in tarindex.read_index(paths[0])["samples"]] == engine
    stamps = [tarindex.index_path(p).stat().st_mtime_ns for p in paths]
    chute.TarDataset(paths, fields=("__key__",))
    assert [tarindex.index_path(p).stat().st_mtime_ns for p in paths] == stamps


def _chute_samples(path: str) -> list[tuple[str, int]]:
    return [(k, off) for k, _, off in chute._core.read_tar_samples(path)]


def test_index_in_its_own_directory(shards: list[str], tmp_path: Path) -> None:
    paths = _copy_shards(shards, tmp_path / "data")
    ds = chute.TarDataset(paths, decode="rgb8", fields=("jpg;png", "cls"), index=tmp_path / "idx")
    assert sorted(os.listdir(tmp_path / "idx")) == sorted(
        tarindex.index_path(p, tmp_path / "idx").name for p in paths
    )
    assert all(
        re.fullmatch(re.escape(os.path.basename(p)) + r"\.[0-9a-f]{16}\.idx\.json", name)
        for p, name in zip(paths, sorted(os.listdir(tmp_path / "idx")), strict=True)
    )
    assert not any(tarindex.index_path(p).exists() for p in paths)
    assert_same(_writable(ds[7]), reference(paths, "rgb8", ("jpg;png", "cls"))[7])


def _rewrite(path: str, samples: list[dict[str, Any]]) -> None:
    """Writes other samples into `path`, with a modification time that differs."""
    with webdataset.TarWriter(path) as sink:
        for s in samples:
            sink.write(s)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_stale_index_is_rebuilt(shards: list[str], tmp_path: Path) -> None:
    paths = _copy_shards(shards[:1], tmp_path)
    chute.TarDataset(paths, fields=("__key__",))
    _rewrite(paths[0], _samples(7, 9))
    ds = chute.TarDataset(paths, decode="rgb8", fields=("__key__", "jpg;png", "cls"))
    assert len(ds) == 7
    assert_same(_writable(ds[6]), reference(paths, "rgb8", ("__key__", "jpg;png", "cls"))[6])
    assert len(tarindex.read_index(paths[0])["samples"]) == 7


def test_same_size_other_mtime_is_stale(shards: list[str], tmp_path: Path) -> None:
    paths = _copy_shards(shards[:1], tmp_path)
    chute.TarDataset(paths)
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(chute.TarIndexError, match="stale"):
        tarindex.read_index(paths[0])
    assert len(chute.TarDataset(paths)) == 25


def _refuse_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The index location as a read-only directory would behave (tests run as root)."""

    def refuse(document: dict[str, Any], target: Path) -> None:
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(tarindex, "_write_document", refuse)


def test_stale_index_that_cannot_be_rebuilt_is_rejected(
    shards: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _copy_shards(shards[:1], tmp_path)
    chute.TarDataset(paths)
    _rewrite(paths[0], _samples(3, 5))
    _refuse_writes(monkeypatch)
    with pytest.raises(chute.TarIndexError, match=r"stale.*shard-000000\.tar.*cannot be rebuilt"):
        chute.TarDataset(paths)


def test_missing_index_that_cannot_be_saved_is_used_from_memory(
    shards: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _copy_shards(shards[:2], tmp_path)
    _refuse_writes(monkeypatch)
    with pytest.warns(chute.IndexNotSavedWarning, match="2 tar index"):
        ds = chute.TarDataset(paths, fields=("__key__",))
    assert ds[49] == ("s00049",)


def _corrupt_bad_json(doc: dict[str, Any], text: str) -> str:
    return text[: len(text) // 2]


def _corrupt_past_eof(doc: dict[str, Any], text: str) -> str:
    doc["samples"][-1]["members"][0][1] = doc["shard_size"]
    return json.dumps(doc)


def _corrupt_member_entry(doc: dict[str, Any], text: str) -> str:
    doc["samples"][3]["members"][0] = doc["samples"][3]["members"][0][:2]
    return json.dumps(doc)


def _corrupt_no_members(doc: dict[str, Any], text: str) -> str:
    doc["samples"][4]["members"] = []
    return json.dumps(doc)


def _corrupt_other_shard(doc: dict[str, Any], text: str) -> str:
    doc["shard"] = "other.tar"
    return json.dumps(doc)


CORRUPTIONS: list[Callable[[dict[str, Any], str], str]] = [
    _corrupt_bad_json,
    _corrupt_past_eof,
    _corrupt_member_entry,
    _corrupt_no_members,
    _corrupt_other_shard,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_corrupt_index_is_rebuilt_or_rejected(
    shards: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corrupt: Any
) -> None:
    paths = _copy_shards(shards[:1], tmp_path)
    chute.TarDataset(paths)
    path = tarindex.index_path(paths[0])
    text = path.read_text()
    path.write_text(corrupt(json.loads(text), text))
    with pytest.raises(chute.TarIndexError, match=r"shard-000000\.tar"):
        tarindex.read_index(paths[0])
    with monkeypatch.context() as m:
        _refuse_writes(m)
        with pytest.raises(chute.TarIndexError, match=r"shard-000000\.tar"):
            chute.TarDataset(paths)
    ds = chute.TarDataset(paths, fields=("__key__", "cls"))
    assert_same(ds.__getitems__(range(25)), reference(paths, None, ("__key__", "cls")))
    assert tarindex.read_index(paths[0])["samples"][4]["members"]


def test_shard_changed_after_open_is_not_read(shards: list[str], tmp_path: Path) -> None:
    paths = _copy_shards(shards[:1], tmp_path)
    ds = chute.TarDataset(paths, fields=("__key__", "cls"))
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(chute.DataError, match=r"shard-000000\.tar' changed after it was indexed"):
        ds[0]


def test_shard_cut_while_open_is_not_read(shards: list[str], tmp_path: Path) -> None:
    paths = _copy_shards(shards[:1], tmp_path)
    ds = chute.TarDataset(paths, fields=("__key__", "cls"))
    assert ds[0][0] == "s00000"  # the shard is open now
    os.truncate(paths[0], 4096)
    with pytest.raises(
        chute.DataError, match=r"sample 's00020' at offset \d+: .* now ends at offset 4096"
    ):
        ds[20]


# ---------------------------------------------------------------- reads


def test_neighbouring_samples_share_a_read(tiny: list[str]) -> None:
    ds = chute.TarDataset(tiny, decode="", fields=("npy", "cls"))

    def reads(indices: Any) -> int:
        before = ds.stats()["reads"] if ds._proc is not None else 0
        batch = ds.read_batch(np.asarray(indices, dtype=np.int64))
        assert batch[1].tolist() == list(indices)
        return int(ds.stats()["reads"]) - before

    assert reads(range(300, 556)) == 1  # 256 consecutive samples of one shard
    assert reads(range(200, 400)) == 2  # across a shard boundary
    scattered = np.random.default_rng(0).choice(900, size=256, replace=False)
    assert reads(scattered) > 3
    stats = ds.stats()
    assert stats["bytes_read"] == stats["source_bytes_read"] > 0


# ---------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Sample s00004's JPEG is cut short: its header reads, its body does not."""
    samples = _samples(12, 3)
    data = samples[4]["jpg"]
    samples[4]["jpg"] = data[: len(data) // 2]
    return write_shards(tmp_path_factory.mktemp("broken"), samples, per_shard=12)


def test_corrupt_jpeg_raises_naming_shard_member_offset(broken: list[str]) -> None:
    ds = chute.TarDataset(broken, decode="rgb8", fields=("jpg;png", "cls"))
    offset = next(
        m[1]
        for s in tarindex.read_index(broken[0])["samples"]
        if s["key"] == "s00004"
        for m in s["members"]
        if m[0] == "jpg"
    )
    expected = rf"shard '{broken[0]}', member 's00004\.jpg' \(payload at offset {offset}\)"
    with pytest.raises(chute.DataError, match=expected):
        list(chute.DataLoader(ds, batch_size=4))
    with pytest.raises(chute.DataError, match=expected):
        ds[4]


@pytest.mark.parametrize("handler", [ignore_and_continue, warn_and_continue])
def test_corrupt_jpeg_skipped(broken: list[str], handler: Any) -> None:
    ds = chute.TarDataset(
        broken, decode="rgb8", fields=("__key__", "jpg;png", "cls"), handler=handler
    )
    ref = reference(broken, "rgb8", ("__key__", "jpg;png", "cls"), webdataset.ignore_and_continue)
    assert [s[0] for s in ref] == [f"s{i:05d}" for i in range(12) if i != 4]
    if handler is warn_and_continue:
        with pytest.warns(chute.SkippedSampleWarning, match="s00004"):
            batches = list(chute.DataLoader(ds, batch_size=4))
    else:
        batches = list(chute.DataLoader(ds, batch_size=4))
    assert [len(b[0]) for b in batches] == [4, 3, 4]
    theirs = [
        torch.utils.data.default_collate(ref[0:4]),
        torch.utils.data.default_collate(ref[4:7]),
        torch.utils.data.default_collate(ref[7:11]),
    ]
    assert_same(batches, theirs)
    assert ds.stats()["samples_skipped"] == 1
    if handler is warn_and_continue:
        with pytest.warns(chute.SkippedSampleWarning, match="s00004"):
            assert len(ds.__getitems__(range(12))) == 11
    else:
        assert len(ds.__getitems__(range(12))) == 11
    # One sample asked for and skipped: nothing to return, so its error is
    # raised, translated as the loader raises it (class, place, no source line).
    with pytest.raises(MemberDecodeError) as info:
        ds[4]
    assert (info.value.url, info.value.key, info.value.k) == (broken[0], "s00004", "jpg")
    assert info.value.failure_scope == "member" and "[" not in str(info.value)


def test_missing_field_is_a_data_error(shards: list[str]) -> None:
    ds = chute.TarDataset(shards, decode="rgb8", fields=("jpg", "cls"))
    with pytest.raises(
        chute.DataError, match=r"sample 's00000' at offset \d+: field 'jpg' not found"
    ):
        ds[0]
    assert ds[1][1] == reference(shards, "", ("cls",))[1][0] and isinstance(ds[1][1], int)


def test_decode_options_need_decode(shards: list[str]) -> None:
    with pytest.raises(ValueError, match="need decode"):
        chute.TarDataset(shards, size=(8, 8))
    with pytest.raises(ValueError, match="Unknown imagespec"):
        chute.TarDataset(shards, decode="rgb9")
    with pytest.raises(TypeError):
        chute.TarDataset(shards, decode="rgb8", no_such_option=1)


def test_tar_with_pax_headers_and_odd_names(tmp_path: Path) -> None:
    """Payload offsets behind PAX headers, a member without extension and a
    metadata member: the index must point at the right bytes."""
    path = tmp_path / "odd.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [
            ("__meta__", b"{}"),
            ("d" * 120 + "/a.cls", b"1"),
            ("d" * 120 + "/a.TXT", "ü".encode() * 300),
            ("README", b"x"),
            ("b.cls", b"2"),
            ("b.txt", b"bee"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ds = chute.TarDataset(str(path), decode="", fields=("__key__", "cls", "txt"))
    ref = reference([str(path)], "", ("__key__", "cls", "txt"))
    assert len(ds) == 2
    assert_same([ds[0], ds[1]], ref)


# ---------------------------------------------------------------- streams and the index


def _drop_last_sample_from_index(shard: str) -> None:
    """A current index that counts one sample fewer than the shard holds:
    whoever reports that count read it from the index."""
    path = tarindex.index_path(shard)
    document = json.loads(path.read_text())
    document["samples"].pop()
    path.write_text(json.dumps(document))


def test_stream_counts_come_from_a_current_index(
    tiny: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chute.sources.shards import split_by_node
    from chute.wds.even import even_samples, shard_samples

    paths = _copy_shards(tiny, tmp_path)
    assert [shard_samples(p, "", 0.0) for p in paths] == [300, 300, 300]
    with pytest.raises(ValueError, match="needs a current sidecar index"):
        chute.WebDataset(paths, shardshuffle=False).with_length()
    assert not any(tarindex.index_path(p).exists() for p in paths)  # streams never build them

    chute.TarDataset(paths)  # builds them
    for p in paths:
        _drop_last_sample_from_index(p)
    assert [shard_samples(p, "", 0.0) for p in paths] == [299, 299, 299]
    ds = chute.WebDataset(paths, shardshuffle=False)
    assert len(ds.with_length()) == 897
    assert len(ds.decode().to_tuple("npy", "cls").batched(10).with_length()) == 90
    assert len(ds.batched(10, partial=False).with_length()) == 89
    assert len(ds.with_length(5, silent=True)) == 5  # an explicit length warns, as in webdataset
    with pytest.raises(ValueError, match=r"after \.select\(\)"):
        ds.select(bool).with_length()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # Rank 0 has shards 0 and 2 (598 samples), rank 1 shard 1 (299): "cap" takes the fewest.
    assert even_samples("cap", paths[1::2], paths, split_by_node, "", 0.0) == 299

    # A stale index is not used: the shard is scanned.
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert shard_samples(paths[0], "", 0.0) == 300


def test_inspect_counts_from_a_current_index(
    tiny: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from chute.cli import main

    paths = _copy_shards(tiny[:1], tmp_path)
    assert main(["inspect", paths[0]]) == 0
    assert "samples: 300" in capsys.readouterr().out
    chute.TarDataset(paths)
    _drop_last_sample_from_index(paths[0])
    assert main(["inspect", paths[0]]) == 0
    out = capsys.readouterr().out
    assert "samples: 299" in out and "counted from its index" in out
    assert main(["inspect", "--json", paths[0]]) == 0
    report = json.loads(capsys.readouterr().out)[0]
    assert report["counted_from"] == "index" and report["samples"] == 299
    assert report["first_samples"][0]["fields"]["cls"]["value"] == 0
    assert main(["inspect", "--scan", "--json", paths[0]]) == 0
    report = json.loads(capsys.readouterr().out)[0]
    assert report["counted_from"] == "scan" and report["samples"] == 300
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert main(["inspect", paths[0]]) == 0
    out = capsys.readouterr().out
    assert "samples: 300" in out and "index not used" in out and "stale" in out
