"""The engine's tar reader against webdataset's own grouping, plus bad input and pipe: sources."""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import webdataset as wds
from chute import _core
from webdataset import tariterators

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

DataError = _core.DataError
ReadError = _core.ReadError


# ---------------------------------------------------------------- helpers


def wds_samples(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    """Samples as webdataset 1.0.2 groups them (its own tarfile-based chain)."""
    out = []
    # url_opener would leave the file for the garbage collector (a ResourceWarning).
    with open(path, "rb") as stream:
        files = tariterators.tar_file_expander([{"url": str(path), "stream": stream}])
        for sample in tariterators.group_by_keys(files):
            fields = {k: v for k, v in sample.items() if k not in ("__key__", "__url__")}
            out.append((sample["__key__"], fields))
    return out


def chute_samples(url: str, **kw) -> list[tuple[str, dict[str, bytes]]]:
    return [(key, fields) for key, fields, _ in _core.read_tar_samples(url, **kw)]


def assert_same_as_webdataset(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    ours = chute_samples(str(path))
    theirs = wds_samples(path)
    assert ours == theirs
    return ours


def random_payloads(rng: random.Random, n: int) -> list[dict[str, bytes]]:
    samples = []
    for _ in range(n):
        samples.append(
            {
                "bin": rng.randbytes(rng.choice([0, 1, 511, 512, 513, 3000])),
                "cls": str(rng.randrange(10)).encode(),
                "json": b'{"a": %d}' % rng.randrange(1000),
            }
        )
    return samples


def write_tarfile(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT):
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tf.addfile(info, io.BytesIO(data))


def simple_shard(tmp_path: Path, n: int = 6, name: str = "shard.tar") -> Path:
    rng = random.Random(1)
    path = tmp_path / name
    members = []
    for i in range(n):
        members.append((f"s{i:04d}.bin", rng.randbytes(700)))
        members.append((f"s{i:04d}.cls", str(i).encode()))
    write_tarfile(path, members, fmt=tarfile.USTAR_FORMAT)
    return path


def check_error_names(exc: BaseException, url: str, offset: int | None = None) -> None:
    msg = str(exc)
    assert url in msg, msg
    assert "offset" in msg, msg
    if offset is not None:
        assert f"offset {offset}" in msg, msg


def needs_gnu_tar() -> None:
    if shutil.which("tar") is None:
        pytest.skip("no tar binary")
    version = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout
    if "GNU tar" not in version:
        pytest.skip("tar is not GNU tar")


# ---------------------------------------------------------------- writers


def test_webdataset_tarwriter_pax(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "tw.tar"
    payloads = random_payloads(rng, 40)
    with wds.TarWriter(str(path)) as sink:  # float mtime: a PAX header per member
        for i, fields in enumerate(payloads):
            sink.write({"__key__": f"dir/sample{i:05d}", **fields})
    ours = assert_same_as_webdataset(path)
    assert len(ours) == 40
    assert ours[3] == ("dir/sample00003", payloads[3])
    members = [(n, h, s) for n, h, _, s, _, _ in _core.list_tar_payloads(str(path))]
    assert len(members) == 120
    with tarfile.open(path) as tf:
        infos = tf.getmembers()
    assert [(m.name, m.offset, m.size) for m in infos] == members


def test_webdataset_shardwriter(tmp_path):
    rng = random.Random(2)
    pattern = str(tmp_path / "part-%03d.tar")
    payloads = random_payloads(rng, 25)
    with wds.ShardWriter(pattern, maxcount=10, verbose=0) as sink:
        for i, fields in enumerate(payloads):
            sink.write({"__key__": f"k{i:03d}", **fields})
    shards = sorted(tmp_path.glob("part-*.tar"))
    assert len(shards) == 3
    total = []
    for shard in shards:
        total += assert_same_as_webdataset(shard)
    assert [k for k, _ in total] == [f"k{i:03d}" for i in range(25)]


def test_python_tarfile_formats_and_odd_names(tmp_path):
    long_dir = "d" * 60 + "/" + "e" * 70
    names = [
        ("a.txt", b"1"),
        ("a.JSON", b"2"),  # extension lowercased
        ("b.tar.gz", b"3"),  # extension is everything after the first dot
        ("noext", b"skipped"),
        ("dir.with.dots/c.x.y", b"4"),
        ("dir.with.dots/c.z", b"5"),
        ("x/.hidden.txt", b"6"),  # regex backtracks: key "x/", extension "hidden.txt"
        ("x.y/.hidden", b"7"),  # no match: skipped
        ("__meta__", b"m"),
        ("__meta__/inside.txt", b"m2"),
        ("__k__.txt", b"8"),  # not metadata
        (f"{long_dir}/f.bin", b"9" * 1000),
        (f"{long_dir}/f.cls", b"10"),
        ("ünï/cødé.txt", "héllo".encode()),
        ("z.txt", b""),
        ("z.empty", b""),
    ]
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        path = tmp_path / f"odd-{fmt}.tar"
        write_tarfile(path, names, fmt=fmt)
        ours = assert_same_as_webdataset(path)
        keys = [k for k, _ in ours]
        assert "x/" in keys and "__k__" in keys and f"{long_dir}/f" in keys
        assert "noext" not in keys and "__meta__" not in keys
    path = tmp_path / "ustar.tar"  # prefix field for the long path
    write_tarfile(path, [n for n in names if not n[0].startswith("ü")], fmt=tarfile.USTAR_FORMAT)
    assert_same_as_webdataset(path)


def test_python_tarfile_dirs_links_and_global_header(tmp_path):
    path = tmp_path / "mixed.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "c1"}) as tf:
        for name, kind in [
            ("d", tarfile.DIRTYPE),
            ("d/a.txt", None),
            ("d/a.lnk", tarfile.SYMTYPE),
            ("d/a.hard", tarfile.LNKTYPE),
            ("d/a.fifo", tarfile.FIFOTYPE),
            ("d/a.cls", None),
        ]:
            info = tarfile.TarInfo(name)
            if kind is None:
                data = name.encode() * 3
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                info.type = kind
                info.linkname = "d/a.txt"
                tf.addfile(info)
    ours = assert_same_as_webdataset(path)
    assert ours == [("d/a", {"txt": b"d/a.txt" * 3, "cls": b"d/a.cls" * 3})]


def fix_checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block[:512])


def test_pax_path_and_size_override_the_header(tmp_path):
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("plain.bin")
        info.size = 700
        info.pax_headers = {"path": "renamed/x.bin/", "size": "700"}
        tf.addfile(info, io.BytesIO(b"p" * 700))
        info = tarfile.TarInfo("renamed/x.cls")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"7"))
    data = bytearray(path.read_bytes())
    pax_data_blocks = 1
    header = 512 * (1 + pax_data_blocks)
    block = data[header : header + 512]
    assert bytes(block[:9]) == b"plain.bin"
    block[124:136] = b"%011o\0" % 3  # the PAX size must win over this
    fix_checksum(block)
    data[header : header + 512] = block
    path.write_bytes(bytes(data))
    assert assert_same_as_webdataset(path) == [("renamed/x", {"bin": b"p" * 700, "cls": b"7"})]


