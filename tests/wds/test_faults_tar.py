"""The fault catalogue for tar shards, through the public API.

Each bad input must give a clear exception that names the shard, the member
or sample and the byte offset under the default handler, and a counted skip
under ``ignore_and_continue``. The parser-level behaviour is in
test_tar_reader.py / test_decode.py; here the same faults travel through the
engine's threads, its error policy and the Python layer.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pytest
from conftest import jpeg_bytes, npy_bytes, png_bytes, write_shards
from helpers import assert_names, member_offsets, png_declaring

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

SKIP = wds.ignore_and_continue


def tuple_ds(urls: list[str], fields: str, handler: Any = wds.reraise_exception, **kw: Any) -> Any:
    # The handler covers the shard and, as the to_tuple's own, samples cut
    # short before the field.
    return chute.WebDataset(urls, shardshuffle=False, handler=handler, **kw).to_tuple(
        fields, handler=handler
    )


def image_ds(urls: list[str], handler: Any = wds.reraise_exception) -> Any:
    return (
        chute.WebDataset(urls, shardshuffle=False, handler=handler)
        .decode("rgb8")
        .to_tuple("__key__", "jpg;png", "cls")
    )


def npy_ds(urls: list[str], handler: Any = wds.reraise_exception) -> Any:
    return (
        chute.WebDataset(urls, shardshuffle=False, handler=handler)
        .decode()
        .to_tuple("__key__", "npy")
        .batched(2)
    )


def keys_of(ds: Any) -> list[str]:
    return [row[0] for row in ds]


def small_shard(tmp_path: Path, n: int = 4) -> Path:
    """n samples of (txt, cls), written by webdataset's TarWriter (PAX headers
    make every member two headers, so there are many boundaries)."""
    samples = [
        {"__key__": f"s{i:03d}", "txt": f"text {i}" * (i + 1), "cls": str(i)} for i in range(n)
    ]
    return Path(write_shards(tmp_path, samples, n, prefix="small")[0])


def raw_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return path


def fix_checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header[:512])


# ---------------------------------------------------------------- tar structure

_SMALL_CUTS: list[tuple[str, int]] = []


def _cut_points() -> list[tuple[str, int]]:
    """Every 512-byte boundary of a 4-sample TarWriter shard up to the end of
    its last member, and a point inside each block (computed once from a
    shard written into memory). The end-of-archive blocks and the record
    padding after them are not data: cutting there loses nothing."""
    import webdataset

    buf = io.BytesIO()
    with webdataset.TarWriter(buf) as sink:
        for i in range(4):
            sink.write({"__key__": f"s{i:03d}", "txt": f"text {i}" * (i + 1), "cls": str(i)})
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tf:
        last = tf.getmembers()[-1]
        end = last.offset_data + (last.size + 511) // 512 * 512
    cuts = [("boundary", b) for b in range(512, end, 512)]
    cuts += [("mid-block", b + 200) for b in range(0, end, 512)]
    return cuts


def webdataset_samples(url: str) -> list[dict[str, Any]]:
    """What webdataset yields from `url` under a handler that goes on: the
    reference for what a skipping chute pipeline delivers."""
    import webdataset

    ds = webdataset.WebDataset(
        url, shardshuffle=False, handler=webdataset.ignore_and_continue, empty_check=False
    )
    return list(ds)


def cut_cost(full: Path, cut: int, needed: str) -> tuple[bool, int]:
    """For the shard `full` cut at byte `cut` and read by a pipeline that
    needs member `needed` and goes on after errors: whether the cut is a
    clean end (EOF where a member's headers start, as tar reads it), and how
    many samples it costs. A sample cut short is delivered as read (webdataset
    yields it too); the cut costs one sample, that one (counted once, when
    to_tuple drops it for lacking `needed`) or, when nothing of it was read,
    the one it lost. A clean end costs what lacks `needed`."""
    with tarfile.open(full) as tf:
        members = [
            (m.name.split(".", 1)[0], m.name.split(".", 1)[1], m.offset, m.offset_data, m.size)
            for m in tf.getmembers()
        ]
    whole = [m for m in members if m[3] + m[4] <= cut]
    rest = members[len(whole) :]
    last = members[-1]
    clean = cut == rest[0][2] if rest else cut >= last[3] + (last[4] + 511) // 512 * 512
    groups: list[tuple[str, set[str]]] = []
    for key, ext, *_ in whole:
        if groups and groups[-1][0] == key:
            groups[-1][1].add(ext)
        else:
            groups.append((key, {ext}))
    lacking = sum(1 for _, exts in groups if needed not in exts)
    return clean, lacking if clean else 1


@pytest.mark.parametrize("kind,cut", _cut_points(), ids=lambda v: str(v))
def test_truncated_shard_every_boundary_and_mid_block(tmp_path: Path, kind: str, cut: int) -> None:
    good = small_shard(tmp_path)
    data = good.read_bytes()
    full = keys_of(tuple_ds([str(good)], "__key__ txt"))
    assert len(full) == 4
    path = tmp_path / f"cut{cut}.tar"
    path.write_bytes(data[:cut])
    clean, lost = cut_cost(good, cut, "txt")
    # Under a handler that goes on: what webdataset yields (the sample cut
    # short included, as read), of which to_tuple keeps those with a txt;
    # every sample lost is counted, once.
    expected = [s["__key__"] for s in webdataset_samples(str(path)) if "txt" in s]
    ds = tuple_ds([str(path), str(good)], "__key__ txt", handler=SKIP)
    assert keys_of(ds) == expected + full
    assert ds.stats()["samples_skipped"] == lost
    if clean:
        return
    # Under raise: the samples before the damage, then an error naming it.
    delivered: list[str] = []
    with pytest.raises(chute.DataError, match="truncated") as info:
        for row in tuple_ds([str(path)], "__key__ txt"):
            delivered.append(row[0])
    assert_names(str(info.value), str(path))
    assert delivered == expected[: len(delivered)]


def test_bad_header_checksum(tmp_path: Path) -> None:
    good = small_shard(tmp_path)
    data = bytearray(good.read_bytes())
    offset = member_offsets(good)["s002.cls"]  # its first (PAX) header
    data[offset + 5] ^= 0x20
    bad = tmp_path / "badsum.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(chute.DataError, match="bad header checksum") as info:
        list(tuple_ds([str(bad)], "__key__ txt"))
    assert_names(str(info.value), str(bad), f"offset {offset}")
    ds = tuple_ds([str(bad), str(good)], "__key__ txt", handler=SKIP)
    # s001 was still being grouped when the bad header came, and is
    # delivered as read (tarfile ends the archive there and webdataset yields
    # it too). What the header held cannot be told: one sample is counted.
    assert keys_of(ds) == ["s000", "s001", "s000", "s001", "s002", "s003"]
    assert ds.stats()["samples_skipped"] == 1


def test_non_tar_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"<html>403 Forbidden</html>" + bytes(range(256)) * 8)
    with pytest.raises(chute.DataError, match="bad header checksum") as info:
        list(tuple_ds([str(junk)], "__key__ txt"))
    assert_names(str(info.value), str(junk), "offset 0")
    good = small_shard(tmp_path)
    ds = tuple_ds([str(junk), str(good)], "__key__ txt", handler=SKIP)
    assert len(keys_of(ds)) == 4
    assert ds.stats()["samples_skipped"] == 1


def test_zero_length_shard(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(chute.DataError, match="empty") as info:
        list(tuple_ds([str(empty)], "__key__ txt"))
    assert_names(str(info.value), str(empty), "offset 0")
    good = small_shard(tmp_path)
    ds = tuple_ds([str(good), str(empty)], "__key__ txt", handler=SKIP)
    assert len(keys_of(ds)) == 4
    assert ds.stats()["samples_skipped"] == 1


def test_duplicate_keys_in_one_shard(tmp_path: Path) -> None:
    path = raw_tar(
        tmp_path / "dup.tar",
        [("a.txt", b"1"), ("a.cls", b"1"), ("b.txt", b"2"), ("b.cls", b"2"), ("b.txt", b"3")]
        + [("c.txt", b"4"), ("c.__key__", b"k"), ("c.cls", b"5")],
    )
    offsets = member_offsets(path)
    with pytest.raises(chute.DataError, match="duplicate file name") as info:
        list(tuple_ds([str(path)], "__key__ txt"))
    assert_names(str(info.value), str(path), "offset 4096")  # the second b.txt
    assert "b.txt" in str(info.value)
    # As webdataset under a handler that goes on: the repeat is left out, its
    # sample is delivered with the first one, and no sample is lost.
    ds = chute.WebDataset([str(path)], shardshuffle=False, handler=SKIP)
    got = [{k: v for k, v in s.items() if k != "__local_path__"} for s in ds]
    reference = [
        {k: v for k, v in s.items() if k != "__local_path__"} for s in webdataset_samples(str(path))
    ]
    assert got == reference
    assert [s["txt"] for s in got] == [b"1", b"2", b"4"]
    assert ds.stats()["samples_skipped"] == 0
    seen: list[str] = []
    handled = chute.WebDataset(
        [str(path)], shardshuffle=False, handler=lambda e: seen.append(str(e)) or True
    ).to_tuple("__key__", "txt")
    assert [k for k, _ in handled] == ["a", "b", "c"]
    assert len(seen) == 2 and "b.txt" in seen[0] and "c.__key__" in seen[1]
    assert f"offset {offsets['c.__key__']}" in seen[1]


def test_huge_declared_member_size(tmp_path: Path) -> None:
    path = raw_tar(tmp_path / "huge.tar", [("a.txt", b"x" * 10), ("b.txt", b"y" * 100)])
    data = bytearray(path.read_bytes())
    offset = member_offsets(path)["b.txt"]
    header = data[offset : offset + 512]
    header[124:136] = b"\x80" + (1 << 62).to_bytes(11, "big")  # base-256: 4 EiB
    fix_checksum(header)
    data[offset : offset + 512] = header
    path.write_bytes(bytes(data))
    start = time.monotonic()
    with pytest.raises(chute.DataError, match="truncated") as info:
        list(tuple_ds([str(path)], "__key__ txt"))
    assert time.monotonic() - start < 5  # no attempt to allocate or read 4 EiB
    assert_names(str(info.value), str(path), "member 'b.txt'")
    ds = tuple_ds([str(path)], "__key__ txt", handler=SKIP)
    assert keys_of(ds) == ["a"]
    assert ds.stats()["samples_skipped"] == 1


def test_shard_deleted_between_construction_and_iteration(tmp_path: Path) -> None:
    good = small_shard(tmp_path)
    doomed = tmp_path / "doomed.tar"
    doomed.write_bytes(good.read_bytes())
    ds = tuple_ds([str(doomed)], "__key__ txt")
    skipping = tuple_ds([str(doomed), str(good)], "__key__ txt", handler=SKIP)
    doomed.unlink()
    with pytest.raises(chute.ReadError, match="doomed.tar") as info:
        list(ds)
    assert isinstance(info.value, FileNotFoundError) or "No such file" in str(info.value)
    assert len(keys_of(skipping)) == 4
    assert skipping.stats()["samples_skipped"] == 1


def gnu_tar() -> bool:
    if shutil.which("tar") is None:
        return False
    version = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout
    return "GNU tar" in version


def _archive_body(data: bytes) -> bytes:
    """`data` (a tar archive) without its end-of-archive blocks, so that more
    members can follow."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        last = tf.getmembers()[-1]
        return data[: last.offset_data + (last.size + 511) // 512 * 512]


@pytest.mark.parametrize("threads", [1, 3])
def test_each_loss_is_counted_once_and_only_the_bad_sample_is_lost(
    tmp_path: Path, threads: int
) -> None:
    # GNU tar writes a sparse file, a FIFO, a symlink and a hard link among
    # good samples (webdataset expands the first and skips the others: no
    # loss); then a sample with a member whose sparse map is wrong (lost), a
    # corrupt JPEG (lost), a good sample, and a cut in the next sample (lost).
    if not gnu_tar():
        pytest.skip("needs GNU tar")
    rng = np.random.default_rng(7)
    root = tmp_path / "src"
    root.mkdir()
    names: list[str] = []
    for i in range(6):
        (root / f"s{i}.jpg").write_bytes(jpeg_bytes(rng, 12, 10))
        (root / f"s{i}.cls").write_bytes(str(i).encode())
        names += [f"s{i}.jpg", f"s{i}.cls"]
    with open(root / "s1.bin", "wb") as f:
        f.seek(100000)
        f.write(b"tail")
    os.mkfifo(root / "s2.fifo")
    os.symlink("s0.cls", root / "s3.link")
    os.link(root / "s0.cls", root / "s4.hard")
    names += ["s1.bin", "s2.fifo", "s3.link", "s4.hard"]
    names.sort()
    gnu = tmp_path / "gnu.tar"
    subprocess.run(
        ["tar", "--format=gnu", "--sparse", "-cf", str(gnu), "-C", str(root), *names], check=True
    )
    tail = io.BytesIO()
    with tarfile.open(fileobj=tail, mode="w", format=tarfile.PAX_FORMAT) as tf:

        def add(name: str, payload: bytes, pax: dict[str, str] | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            if pax:
                info.pax_headers = pax
            tf.addfile(info, io.BytesIO(payload))

        add("t0.bin", b"xyz", {"GNU.sparse.size": "10", "GNU.sparse.map": "0,99"})
        add("t0.cls", b"7")
        add("t0.jpg", jpeg_bytes(rng, 12, 10))
        add("t1.cls", b"8")
        add("t1.jpg", jpeg_bytes(rng, 12, 10)[:150])
        add("t2.cls", b"9")
        add("t2.jpg", jpeg_bytes(rng, 12, 10))
        add("t3.jpg", jpeg_bytes(rng, 12, 10))
    offset = len(_archive_body(gnu.read_bytes()))  # where t0.bin's PAX header lands
    body = _archive_body(gnu.read_bytes()) + _archive_body(tail.getvalue())
    tail.seek(0)
    with tarfile.open(fileobj=tail) as tf:
        t3 = tf.getmember("t3.jpg")
    path = tmp_path / "mixed.tar"
    # The cut falls inside t3.jpg, its sample's first member.
    path.write_bytes(body[: offset + t3.offset_data + 100])

    def pipeline(handler: Any) -> Any:
        return (
            chute.WebDataset([str(path)], shardshuffle=False, handler=handler, threads=threads)
            .decode("rgb8")
            .to_tuple("__key__", "jpg", "cls")
        )

    with pytest.raises(chute.DataError, match="t0.bin") as info:
        list(pipeline(wds.reraise_exception))
    assert_names(str(info.value), str(path), f"member 't0.bin' at offset {offset}")
    ds = pipeline(SKIP)
    assert [row[0] for row in ds] == [f"s{i}" for i in range(6)] + ["t2"]
    stats = ds.stats()
    assert stats["samples_skipped"] == 3
    assert stats["samples_yielded"] == 7


# Local shards read without a shuffle are parsed and decoded in place from a
# mapping. A cut leaves whole pages past the new end (SIGBUS, caught) and one
# page the end falls in, whose rest reads as zeros without any signal: small
# samples lie wholly inside it. The cut is never on a page boundary here.
TRUNCATION_CASES = [(200, 20000), (900, 300)]


@pytest.mark.parametrize(("count", "size"), TRUNCATION_CASES)
def test_shard_truncated_while_being_read(tmp_path: Path, count: int, size: int) -> None:
    samples = [{"__key__": f"k{i:04d}", "bin": os.urandom(size)} for i in range(count)]
    path = Path(write_shards(tmp_path, samples, count)[0])
    ds = chute.WebDataset([str(path)], shardshuffle=False, prefetch=1, threads=1)
    it = iter(ds.to_tuple("__key__", "bin").batched(4))
    next(it)
    os.truncate(path, os.path.getsize(path) // 3 + 100)
    with pytest.raises(chute.DataError, match="truncated") as info:
        for _ in it:
            pass
    assert_names(str(info.value), str(path))


def test_shard_cut_at_a_header_while_being_read_is_not_a_clean_end(tmp_path: Path) -> None:
    # Cut where a header begins (not on a page boundary): the rest of that page
    # reads as a zero block, which must not pass for the end of the archive.
    samples = [{"__key__": f"k{i:04d}", "bin": os.urandom(300)} for i in range(900)]
    path = Path(write_shards(tmp_path, samples, 900)[0])
    size = os.path.getsize(path)
    cut = min(o for o in member_offsets(path).values() if o > size // 3 and o % 4096 != 0)
    ds = chute.WebDataset([str(path)], shardshuffle=False, prefetch=1, threads=1)
    it = iter(ds.to_tuple("__key__", "bin").batched(4))
    next(it)
    os.truncate(path, cut)
    with pytest.raises(chute.DataError, match="truncated") as info:
        for _ in it:
            pass
    assert_names(str(info.value), str(path))


@pytest.mark.parametrize(("count", "size"), TRUNCATION_CASES)
def test_shard_truncated_while_being_read_is_skipped_without_zeros(
    tmp_path: Path, count: int, size: int
) -> None:
    # Under the skip policy the samples whose bytes were cut off are dropped
    # and counted, never delivered as zeros, and the shard does not end
    # silently where the zeros begin.
    payloads = {f"k{i:04d}": os.urandom(size) for i in range(count)}
    samples = [{"__key__": k, "bin": v} for k, v in payloads.items()]
    path = Path(write_shards(tmp_path, samples, count)[0])
    ds = (
        chute.WebDataset([str(path)], shardshuffle=False, prefetch=1, threads=1, handler=SKIP)
        .to_tuple("__key__", "bin")
        .batched(4)
    )
    it = iter(ds)
    delivered = list(zip(*next(it), strict=True))
    os.truncate(path, os.path.getsize(path) // 3 + 100)
    for keys, blobs in it:
        delivered.extend(zip(keys, blobs, strict=True))
    assert 4 <= len(delivered) < count
    for key, blob in delivered:
        assert blob == payloads[key], key
    assert ds.stats()["samples_skipped"] >= 1


# ---------------------------------------------------------------- pipes


def test_pipe_command_fails_midway(tmp_path: Path) -> None:
    good = small_shard(tmp_path)
    url = f"pipe:head -c 1500 {good}; echo 'bucket gone' >&2; exit 3"
    with pytest.raises((chute.ReadError, chute.DataError)) as info:
        list(tuple_ds([url], "__key__ txt"))
    assert url[5:] in str(info.value)
    ds = tuple_ds([url, str(good)], "__key__ txt", handler=SKIP)
    assert keys_of(ds)[-4:] == ["s000", "s001", "s002", "s003"]
    assert ds.stats()["samples_skipped"] == 1


def test_pipe_stalls_after_data_with_pipe_timeout(tmp_path: Path) -> None:
    good = small_shard(tmp_path)
    url = f"pipe:head -c 2560 {good}; sleep 30"
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"sleep 30.*offset 2560"):
        list(tuple_ds([url], "__key__ txt", pipe_timeout=0.3))
    ds = tuple_ds([url, str(good)], "__key__ txt", handler=SKIP, pipe_timeout=0.3)
    assert keys_of(ds) == ["s000", "s001", "s002", "s003"]
    # s000 arrived cut short (its cls, not its txt): to_tuple drops it, the
    # one sample the stall cost.
    assert ds.stats()["samples_skipped"] == 1
    assert time.monotonic() - start < 5


# ---------------------------------------------------------------- images


def jpeg_declaring(height: int, width: int) -> bytes:
    data = bytearray(jpeg_bytes(np.random.default_rng(0), 16, 16))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def image_shard(tmp_path: Path, bad: dict[str, bytes], n: int = 8) -> tuple[str, list[str]]:
    """n image samples; sample i gets bad[...] as its image instead."""
    rng = np.random.default_rng(1)
    samples: list[dict[str, object]] = []
    for i in range(n):
        ext = "png" if i % 2 else "jpg"
        payload = png_bytes(rng, 12, 10) if ext == "png" else jpeg_bytes(rng, 12, 10)
        samples.append({"__key__": f"im{i:02d}", ext: payload, "cls": str(i)})
    bad_keys = []
    for j, (ext, payload) in enumerate(bad.items()):
        i = 1 + 2 * j
        samples[i] = {"__key__": f"im{i:02d}", ext.split(":")[0]: payload, "cls": str(i)}
        bad_keys.append(f"im{i:02d}")
    return write_shards(tmp_path, samples, n, prefix="img")[0], bad_keys


def _good_jpeg() -> bytes:
    return jpeg_bytes(np.random.default_rng(5), 40, 30)


def _good_png() -> bytes:
    return png_bytes(np.random.default_rng(5), 40, 30)


def _png_bad_idat() -> bytes:
    data = bytearray(_good_png())
    idat = data.index(b"IDAT")
    data[idat + 12 : idat + 30] = b"\xa5" * 18
    return bytes(data)


BAD_IMAGES: dict[str, tuple[str, Any, str]] = {
    # name: (extension, payload factory, what the message must say)
    "jpeg-truncated-body": ("jpg", lambda: _good_jpeg()[: len(_good_jpeg()) * 2 // 3], ""),
    "jpeg-truncated-header": ("jpg", lambda: _good_jpeg()[:40], ""),
    "jpeg-garbage": ("jpg", lambda: b"\xff\xd8\xff" + bytes(range(256)) * 4, ""),
    "png-truncated": ("png", lambda: _good_png()[: len(_good_png()) // 2], ""),
    "png-corrupt-idat": ("png", _png_bad_idat, ""),
    "png-0x0": ("png", lambda: png_declaring(0, 0), ""),
    "jpeg-0x0": ("jpg", lambda: jpeg_declaring(0, 0), ""),
    "png-60000x60000": ("png", lambda: png_declaring(60000, 60000), "limit"),
    "jpeg-60000x60000": ("jpg", lambda: jpeg_declaring(60000, 60000), "limit"),
}


@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_bad_image(tmp_path: Path, name: str) -> None:
    ext, make, words = BAD_IMAGES[name]
    url, (bad_key,) = image_shard(tmp_path, {ext: make()})
    offset = member_offsets(Path(url))[f"{bad_key}.{ext}"]
    with pytest.raises(chute.DataError) as info:
        list(image_ds([url]))
    message = str(info.value)
    assert_names(message, url, f"member '{bad_key}.{ext}' at offset {offset}")
    assert words in message
    ds = image_ds([url], handler=SKIP)
    rows = list(ds)
    assert [r[0] for r in rows] == [f"im{i:02d}" for i in range(8) if f"im{i:02d}" != bad_key]
    # No silent zero rows: every delivered image is a real decode.
    assert all(r[1].shape == (12, 10, 3) and r[1].any() for r in rows)
    assert ds.stats()["samples_skipped"] == 1


def test_handler_stop_on_a_batch_of_only_bad_rows(tmp_path: Path) -> None:
    # Every row of the first batch fails to decode: the batch is empty and is
    # not yielded, but the handler still sees the failures and its "stop"
    # ends the iteration before the good second batch.
    cut = _good_jpeg()[: len(_good_jpeg()) * 2 // 3]  # header intact: fails when decoded
    samples = [
        {"__key__": f"im{i:02d}", "jpg": cut if i < 4 else _good_jpeg(), "cls": i} for i in range(8)
    ]
    urls = write_shards(tmp_path, samples, 8)
    seen: list[str] = []

    def stop_at_first(exn: Exception) -> bool:
        seen.append(str(exn))
        return False

    ds = (
        chute.WebDataset(urls, shardshuffle=False, handler=stop_at_first, threads=1, prefetch=1)
        .decode("rgb8")
        .to_tuple("jpg", "cls")
        .batched(4)
    )
    assert list(ds) == []
    assert len(seen) == 1 and "im00" in seen[0]


def test_bad_images_in_batches_drop_rows_not_batches(tmp_path: Path) -> None:
    url, bad_keys = image_shard(
        tmp_path, {"jpg": _good_jpeg()[:300], "png:2": png_declaring(60000, 60000)}
    )
    ds = (
        chute.WebDataset([url], shardshuffle=False, handler=SKIP)
        .decode("rgb8")
        .to_tuple("__key__", "jpg;png")
        .batched(4)
    )
    batches = list(ds)
    keys = [k for b in batches for k in b[0]]
    assert sorted(keys) == [f"im{i:02d}" for i in range(8) if f"im{i:02d}" not in bad_keys]
    assert sum(len(b[0]) for b in batches) == sum(b[1].shape[0] for b in batches) == 6
    assert all(b[1].reshape(b[1].shape[0], -1).any(axis=1).all() for b in batches)
    assert ds.stats()["samples_skipped"] == 2


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_batch_error_names_its_first_bad_row_whatever_the_thread_count(
    tmp_path: Path, threads: int
) -> None:
    # Decode threads share a batch's rows; the error must still be the first
    # failing row's, not whichever thread failed first.
    rng = np.random.default_rng(3)
    samples: list[dict[str, object]] = [
        {"__key__": f"im{i:02d}", "jpg": jpeg_bytes(rng, 480, 480), "cls": str(i)}
        for i in range(32)
    ]
    # Row 5 fails late (cut near its end), row 6 at once (cut right after its
    # scan header): with several threads, row 6's failure is found first. The
    # images are large enough (> 64 KiB) to be decoded one row per piece.
    late = jpeg_bytes(rng, 480, 480)
    early = jpeg_bytes(rng, 480, 480)
    assert min(len(late), len(early)) > 64 << 10
    samples[5]["jpg"] = late[: len(late) * 19 // 20]
    samples[6]["jpg"] = early[: early.index(b"\xff\xda") + 40]
    samples[30]["jpg"] = early[: early.index(b"\xff\xda") + 40]
    url = write_shards(tmp_path, samples, 32, prefix="rows")[0]
    offset = member_offsets(Path(url))["im05.jpg"]
    ds = (
        chute.WebDataset([url], shardshuffle=False, threads=threads)
        .decode("rgb8")
        .to_tuple("jpg", "cls")
        .batched(32)
    )
    for _ in range(5):
        with pytest.raises(chute.DataError) as info:
            list(ds)
        assert_names(str(info.value), url, f"member 'im05.jpg' at offset {offset}")


# ---------------------------------------------------------------- npy


def _npy_with_header(header: str, payload: bytes = b"\x00" * 16) -> bytes:
    body = header.encode("latin1")
    total = 10 + len(body) + 1
    body += b" " * ((64 - total % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + payload


BAD_NPY: dict[str, tuple[bytes, str]] = {
    "bad-magic": (b"\x93NUMPZ" + npy_bytes(np.zeros(4, "f4"))[6:], "magic"),
    "bad-header": (_npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4,"), ""),
    "object-dtype": (npy_bytes(np.array([1, "a"], dtype=object)), "object"),
    "shape-overflow": (
        _npy_with_header(
            "{'descr': '<f8', 'fortran_order': False, "
            "'shape': (4294967296, 4294967296, 4294967296)}"
        ),
        "",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_NPY))
def test_bad_npy(tmp_path: Path, name: str) -> None:
    payload, words = BAD_NPY[name]
    samples: list[dict[str, object]] = [
        {"__key__": f"n{i}", "npy": npy_bytes(np.full(4, i, "f4"))} for i in range(5)
    ]
    samples[2]["npy"] = payload
    url = write_shards(tmp_path, samples, 5, prefix="npy")[0]
    offset = member_offsets(Path(url))["n2.npy"]
    with pytest.raises(chute.DataError) as info:
        list(npy_ds([url]))
    message = str(info.value)
    assert_names(message, url, f"member 'n2.npy' at offset {offset}")
    assert words.lower() in message.lower()
    ds = npy_ds([url], handler=SKIP)
    batches = list(ds)
    assert [list(k) for k, _ in batches] == [["n0", "n1"], ["n3", "n4"]]
    np.testing.assert_array_equal(batches[1][1][:, 0], [3.0, 4.0])
    assert ds.stats()["samples_skipped"] == 1


def test_read_tar_bytes_matches_the_file_reader(tmp_path: Path) -> None:
    # The in-memory entry point the fuzzer drives must be the same parser.
    from chute import _core

    good = small_shard(tmp_path)
    data = good.read_bytes()
    assert _core.read_tar_bytes(data, str(good)) == _core.read_tar_samples(str(good))
    with pytest.raises(chute.DataError, match=r"'mem.tar'.*offset 1024"):
        _core.read_tar_bytes(data[:1100], "mem.tar")
