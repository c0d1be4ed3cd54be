"""Compressed shards: gzip streams are inflated natively whatever their name
(as webdataset's tarfile mode "r|*" reads them); bzip2, xz and zstd are
refused with a message that says how to read them."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import pytest
import webdataset
from conftest import image_samples, tiny_samples, write_shards
from helpers import assert_same

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("plain"), tiny_samples(300, seed=4), per_shard=100)


def gzipped(path: str, dest: Path, name: str) -> str:
    out = dest / name
    out.write_bytes(gzip.compress(Path(path).read_bytes(), mtime=0))
    return str(out)


def build(ds: Any) -> Any:
    return ds.decode().to_tuple("__key__", "npy", "cls").batched(32)


@pytest.mark.parametrize("suffix", [".tgz", ".tar.gz", ".tar"])
def test_gzip_shards_equal_webdataset(plain: list[str], tmp_path: Path, suffix: str) -> None:
    # The name does not matter: a ".tar" holding gzip is inflated too.
    urls = [gzipped(p, tmp_path, f"s{i}{suffix}") for i, p in enumerate(plain)]
    ref = list(build(webdataset.WebDataset(urls, shardshuffle=False)))
    got = list(build(chute.WebDataset(urls, shardshuffle=False)))
    assert sum(len(b[0]) for b in got) == 300
    assert_same(ref, got)
    assert [b[0] for b in got] == [b[0] for b in build(chute.WebDataset(plain, shardshuffle=False))]


def test_gzip_images_decode_natively(tmp_path: Path) -> None:
    (url,) = write_shards(tmp_path, image_samples(20, png_every=3), per_shard=20)
    tgz = gzipped(url, tmp_path, "images.tgz")

    def pipeline(module: Any) -> Any:
        return module.WebDataset(tgz, shardshuffle=False).decode("rgb8").to_tuple("jpg;png", "cls")

    assert_same(list(pipeline(webdataset)), list(pipeline(chute)))


def test_multi_member_gzip(plain: list[str], tmp_path: Path) -> None:
    # gzip -c a b > c, pigz -i and concatenated streams: every member counts.
    data = Path(plain[0]).read_bytes()
    cut = [0, 700, 5000, len(data) // 2, len(data)]
    multi = tmp_path / "multi.tgz"
    multi.write_bytes(
        b"".join(gzip.compress(data[a:b]) for a, b in zip(cut, cut[1:], strict=False))
    )
    keys = [k for (k,) in chute.WebDataset(str(multi), shardshuffle=False).to_tuple("__key__")]
    assert keys == [f"sample{i:07d}" for i in range(100)]


def test_pipe_and_cache_of_a_gzip_shard(plain: list[str], tmp_path: Path) -> None:
    tgz = gzipped(plain[0], tmp_path, "a.tgz")
    cache = tmp_path / "cache"
    cache.mkdir()
    ds = chute.WebDataset(f"pipe:cat {tgz}", shardshuffle=False, cache_dir=str(cache)).to_tuple(
        "__key__"
    )
    first = list(ds)
    (cached,) = list(cache.iterdir())
    # The cache keeps the bytes as the command sent them; reading it inflates them.
    assert cached.read_bytes() == Path(tgz).read_bytes()
    assert list(ds) == first and len(first) == 100


def test_truncated_gzip_names_the_shard_and_gzip(plain: list[str], tmp_path: Path) -> None:
    full = gzip.compress(Path(plain[0]).read_bytes())
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(full[: len(full) * 2 // 3])
    ds = chute.WebDataset(str(cut), shardshuffle=False).to_tuple("__key__")
    with pytest.raises(chute.DataError, match=r"truncated gzip stream '.*cut\.tgz'") as info:
        list(ds)
    # webdataset reports a cut archive as tarfile.ReadError: so does chute.
    assert isinstance(info.value, tarfile.ReadError)
    assert "[" not in str(info.value) and info.value.where.startswith("gzip_source.cc:")
    # Under a skip handler the samples before the cut arrive, and the cut is reported.
    good = gzipped(plain[1], tmp_path, "good.tgz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [
            k
            for (k,) in chute.WebDataset(
                [str(cut), good], shardshuffle=False, handler=wds.warn_and_continue
            ).to_tuple("__key__")
        ]
    assert 0 < keys.index("sample0000100") < 100
    assert keys[keys.index("sample0000100") :] == [f"sample{i:07d}" for i in range(100, 200)]
    assert any("truncated gzip stream" in str(w.message) for w in caught)


def test_corrupt_gzip_data(plain: list[str], tmp_path: Path) -> None:
    full = bytearray(gzip.compress(Path(plain[0]).read_bytes()))
    for i in range(200, 260):
        full[i] ^= 0x5A
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(bytes(full))
    with pytest.raises(chute.DataError, match=r"corrupt gzip stream '.*bad\.tgz'"):
        list(chute.WebDataset(str(bad), shardshuffle=False).to_tuple("__key__"))


@pytest.mark.parametrize(("tool", "word"), [("bzip2", "bzip2"), ("xz", "xz"), ("zstd", "zstd")])
def test_other_compressions_are_refused_with_a_way_out(
    plain: list[str], tmp_path: Path, tool: str, word: str
) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    packed = tmp_path / f"shard.tar.{tool}"
    with open(packed, "wb") as out:
        subprocess.run([tool, "-c", plain[0]], stdout=out, check=True)
    with pytest.raises(chute.DataError, match=rf"{word}-compressed stream") as info:
        list(chute.WebDataset(str(packed), shardshuffle=False).to_tuple("__key__"))
    assert f"pipe:{tool} -dc" in str(info.value)
    # The way out the message names works.
    keys = chute.WebDataset(f"pipe:{tool} -dc {packed}", shardshuffle=False).to_tuple("__key__")
    assert len(list(keys)) == 100


def test_dataloader_over_gzip_shards(plain: list[str], tmp_path: Path) -> None:
    urls = [gzipped(p, tmp_path, f"s{i}.tgz") for i, p in enumerate(plain)]
    ds = chute.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "cls")
    batches = list(chute.DataLoader(ds, batch_size=50, num_workers=2))
    assert [len(b[1]) for b in batches] == [50] * 6


def test_a_gzip_shard_cannot_be_indexed(plain: list[str], tmp_path: Path) -> None:
    from chute.sources.tarindex import build_index

    with pytest.raises(ValueError, match="gzip-compressed: an index needs a plain tar"):
        build_index(gzipped(plain[0], tmp_path, "a.tgz"))


def test_remote_gzip_shards_inflate_and_raw_reads_do_not(plain: list[str], object_server) -> None:
    remote = pytest.importorskip("chute.remote")
    pytest.importorskip("obstore")
    packed = gzip.compress(Path(plain[0]).read_bytes())
    object_server.objects["/d/shard.tgz"] = packed
    with remote.RemoteSession(remote.RemoteOptions(range_bytes=16 << 10)) as session:
        # A tar shard read remotely is inflated as it arrives...
        samples = session.read_tar(f"{object_server.url}/d/shard.tgz")
        assert [key for key, _, _ in samples] == [f"sample{i:07d}" for i in range(100)]
        # ...while reading an object's bytes gives them as they are stored.
        assert session.read_bytes(f"{object_server.url}/d/shard.tgz") == packed