@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar", "v7"])
def test_gnu_tar_formats(tmp_path, fmt):
    needs_gnu_tar()
    rng = random.Random(3)
    root = tmp_path / "src"
    deep = "sub/" + "long_directory_name_" * 4 + "/more"
    for rel in [f"{deep}/item", "top/item2", "top/item3"]:
        d = root / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        for ext in ["jpg", "cls"]:
            (root / f"{rel}.{ext}").write_bytes(rng.randbytes(rng.randrange(0, 3000)))
    (root / "emptydir").mkdir()
    os.symlink("top/item2.cls", root / "link.cls")
    if fmt in ("gnu", "pax"):  # names > 100 bytes need L records or PAX path
        long_name = root / "top" / ("n" * 120 + ".txt")
        long_name.write_bytes(b"long")
    path = tmp_path / f"gnu-{fmt}.tar"
    subprocess.run(
        ["tar", f"--format={fmt}", "--sort=name", "-cf", str(path), "-C", str(root), "."],
        check=True,
    )
    ours = assert_same_as_webdataset(path)
    assert any(k.endswith("/item") for k, _ in ours)


def write_special_tree(root: Path, rng: random.Random) -> list[str]:
    """Files for samples s0..s6 that tar writes as members webdataset
    expands (sparse files) or skips (a FIFO, a symlink, a hard link, a
    character device when we may make one); returns the names in order."""
    root.mkdir(parents=True, exist_ok=True)
    names: list[str] = []

    def add(name: str, data: bytes | None = None) -> None:
        if data is not None:
            (root / name).write_bytes(data)
        names.append(name)

    add("s0.cls", b"0")
    add("s0.txt", b"zero")
    with open(root / "s1.bin", "wb") as f:  # holes between regions, and at the end
        for i in range(7):
            f.seek(i * 70000 + 13)
            f.write(rng.randbytes(3000 + i))
        f.truncate(7 * 70000 + 20000)
    add("s1.bin")
    add("s1.cls", b"1")
    with open(root / "s2.bin", "wb") as f:  # only a hole
        f.truncate(50000)
    add("s2.bin")
    add("s2.cls", b"2")
    os.mkfifo(root / "s3.fifo")
    add("s3.fifo")
    add("s3.cls", b"3")
    os.symlink("s0.cls", root / "s4.link")
    add("s4.link")
    add("s4.cls", b"4")
    os.link(root / "s0.txt", root / "s5.hard")
    add("s5.hard")
    add("s5.cls", b"5")
    try:
        os.mknod(root / "s6.dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        add("s6.dev")
    except PermissionError:
        pass
    add("s6.cls", b"6")
    return names


@pytest.mark.parametrize(
    "fmt,sparse_version",
    [("gnu", None), ("oldgnu", None), ("pax", "0.0"), ("pax", "0.1"), ("pax", "1.0")],
)
def test_gnu_tar_sparse_files_fifos_links_and_devices(tmp_path, fmt, sparse_version):
    # webdataset expands sparse files (tarfile reads them as regular files)
    # and skips what is not a regular file; so does the reader.
    needs_gnu_tar()
    root = tmp_path / "src"
    names = write_special_tree(root, random.Random(5))
    path = tmp_path / "special.tar"
    extra = [f"--sparse-version={sparse_version}"] if sparse_version else []
    subprocess.run(
        ["tar", f"--format={fmt}", "--sparse", *extra, "-cf", str(path), "-C", str(root), *names],
        check=True,
    )
    with tarfile.open(path) as tf:
        assert any(m.sparse is not None for m in tf.getmembers())  # tar did write sparse members
    ours = assert_same_as_webdataset(path)
    assert [k for k, _ in ours] == [f"s{i}" for i in range(7)]
    fields = dict(ours)
    assert fields["s1"]["bin"] == (root / "s1.bin").read_bytes()
    assert fields["s2"]["bin"] == bytes(50000)
    assert fields["s3"] == {"cls": b"3"}


# ---------------------------------------------------------------- bad input


def test_truncated_at_every_header_boundary_and_mid_member(tmp_path):
    good = simple_shard(tmp_path, n=4)
    data = good.read_bytes()
    headers = [m[1] for m in _core.list_tar_payloads(str(good))]
    end_of_members = headers[-1] + 512 + 512  # last member: header + one data block
    cuts = {("header", h) for h in headers[1:]}  # EOF on a boundary: a clean end, not an error
    cuts |= {("mid-header", h + 100) for h in headers}
    cuts |= {("mid-data", h + 512 + 300) for h in headers}
    cuts |= {("padding", headers[0] + 512 + 700)}
    for kind, cut in sorted(cuts, key=lambda c: c[1]):
        path = tmp_path / f"cut-{cut}.tar"
        path.write_bytes(data[:cut])
        if kind == "header":
            # tar and tarfile both accept EOF on a block boundary as the end.
            whole = [k for k, _ in chute_samples(str(path))]
            assert whole == [k for k, _ in wds_samples(path)]
            continue
        with pytest.raises(DataError, match="truncated") as ei:
            _core.read_tar_samples(str(path))
        check_error_names(ei.value, str(path))
        assert str(cut) in str(ei.value)
        if kind != "mid-header":
            assert "member 's00" in str(ei.value)
    assert cut < end_of_members


def test_bad_checksum(tmp_path):
    good = simple_shard(tmp_path)
    data = bytearray(good.read_bytes())
    second = _core.list_tar_payloads(str(good))[1][1]
    data[second + 10] ^= 0x01  # inside the name field
    path = tmp_path / "badsum.tar"
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="bad header checksum") as ei:
        _core.read_tar_samples(str(path))
    check_error_names(ei.value, str(path), second)


