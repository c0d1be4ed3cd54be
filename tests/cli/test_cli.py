"""The `chute` command line: every verb on good and bad input, exit codes, and
the sidecar index checked against tarfile and against the engine's reader."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from chute import _core
from chute.cli import main
from chute.kinds import file_formats
from chute.sources.tarindex import index_path, read_index
from conftest import npy_bytes
from helpers import child_env


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def webdataset_split(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member by webdataset's own code (tar_file_iterator
    drops metadata members, group_by_keys splits with base_plus_ext and
    lowercases), or None for a member it drops."""
    from webdataset.tariterators import base_plus_ext, meta_prefix, meta_suffix

    if "/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix):
        return None
    if re.match(r"__[^/]*__($|/)", name):
        return None
    key, ext = base_plus_ext(name)
    return None if key is None else (key, ext.lower())


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def odd_shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PAX long names, a member without extension, a metadata member, a
    multi-dot extension and an upper-case one: the offsets and grouping rules
    that a naive index would get wrong."""
    path = tmp_path_factory.mktemp("odd") / "odd.tar"
    long_dir = "d" * 120
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "__meta__", b"{}")
        _add(tar, "a/s1.cls", b"1")
        _add(tar, "a/s1.feat.npy", npy_bytes(np.arange(6, dtype=np.int16).reshape(2, 3)))
        _add(tar, "README", b"no extension")
        _add(tar, f"{long_dir}/s2.CLS", b"2")
        _add(tar, f"{long_dir}/s2.txt", "ü".encode() * 300)
        _add(tar, "s3.cls", b"")
    return path


# ---------------------------------------------------------------- index


def test_index_matches_tarfile_and_engine(odd_shard: Path, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run(capsys, "index", str(odd_shard))
    assert code == 0
    assert "3 samples" in out
    doc = read_index(odd_shard)
    assert doc["format"] == "chute-tar-index" and doc["version"] == 2
    assert doc["shard"] == os.path.abspath(odd_shard)
    assert re.fullmatch("[0-9a-f]{16}", doc["headers_digest"]) and doc["shard_version"] == ""
    assert doc["shard_size"] == odd_shard.stat().st_size

    # Every indexed member's offset/size is where tarfile finds its payload, and
    # its header offset where tarfile finds its first header (extension headers included).
    with tarfile.open(odd_shard) as tar:
        by_name = {m.name: m for m in tar.getmembers() if m.isfile()}
        headers = {m.offset: m for m in by_name.values()}
        raw = odd_shard.read_bytes()
        indexed = [(s["key"], m) for s in doc["samples"] for m in s["members"]]
        expected = []
        for m in by_name.values():
            split = webdataset_split(m.name)
            if split is not None:
                expected.append((split[0], [split[1], m.offset_data, m.size, m.offset]))
        assert sorted(indexed, key=str) == sorted(expected, key=str)
        for _, (ext, offset, size, _header) in indexed:
            member = next(m for m in by_name.values() if m.offset_data == offset)
            payload = tar.extractfile(member)
            assert payload is not None
            assert raw[offset : offset + size] == payload.read()
            assert ext == member.name.split("/")[-1].split(".", 1)[1].lower()
        # A sample's offset is its first member's header (PAX header included).
        for s in doc["samples"]:
            first = min(s["members"], key=lambda m: m[1])
            assert s["offset"] in headers or s["offset"] < first[1]

    # Grouping equals the engine's reader (keys, extensions, sample offsets).
    engine = _core.read_tar_samples(str(odd_shard))
    assert [(k, sorted(f), off) for k, f, off in engine] == [
        (s["key"], sorted(m[0] for m in s["members"]), s["offset"]) for s in doc["samples"]
    ]
    assert [s["key"] for s in doc["samples"]] == ["a/s1", "d" * 120 + "/s2", "s3"]
    assert doc["samples"][1]["members"][0][0] == "cls"  # lowercased like the engine


def test_index_many_shards_up_to_date_and_force(
    tiny_shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    shards = []
    for p in tiny_shards[:2]:
        target = tmp_path / Path(p).name
        target.write_bytes(Path(p).read_bytes())
        shards.append(str(target))
    code, out, _ = run(capsys, "index", *shards)
    assert code == 0 and out.count("250 samples") == 2
    for s in shards:
        doc = json.loads(index_path(s).read_text())
        assert len(doc["samples"]) == 250
        assert all(len(x["members"]) == 2 for x in doc["samples"])
    code, out, _ = run(capsys, "index", *shards)
    assert code == 0 and out.count("up to date") == 2
    code, out, _ = run(capsys, "index", "--force", shards[0])
    assert code == 0 and "250 samples" in out


def test_index_detects_stale_shard(tiny_shards: list[str], tmp_path: Path):
    shard = tmp_path / "s.tar"
    shard.write_bytes(Path(tiny_shards[0]).read_bytes())
    assert main(["index", str(shard)]) == 0
    with open(shard, "ab") as f:
        f.write(bytes(512))
    with pytest.raises(ValueError, match="stale"):
        read_index(shard)


def names_every_format(message: str) -> bool:
    """The message lists what a path could have been: every registered format."""
    return all(f.noun in message for f in file_formats())


def test_index_bad_input(
    tmp_path: Path, tiny_shards: list[str], capsys: pytest.CaptureFixture[str]
):
    code, _, err = run(capsys, "index", str(tmp_path / "missing.tar"))
    assert code == 2 and "no such file" in err
    text = tmp_path / "notes.txt"
    text.write_text("hello" * 200)
    code, _, err = run(capsys, "index", str(text))
    assert code == 2 and "neither " in err and names_every_format(err)
    truncated = tmp_path / "cut.tar"
    truncated.write_bytes(Path(tiny_shards[0]).read_bytes()[:5000])
    code, _, err = run(capsys, "index", str(truncated))
    assert code == 1 and "cut.tar" in err
    assert not index_path(truncated).exists()
    code, _, err = run(capsys, "index")
    assert code == 2 and "required" in err


# ---------------------------------------------------------------- inspect


def test_inspect_tar(image_shards: list[str], capsys: pytest.CaptureFixture[str]):
    code, out, _ = run(capsys, "inspect", image_shards[0])
    assert code == 0
    assert "samples: 40   members: 80" in out
    assert "keys: img000000 ... img000039" in out
    assert "png: png 40x32" in out and "jpg: jpeg 40x32" in out
    assert "'png' is in 6 of 40 samples" in out
    assert "problems: none" in out


def test_inspect_json_matches_tarfile(tiny_shards: list[str], capsys: pytest.CaptureFixture[str]):
    code, out, _ = run(capsys, "inspect", "--json", "--first", "2", *tiny_shards[:2])
    assert code == 0
    reports = json.loads(out)
    assert [r["path"] for r in reports] == tiny_shards[:2]
    for report in reports:
        with tarfile.open(report["path"]) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
        assert report["samples"] == 250 and report["members"] == len(members)
        for ext in ("npy", "cls"):
            sizes = [m.size for m in members if m.name.endswith("." + ext)]
            assert report["extensions"][ext] == {"members": len(sizes), "bytes": sum(sizes)}
        assert len(report["first_samples"]) == 2
        npy = report["first_samples"][0]["fields"]["npy"]
        assert npy["dtype"] == "float32" and npy["shape"] == [64]
        assert report["problems"] == []


def test_inspect_problems(
    tmp_path: Path, tiny_shards: list[str], capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        _add(tar, "x.npy", b"\x93NUMPY garbage")
        _add(tar, "x.cls", b"7")
        _add(tar, "y.cls", b"1")
        _add(tar, "y.cls", b"2")
        _add(tar, "x.jpg", b"not a jpeg")
    code, out, _ = run(capsys, "inspect", str(bad))
    assert code == 1
    assert "member 'npy' does not decode" in out
    assert "repeats extension 'cls'" in out
    assert "key 'x' appears again" in out

    truncated = tmp_path / "cut.tar"
    data = Path(tiny_shards[0]).read_bytes()
    truncated.write_bytes(data[:5000])
    code, out, _ = run(capsys, "inspect", str(truncated))
    assert code == 1 and "unreadable" in out and "cut.tar" in out
    # The samples before the cut are reported, and good files around it too.
    cut = tmp_path / "cut97.tar"
    with tarfile.open(tiny_shards[0]) as tar:
        offsets = {m.name: m.offset for m in tar}
    cut.write_bytes(data[: offsets["sample0000097.cls"] + 700])  # inside sample 97's first member
    code, out, _ = run(capsys, "inspect", "--json", tiny_shards[1], str(cut), tiny_shards[2])
    reports = json.loads(out)
    assert code == 1 and [r["samples"] for r in reports] == [250, 97, 250]
    assert reports[1]["last_key"] == "sample0000096" and not reports[0]["problems"]
    assert "[" not in reports[1]["problems"][0] and "cut97.tar" in reports[1]["problems"][0]

    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    code, out, _ = run(capsys, "inspect", str(empty))
    assert code == 1 and "no samples" in out


def test_inspect_counts_the_samples_before_a_cut(
    tmp_path: Path, tiny_shards: list[str], capsys: pytest.CaptureFixture[str]
):
    # Cut inside sample 97's npy: readers get 97 samples before the error, as
    # webdataset does under a handler that raises.
    from webdataset import tariterators

    shard = Path(tiny_shards[0])
    with tarfile.open(shard) as tf:
        member = tf.getmember("sample0000097.npy")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[: member.offset_data + 100])
    delivered = 0
    # webdataset's own chain, over a stream this test closes.
    with open(cut, "rb") as stream, pytest.raises(tarfile.ReadError):
        files = tariterators.tar_file_expander([{"url": str(cut), "stream": stream}])
        for _ in tariterators.group_by_keys(files):
            delivered += 1
    assert delivered == 97
    code, out, _ = run(capsys, "inspect", "--json", str(cut))
    assert code == 1
    (report,) = json.loads(out)
    # The members listed before the cut make 98 samples (the last one cut
    # short); readers get 97 under the default handler, 98 (as read) and one
    # lost, the cut, under one that goes on.
    assert report["samples"] == 98 and report["last_key"] == "sample0000097"
    assert any("truncated" in p for p in report["problems"])
    assert any(
        "readers get 97 samples before the error; under a handler that goes on, 98 delivered"
        " and 1 lost" in p
        for p in report["problems"]
    )


def test_inspect_hdf5(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "x", data=np.zeros((50, 3), np.float32), chunks=(10, 3), compression="gzip"
        )
        f.create_dataset("g/y", data=np.arange(50, dtype=np.int64))
        f.create_dataset("z", data=np.zeros((50, 2), np.float32), chunks=(10, 2), compression="lzf")
        f.create_dataset("s", data=3.0)
        f.create_dataset("names", data=np.array([b"a", b"b"]))
    code, out, _ = run(capsys, "inspect", str(path))
    assert code == 0
    assert "/x: float32 (50, 3), chunks (10, 3), deflate -> native" in out
    assert "/g/y: int64 (50,), contiguous, no filters -> native" in out
    assert "/z: float32 (50, 2), chunks (10, 2), lzf -> slow path: '/z' uses the lzf filter" in out
    assert "/s: float64 (), contiguous, no filters -> no: a scalar, not rows" in out
    assert "-> no: non-numeric dtype |S1" in out
    code, out, _ = run(capsys, "inspect", "--json", str(path))
    (report,) = json.loads(out)
    assert {d["name"]: d["chunks"] for d in report["datasets"]}["/x"] == [10, 3]


def test_inspect_bad_paths(
    tmp_path: Path, tiny_shards: list[str], capsys: pytest.CaptureFixture[str]
):
    # A bad path is a finding about it (exit 1): the paths around it are reported.
    code, out, err = run(capsys, "inspect", tiny_shards[0], str(tmp_path / "nope.tar"))
    assert code == 1 and "nope.tar: no such file" in out and err == ""
    assert "samples: 250" in out
    code, out, _ = run(capsys, "inspect", str(tmp_path), tiny_shards[1])
    assert code == 1 and "is a directory" in out and "samples: 250" in out
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\0" * 100)
    code, out, _ = run(capsys, "inspect", "--json", str(junk))
    problem = json.loads(out)[0]["problems"][0]
    assert code == 1 and "neither " in problem and names_every_format(problem)
    code, _, err = run(capsys, "inspect")
    assert code == 2
    code, _, err = run(capsys, "frobnicate")
    assert code == 2 and "invalid choice" in err
    code, _, err = run(capsys)
    assert code == 2


# ---------------------------------------------------------------- bench


def test_bench_bad_arguments(
    tiny_shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    code, _, err = run(capsys, "bench", tiny_shards[0], "--batch-size", "0")
    assert code == 2 and "--batch-size must be >= 1" in err
    code, _, err = run(capsys, "bench", tiny_shards[0], "--decode", "jpegish")
    assert code == 2 and "--decode 'jpegish'" in err
    code, _, err = run(capsys, "bench", tiny_shards[0], "--workers", "-1")
    assert code == 2
    code, _, err = run(capsys, "bench", tiny_shards[0], "--batch-size", "many")
    assert code == 2 and "invalid int value" in err
    code, _, err = run(capsys, "bench")
    assert code == 2 and "at least one path (" in err
    h5 = tmp_path / "a.h5"
    with h5py.File(h5, "w") as f:
        f["x"] = np.zeros(3)
    code, _, err = run(capsys, "bench", str(h5))
    assert code == 2 and "not one" in err


def test_bench_image_option_errors(image_shards: list[str], capsys: pytest.CaptureFixture[str]):
    shard = image_shards[0]
    code, _, err = run(capsys, "bench", shard, "--size", "32")
    assert code == 2 and "need an image spec" in err
    spec = ["--decode", "torchrgb8"]
    code, _, err = run(capsys, "bench", shard, *spec, "--size", "32", "--normalize", "imagenet")
    assert code == 2 and "float output" in err
    # --compare resizes webdataset's images as chute does for --size, and no more.
    code, _, err = run(capsys, "bench", shard, *spec, "--size", "32", "--flip", "--compare")
    assert code == 2 and "--compare runs webdataset's own decode" in err
    code, _, err = run(capsys, "bench", shard, *spec, "--dtype", "float16", "--normalize", "1,2")
    assert code == 2 and "image options" in err
    code, _, err = run(capsys, "bench", shard, *spec, "--size", "big")
    assert code == 2 and "image options" in err
    code, _, err = run(capsys, "bench", shard, *spec, "--crop", "random_resized")
    assert code == 2 and "needs size" in err


@pytest.mark.slow
def test_bench_with_image_options(image_shards: list[str]):
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "bench", *image_shards, "--decode", "torchrgb8",
         "--size", "24,20", "--crop", "random_resized", "--flip", "--normalize", "imagenet",
         "--dtype", "float16", "--to-tuple", "jpg;png cls", "--workers", "1", "--json",
         "--no-progress"],
        capture_output=True, text=True, env=child_env(), timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["loader"] == "chute" and result["samples"] == 120


def test_bench_decode_limit(image_shards: list[str], capsys: pytest.CaptureFixture[str]):
    code, _, err = run(capsys, "bench", image_shards[0], "--decode-limit")
    assert code == 2 and "--decode-limit times the codec" in err and "--decode SPEC" in err
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "bench", *image_shards, "--decode", "torchrgb8",
         "--size", "24,20", "--to-tuple", "jpg;png cls", "--workers", "1", "--no-progress",
         "--decode-limit"],
        capture_output=True, text=True, env=child_env(), timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    limit = next(line for line in lines if line.startswith("decode limit: "))
    cores = os.cpu_count() or 1
    assert re.search(rf"on \d+ of the files' images: [\d,]+/s on one core x {cores} cores", limit)
    rate = float(limit.split()[2].replace(",", ""))
    assert rate > 0
    chute_rate = float(lines[1].split()[3].replace(",", ""))
    ratio = next(line for line in lines if line.startswith("chute / decode limit: "))
    assert float(ratio.split()[-1]) == pytest.approx(chute_rate / rate, rel=0.02, abs=0.01)


@pytest.mark.slow
def test_bench_compare_subprocess(tiny_shards: list[str], tmp_path: Path):
    shards = []
    for p in tiny_shards[:2]:
        target = tmp_path / Path(p).name
        target.write_bytes(Path(p).read_bytes())
        shards.append(str(target))
    assert main(["index", *shards]) == 0  # gives the progress bar its total
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "bench", *shards, "--batch-size", "50",
         "--workers", "1", "--to-tuple", "npy cls", "--compare", "--json"],
        capture_output=True, text=True, env=child_env(), timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert [r["loader"] for r in results] == ["chute", "torch+webdataset"]
    for r in results:
        assert r["samples"] == 500
        assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0
        assert 0 < r["first_batch_s"] < r["seconds"]
        assert r["peak_rss_mib"] > 50  # torch alone is bigger than that
    # The progress bar ran on stderr for both loaders and reached the total.
    assert "500/500" in proc.stderr or "500" in proc.stderr
    assert "chute" in proc.stderr and "torch+webdataset" in proc.stderr

    # The human-readable table, through the console-script module path.
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "bench", shards[0], "--batch-size", "64",
         "--decode", "raw", "--no-progress", "--limit", "100"],
        capture_output=True, text=True, env=child_env(), timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["loader", "workers", "samples"]
    assert lines[1].split()[0] == "chute" and int(lines[1].split()[2]) == 128
    assert proc.stderr == ""


@pytest.mark.slow
def test_bench_takes_comma_separated_fields_and_a_size_for_mixed_images(tmp_path: Path):
    from conftest import jpeg_bytes, write_shards

    rng = np.random.default_rng(5)
    samples: list[dict[str, object]] = [
        {"__key__": f"m{i:03d}", "jpg": jpeg_bytes(rng, 20 + 4 * (i % 3), 24), "cls": i % 5}
        for i in range(30)
    ]
    (shard,) = write_shards(tmp_path, samples, 30)

    def bench(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "chute", "bench", shard, "--batch-size", "8",
             "--workers", "1", "--decode", "rgb8", "--no-progress", "--json", *extra],
            capture_output=True, text=True, env=child_env(), timeout=300, check=False,
        )  # fmt: skip

    # Images of three sizes do not batch: the message names bench's own option.
    proc = bench("--to-tuple", "jpg,cls")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--size H W" in proc.stderr and "shard-000000.tar" in proc.stderr
    proc = bench("--to-tuple", "jpg,cls", "--size", "16", "16", "--compare")
    assert proc.returncode == 0, proc.stderr
    assert [r["samples"] for r in json.loads(proc.stdout)] == [30, 30]
    proc = bench("--to-tuple", "jpg cls", "--size", "16", "16")
    assert proc.returncode == 0, proc.stderr


def test_bench_size_needs_an_image_spec(tiny_shards: list[str], capsys):
    code, _, err = run(capsys, "bench", tiny_shards[0], "--size", "8", "8")
    assert code == 2 and "need an image spec" in err
    code, _, err = run(capsys, "bench", tiny_shards[0], "--decode", "rgb8", "--size", "0", "8")
    assert code == 2 and "two positive numbers" in err
    code, _, err = run(capsys, "bench", "--decode", "rgb8", "--size", "8", "8", tiny_shards[0])
    assert code == 2 and "give the shard paths before --size" in err


# -------------------------------------------------------------------- help and progress


def test_bench_help_shows_each_option_once_and_plainly(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert "--size H [W]" in text and "H W [H W ...]" not in text
    assert "{," not in text  # no empty choice in --crop or --dtype
    assert re.search(r"--batch-size N\s+samples per batch", text)
    assert re.search(r"--limit N\s+stop each loader after about N samples", text)
    with pytest.raises(SystemExit):
        main(["index", "--help"])
    assert re.search(r"PATH\s+tar shards to index", capsys.readouterr().out)


def test_bench_progress_is_a_line_per_update_off_a_terminal(tiny_shards: list[str]):
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "bench", *tiny_shards[:2], "--batch-size", "50",
         "--workers", "1", "--to-tuple", "npy cls", "--json"],
        capture_output=True, text=True, env=child_env(), timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("chute:")]
    # tqdm's own line ("chute: 500sample [...]") where it is installed, as the
    # tokenizers extra brings it; chute's plain line otherwise.
    assert lines and re.match(r"chute: 500 ?samples?\b", lines[-1]), lines


def test_dataloader_progress_without_tqdm_ends_at_the_real_count(monkeypatch, capsys):
    import chute
    import torch

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` fails
    data = torch.utils.data.TensorDataset(torch.arange(1000))
    loader = chute.DataLoader(data, batch_size=32, progress=True)
    assert len(list(loader)) == 32
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("chute: 32/32 batches, ")
    assert all("\r" not in line for line in lines)


def test_dataloader_progress_gives_tqdm_the_length(monkeypatch):
    import types

    import chute
    import torch

    bars: list[dict[str, object]] = []

    class FakeBar:
        def __init__(self, total: int | None = None, **kw: object) -> None:
            self.state = {"total": total, "n": 0, "closed": False}
            bars.append(self.state)

        def update(self, n: int) -> None:
            self.state["n"] = int(self.state["n"]) + n  # type: ignore[call-overload]

        def set_postfix(self, **kw: object) -> None:
            pass

        def close(self) -> None:
            self.state["closed"] = True

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    data = torch.utils.data.TensorDataset(torch.arange(1000))
    assert len(list(chute.DataLoader(data, batch_size=32, progress=True))) == 32
    assert bars == [{"total": 32, "n": 32, "closed": True}]
