"""A tar index is trusted only as far as it proves it describes its shard.

Indexes are bound to their shard (its full path or url, its size and
modification time, a remote object's ETag) and every read checks each
member against the tar headers in front of its payload, so a shard
rewritten with its size and modification time put back, an index of
another shard, an offset one byte off or swapped keys raise instead of
yielding other bytes under a key. Loader states record which shards (and
which versions of them) they were taken over.

Shards are written by webdataset's TarWriter (a PAX header before every
member) and by GNU tar in its gnu (long-name `L` records), pax and ustar
(prefix field) formats; references are webdataset's own samples."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
import webdataset
from chute import remote
from chute.sources import tarindex
from remote_servers import S3

FIELDS = ("__key__", "cls", "bin")
LONG_DIR = "d" * 110  # names past ustar's 100-byte name field


def _members(prefix: str, n: int, seed: int) -> list[tuple[str, bytes]]:
    """Sample i: `<prefix><i>.cls` and `.bin`; sizes depend on i only, so
    two prefixes of one length and any seed give shards of the same size."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        key = f"{prefix}{i:04d}"
        out.append((f"{key}.cls", str(i % 10).encode()))
        out.append((f"{key}.bin", rng.integers(0, 256, 100 + 37 * i, dtype=np.uint8).tobytes()))
    return out