def test_signed_checksum_accepted(tmp_path):
    # Old tars summed the header as signed chars; a high-bit name makes the sums differ.
    path = tmp_path / "signed.tar"
    write_tarfile(path, [("\u00e9t\u00e9.txt", b"x")], fmt=tarfile.GNU_FORMAT)
    data = bytearray(path.read_bytes())
    signed = sum((b - 256 if b > 127 else b) for b in data[:148] + b" " * 8 + data[156:512])
    data[148:156] = b"%06o\0 " % signed
    path.write_bytes(bytes(data))
    assert chute_samples(str(path)) == [("\u00e9t\u00e9", {"txt": b"x"})]


def test_non_tar_file(tmp_path):
    path = tmp_path / "junk.tar"
    path.write_bytes(random.Random(4).randbytes(5000))
    with pytest.raises(DataError, match="bad header checksum") as ei:
        _core.read_tar_samples(str(path))
    check_error_names(ei.value, str(path), 0)


def test_zero_length_file_is_an_error_like_tar_and_webdataset(tmp_path):
    path = tmp_path / "empty.tar"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="empty") as ei:
        _core.read_tar_samples(str(path))
    check_error_names(ei.value, str(path), 0)
    with pytest.raises(tarfile.ReadError, match="empty file"):
        wds_samples(path)


def test_end_of_archive_only(tmp_path):
    path = tmp_path / "eoa.tar"
    with tarfile.open(path, "w"):
        pass
    assert chute_samples(str(path)) == [] == wds_samples(path)


def test_duplicate_extension(tmp_path):
    path = tmp_path / "dup.tar"
    write_tarfile(path, [("a.txt", b"1"), ("a.cls", b"2"), ("a.TXT", b"3")])
    offset = _core.list_tar_payloads(str(path))[2][1]
    with pytest.raises(DataError, match="duplicate file name") as ei:
        _core.read_tar_samples(str(path))
    check_error_names(ei.value, str(path), offset)
    assert "a.TXT" in str(ei.value)
    with pytest.raises(ValueError, match="duplicate file name"):
        wds_samples(path)


def test_non_consecutive_key_is_a_new_sample(tmp_path):
    path = tmp_path / "split.tar"
    write_tarfile(path, [("a.txt", b"1"), ("b.txt", b"2"), ("a.cls", b"3")])
    assert [k for k, _ in assert_same_as_webdataset(path)] == ["a", "b", "a"]


def test_huge_declared_size(tmp_path):
    path = tmp_path / "huge.tar"
    write_tarfile(path, [("a.txt", b"x" * 100)], fmt=tarfile.GNU_FORMAT)
    data = bytearray(path.read_bytes())
    data[124:136] = b"\x80" + (1 << 60).to_bytes(11, "big")  # base-256: 1 EiB
    fix_checksum(data)
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="truncated") as ei:
        _core.read_tar_samples(str(path))
    check_error_names(ei.value, str(path))
    assert "member 'a.txt'" in str(ei.value)