def tarwriter_shard(path: Path, prefix: str, seed: int = 0, n: int = 8) -> str:
    """webdataset's TarWriter (float mtimes: a PAX header before each member)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    samples: dict[str, dict[str, Any]] = {}
    for name, data in _members(prefix, n, seed):
        key, ext = name.split(".", 1)
        samples.setdefault(key, {"__key__": key})[ext] = data
    with webdataset.TarWriter(str(path)) as sink:
        for sample in samples.values():
            sink.write(sample)
    return str(path)


def gnu_tar_shard(tar_format: str) -> Callable[..., str]:
    """GNU tar in `tar_format`, members under a directory name of 110 bytes."""

    def write(path: Path, prefix: str, seed: int = 0, n: int = 8) -> str:
        source = path.parent / f"{path.name}.src"
        names = []
        for name, data in _members(prefix, n, seed):
            member = source / LONG_DIR / name
            member.parent.mkdir(parents=True, exist_ok=True)
            member.write_bytes(data)
            names.append(f"{LONG_DIR}/{name}")
        subprocess.run(
            ["tar", f"--format={tar_format}", "--numeric-owner", "--owner=0", "--group=0",
             "-cf", str(path), "-C", str(source), *names],
            check=True,
        )  # fmt: skip
        shutil.rmtree(source)
        return str(path)

    return write


WRITERS = {
    "tarwriter-pax": tarwriter_shard,
    "gnu-tar-gnu": gnu_tar_shard("gnu"),
    "gnu-tar-pax": gnu_tar_shard("pax"),
    "gnu-tar-ustar": gnu_tar_shard("ustar"),
}


def webdataset_samples(*shards: str) -> list[tuple[Any, ...]]:
    ds = webdataset.WebDataset(list(shards), shardshuffle=False).to_tuple(*FIELDS)
    return [tuple(s) for s in ds]


def chute_samples(ds: chute.TarDataset) -> list[tuple[Any, ...]]:
    return [tuple(s) for s in ds.__getitems__(range(len(ds)))]


def rewrite_keeping_size_and_mtime(shard: str, write: Callable[[Path], str]) -> None:
    """Rewrites `shard` in place with what `write` makes, then puts its
    modification time back, as a copy tool that preserves times would."""
    st = os.stat(shard)
    replacement = write(Path(shard).parent / "replacement.tar")
    shutil.copyfile(replacement, shard)
    os.remove(replacement)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(shard).st_size == st.st_size
    assert os.stat(shard).st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("writer", list(WRITERS), ids=list(WRITERS))
def test_same_size_rewrite_with_mtime_restored_raises(tmp_path: Path, writer: str) -> None:
    write = WRITERS[writer]
    shard = write(tmp_path / "data" / "shard-000000.tar", "k")
    ds = chute.TarDataset([shard], fields=FIELDS)
    assert chute_samples(ds) == webdataset_samples(shard)

    rewrite_keeping_size_and_mtime(shard, lambda p: write(p, "j", seed=1))
    ds = chute.TarDataset([shard], fields=FIELDS)  # the index looks current
    expected = (
        rf"shard '{shard}': its index does not describe member '(?:{LONG_DIR}/)?k0003\.(cls|bin)' "
        rf"\((1|211) bytes at offset \d+, headers at offset \d+\): the header there is member "
        rf"'(?:{LONG_DIR}/)?j0003\.\1' of \2 bytes"
    )
    with pytest.raises(chute.DataError, match=expected):
        ds[3]
    with pytest.raises(chute.DataError, match="its index does not describe member"):
        list(chute.DataLoader(ds, batch_size=3))


@pytest.mark.parametrize("writer", list(WRITERS), ids=list(WRITERS))
def test_same_names_and_sizes_rewritten_read_the_new_bytes(tmp_path: Path, writer: str) -> None:
    """Where the headers still match, the index still describes the shard:
    the new bytes come under their own keys."""
    write = WRITERS[writer]
    shard = write(tmp_path / "data" / "shard-000000.tar", "k")
    old = chute_samples(chute.TarDataset([shard], fields=FIELDS))
    rewrite_keeping_size_and_mtime(shard, lambda p: write(p, "k", seed=1))
    new = chute_samples(chute.TarDataset([shard], fields=FIELDS))
    assert new == webdataset_samples(shard)
    assert new != old


def test_index_dir_gives_shards_of_one_base_name_their_own_index(tmp_path: Path) -> None:
    train = tarwriter_shard(tmp_path / "train" / "shard-000000.tar", "t", seed=1)
    val = tarwriter_shard(tmp_path / "val" / "shard-000000.tar", "v", seed=2)
    st = os.stat(train)
    os.utime(val, ns=(st.st_atime_ns, st.st_mtime_ns))  # as an archive's extraction leaves them
    assert os.path.getsize(val) == st.st_size
    index = tmp_path / "idx"
    for shard in (train, val, train):
        ds = chute.TarDataset([shard], fields=FIELDS, index=index)
        assert chute_samples(ds) == webdataset_samples(shard)
    both = chute.TarDataset([train, val], fields=FIELDS, index=index)
    assert chute_samples(both) == webdataset_samples(train, val)
    names = sorted(os.listdir(index))
    assert len(names) == 2 and all(n.startswith("shard-000000.tar.") for n in names)
    for shard in (train, val):
        assert tarindex.read_index(shard, index_dir=index)["shard"] == os.path.abspath(shard)


def _edit_index(shard: str, edit: Callable[[dict[str, Any]], None]) -> None:
    path = tarindex.index_path(shard)
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


def test_member_offset_one_byte_off_raises_naming_shard_and_member(tmp_path: Path) -> None:
    shard = tarwriter_shard(tmp_path / "shard-000000.tar", "k")
    chute.TarDataset([shard])  # builds the index

    def shift(document: dict[str, Any]) -> None:
        assert document["samples"][3]["members"][1][0] == "cls"  # TarWriter sorts: bin, cls
        document["samples"][3]["members"][1][1] += 1

    _edit_index(shard, shift)
    ds = chute.TarDataset([shard], fields=FIELDS)
    assert ds[2] == webdataset_samples(shard)[2]
    with pytest.raises(
        chute.DataError,
        match=rf"shard '{shard}': its index does not describe member 'k0003\.cls' "
        r"\(1 bytes at offset (\d+), headers at offset \d+\): the header there is member "
        r"'k0003\.cls' of 1 bytes with its payload at offset (?!\1)",
    ):
        ds[3]


def test_swapped_keys_in_an_index_raise(tmp_path: Path) -> None:
    shard = tarwriter_shard(tmp_path / "shard-000000.tar", "k")
    chute.TarDataset([shard])

    def swap(document: dict[str, Any]) -> None:
        samples = document["samples"]
        samples[1]["key"], samples[2]["key"] = samples[2]["key"], samples[1]["key"]

    _edit_index(shard, swap)
    ds = chute.TarDataset([shard], fields=FIELDS)
    with pytest.raises(
        chute.DataError,
        match=rf"shard '{shard}': its index does not describe member 'k0002\.bin'.*"
        r"the header there is member 'k0001\.bin'",
    ):
        ds[1]
    with pytest.raises(chute.DataError, match="its index does not describe member"):
        list(chute.DataLoader(ds, batch_size=4))


def test_index_of_an_older_format_is_rebuilt(tmp_path: Path) -> None:
    shard = tarwriter_shard(tmp_path / "shard-000000.tar", "k")
    chute.TarDataset([shard])

    def downgrade(document: dict[str, Any]) -> None:
        document["version"] = 1

    _edit_index(shard, downgrade)
    with pytest.raises(chute.TarIndexError, match=r"stale: chute-tar-index version 1, .*2"):
        tarindex.read_index(shard)
    assert chute_samples(chute.TarDataset([shard], fields=FIELDS)) == webdataset_samples(shard)
    assert tarindex.read_index(shard)["version"] == tarindex.VERSION


# ---------------------------------------------------------------- remote


def _s3_dataset(s3: S3, urls: list[str], **kwargs: Any) -> chute.TarDataset:
    return chute.TarDataset(
        urls,
        fields=FIELDS,
        storage_options=s3.storage_options(),
        remote=remote.RemoteOptions(backoff_s=0.01, max_backoff_s=0.05),
        **kwargs,
    )


def test_s3_objects_of_equal_size_do_not_share_an_index(moto_s3: S3, tmp_path: Path) -> None:
    train = tarwriter_shard(tmp_path / "train" / "shard-000000.tar", "t", seed=1)
    val = tarwriter_shard(tmp_path / "val" / "shard-000000.tar", "v", seed=2)
    assert os.path.getsize(train) == os.path.getsize(val)
    moto_s3.bucket(
        "trust",
        {
            "train/shard-000000.tar": Path(train).read_bytes(),
            "val/shard-000000.tar": Path(val).read_bytes(),
        },
    )
    index = tmp_path / "idx"
    urls = {"s3://trust/train/shard-000000.tar": train, "s3://trust/val/shard-000000.tar": val}
    for url, local in [*urls.items(), *urls.items()]:
        assert chute_samples(_s3_dataset(moto_s3, [url], index=index)) == webdataset_samples(local)
    assert len(os.listdir(index)) == 2


def test_s3_object_replaced_by_one_of_equal_size_is_indexed_again(
    moto_s3: S3, tmp_path: Path
) -> None:
    first = tarwriter_shard(tmp_path / "a" / "shard-000000.tar", "a", seed=1)
    second = tarwriter_shard(tmp_path / "b" / "shard-000000.tar", "b", seed=2)
    moto_s3.bucket("replaced", {"shard-000000.tar": Path(first).read_bytes()})
    url = "s3://replaced/shard-000000.tar"
    index = tmp_path / "idx"
    assert chute_samples(_s3_dataset(moto_s3, [url], index=index)) == webdataset_samples(first)
    client: Any = moto_s3.client()
    client.put_object(Bucket="replaced", Key="shard-000000.tar", Body=Path(second).read_bytes())
    assert chute_samples(_s3_dataset(moto_s3, [url], index=index)) == webdataset_samples(second)


def test_s3_sidecar_index_of_a_replaced_object_raises_on_read(moto_s3: S3, tmp_path: Path) -> None:
    """An index put beside the object after a local ``chute index`` records
    no ETag: its reads still check every member against its headers."""
    first = tarwriter_shard(tmp_path / "a" / "shard-000000.tar", "a", seed=1)
    second = tarwriter_shard(tmp_path / "b" / "shard-000000.tar", "b", seed=2)
    sidecar = tarindex.write_index(first)
    moto_s3.bucket(
        "sidecar",
        {
            "shard-000000.tar": Path(second).read_bytes(),
            "shard-000000.tar.idx.json": sidecar.read_bytes(),
        },
    )
    ds = _s3_dataset(moto_s3, ["s3://sidecar/shard-000000.tar"])
    with pytest.raises(
        chute.DataError,
        match=r"shard 's3://sidecar/shard-000000\.tar': its index does not describe member "
        r"'a0000\.bin'.*the header there is member 'b0000\.bin'",
    ):
        ds[0]


# ---------------------------------------------------------------- loader states


def _loader(shards: list[str]) -> chute.DataLoader:
    ds = chute.TarDataset(shards, fields=("__key__", "cls"))
    return chute.DataLoader(
        ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)
    )


def _state_after_two_batches(shards: list[str]) -> dict[str, Any]:
    loader = _loader(shards)
    batches = iter(loader)
    next(batches)
    next(batches)
    state = loader.state_dict()
    del batches
    return state


def _some_shards(directory: Path, prefix: str, seed: int) -> list[str]:
    return [tarwriter_shard(directory / f"shard-{i:06d}.tar", prefix, seed + i) for i in range(2)]


def test_state_over_other_shards_of_the_same_length_is_refused(tmp_path: Path) -> None:
    a = _some_shards(tmp_path / "a", "a", 1)
    b = _some_shards(tmp_path / "b", "b", 5)
    state = _state_after_two_batches(a)
    other = _loader(b)
    assert len(other.dataset) == 16  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"loader state is from another dataset \(its files, arrays or sources\): "
        r"the state was taken over shards "
        rf"\['{a[0]}', '{a[1]}'\] but this loader reads \['{b[0]}', '{b[1]}'\]",
    ):
        other.load_state_dict(state)

    # The same loader resumes: the state's remaining batches are those it had left.
    full = [keys for keys, _ in _loader(a)]
    resumed = _loader(a)
    resumed.load_state_dict(state)
    assert [keys for keys, _ in resumed] == full[2:]


def test_state_over_a_shard_rewritten_since_is_refused(tmp_path: Path) -> None:
    a = _some_shards(tmp_path / "a", "a", 1)
    state = _state_after_two_batches(a)
    tarwriter_shard(Path(a[1]), "c", seed=9)  # the same path, other samples
    with pytest.raises(ValueError, match=r"taken over headers_digests \['[0-9a-f]{16}', "):
        _loader(a).load_state_dict(state)


def test_state_without_its_dataset_identity_is_refused(tmp_path: Path) -> None:
    a = _some_shards(tmp_path / "a", "a", 1)
    state = _state_after_two_batches(a)
    stripped = copy.deepcopy(state)
    del stripped["loader"]["dataset"]
    with pytest.raises(ValueError, match=r"carries no identity of its dataset.*'shards'"):
        _loader(a).load_state_dict(stripped)
    del stripped["loader"]
    with pytest.raises(ValueError, match=r"loader state has no 'loader' record"):
        _loader(a).load_state_dict(stripped)