def test_base256_size_is_read(tmp_path):
    path = tmp_path / "b256.tar"
    write_tarfile(path, [("a.txt", b"y" * 700)], fmt=tarfile.GNU_FORMAT)
    data = bytearray(path.read_bytes())
    data[124:136] = b"\x80" + (700).to_bytes(11, "big")
    fix_checksum(data)
    path.write_bytes(bytes(data))
    assert chute_samples(str(path)) == [("a", {"txt": b"y" * 700})] == wds_samples(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.tar"
    with pytest.raises(ReadError, match="No such file") as ei:
        _core.read_tar_samples(str(path))
    assert str(path) in str(ei.value)
    with pytest.raises(ReadError):
        _core.read_tar_samples("file:" + str(path))


def test_file_url_prefix(tmp_path):
    path = simple_shard(tmp_path)
    assert chute_samples("file:" + str(path)) == chute_samples(str(path))
    assert chute_samples("file://" + str(path)) == chute_samples(str(path))


# ---------------------------------------------------------------- pipe:


def test_pipe_cat_equals_file(tmp_path):
    path = simple_shard(tmp_path)
    assert _core.read_tar_samples(f"pipe:cat '{path}'") == _core.read_tar_samples(str(path))


def test_pipe_failure_reports_status_and_stderr():
    url = "pipe:sh -c 'echo oops >&2; exit 3'"
    with pytest.raises(ReadError, match="status 3") as ei:
        _core.read_tar_samples(url)
    assert "oops" in str(ei.value)


def test_pipe_failure_after_data(tmp_path):
    path = simple_shard(tmp_path)
    with pytest.raises(ReadError, match="status 7"):
        _core.read_tar_samples(f"pipe:cat '{path}'; echo late >&2; exit 7")


def test_pipe_timeout():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="sleep 30"):
        _core.read_tar_samples("pipe:sleep 30", pipe_timeout_s=0.5)
    assert time.monotonic() - t0 < 3


def test_pipe_large_stderr_does_not_deadlock(tmp_path):
    path = simple_shard(tmp_path)
    url = f"pipe:head -c 300000 /dev/zero | tr '\\0' x >&2; cat '{path}'"
    assert chute_samples(url, pipe_timeout_s=10) == chute_samples(str(path))


def test_pipe_cache(tmp_path):
    src = simple_shard(tmp_path)
    cache = tmp_path / "cache" / "nested"
    url = f"pipe:cat {src}"
    first = _core.read_tar_samples(url, cache_dir=str(cache))
    name = _core.tar_cache_file_name(url)
    assert name.endswith("-shard.tar") and len(name) == len("0123456789abcdef-shard.tar")
    assert [p.name for p in cache.iterdir()] == [name]
    assert (cache / name).read_bytes() == src.read_bytes()
    src.unlink()
    assert _core.read_tar_samples(url, cache_dir=str(cache)) == first
    assert _core.tar_cache_file_name(url + " ") != name


def test_failed_pipe_leaves_no_cache_file(tmp_path):
    src = simple_shard(tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(ReadError):
        _core.read_tar_samples(f"pipe:cat {src}; exit 1", cache_dir=str(cache))
    with pytest.raises(DataError):
        _core.read_tar_samples(f"pipe:head -c 1000 {src}", cache_dir=str(cache))
    with pytest.raises(TimeoutError):
        _core.read_tar_samples(
            f"pipe:cat {src}; sleep 30", cache_dir=str(cache), pipe_timeout_s=0.3
        )
    assert list(cache.iterdir()) == []


def test_unsupported_scheme():
    with pytest.raises(ValueError, match="pipe:curl"):
        _core.read_tar_samples("https://example.com/a.tar")


def test_no_fd_or_process_leak(tmp_path):
    src = simple_shard(tmp_path)
    truncated = tmp_path / "t.tar"
    truncated.write_bytes(src.read_bytes()[:1500])
    urls = [
        str(src),
        str(truncated),
        str(tmp_path / "missing.tar"),
        f"pipe:cat {src}",
        f"pipe:cat {truncated}",
        "pipe:echo bad >&2; exit 2",
        "pipe:cat /dev/zero",  # stops early at the end-of-archive block: child must be killed
    ]
    before = len(os.listdir("/proc/self/fd"))
    # Children started before (a forkserver of earlier tests' workers) stay.
    children_path = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    children_before = children_path.read_text().split()
    for i in range(50):
        url = urls[i % len(urls)]
        with contextlib.suppress(DataError, ReadError):
            _core.read_tar_samples(url, cache_dir=str(tmp_path / "c") if i % 2 else "")
    assert len(os.listdir("/proc/self/fd")) == before
    assert children_path.read_text().split() == children_before


def _write_bad_first_sample(path, with_a_cls):
    """A shard whose first sample has a member with a wrong sparse map
    (a.bin, and a.cls when asked), then sample b (txt, cls)."""
    members = [("a.bin", b"xyz", {"GNU.sparse.size": "10", "GNU.sparse.map": "0,99"})]
    if with_a_cls:
        members.append(("a.cls", b"1", None))
    members += [("b.txt", b"t", None), ("b.cls", b"2", None)]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, payload, pax in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            if pax:
                info.pax_headers = pax
            tf.addfile(info, io.BytesIO(payload))


def test_peek_passes_over_errors_only_when_asked(tmp_path):
    # The first sample has a member whose sparse map is wrong: a reader that
    # goes on skips it, and the peek can do the same.
    path = tmp_path / "bad-first.tar"
    _write_bad_first_sample(path, with_a_cls=True)
    with pytest.raises(DataError, match="a.bin"):
        _core.peek_tar_sample(str(path))
    assert _core.peek_tar_sample(str(path), skip_errors=True) == ["txt", "cls"]
    # Cut inside the first sample's second member: its first member is what
    # a reader that goes on delivers; cut inside its first, nothing.
    good = tmp_path / "good.tar"
    with tarfile.open(good, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name in ["a.txt", "a.cls"]:
            info = tarfile.TarInfo(name)
            info.size = 700
            tf.addfile(info, io.BytesIO(b"x" * 700))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(good.read_bytes()[: 1536 + 512 + 100])
    assert _core.peek_tar_sample(str(cut), skip_errors=True) == ["txt"]
    cut.write_bytes(good.read_bytes()[:600])
    assert _core.peek_tar_sample(str(cut), skip_errors=True) is None
    with pytest.raises(DataError, match="truncated"):
        _core.peek_tar_sample(str(cut))


def test_dict_pipeline_under_a_skip_handler_peeks_past_a_bad_first_sample(tmp_path):
    import chute.wds as cwds

    path = tmp_path / "bad-first.tar"
    _write_bad_first_sample(path, with_a_cls=False)
    other = tmp_path / "other.tar"
    with tarfile.open(other, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name in ["c.json", "c.cls"]:
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"{}"))
    urls = [str(path), str(other)]
    skipping = cwds.WebDataset(urls, shardshuffle=False, handler=cwds.warn_and_continue)
    assert skipping.first_sample_extensions(urls)[:2] == ["txt", "cls"]
    raising = cwds.WebDataset(urls, shardshuffle=False)
    assert raising.first_sample_extensions(urls)[:2] == ["json", "cls"]  # left to the engine
