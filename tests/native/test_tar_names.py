"""Member names as webdataset gives them: keys and extensions of names that
are not UTF-8, the key rule and Python's lowercasing, checked against
webdataset's own code, and errors that name such members."""

from __future__ import annotations

import io
import itertools
import random
import re
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any

import chute
import chute.wds as cwds
import pytest
import webdataset
from chute import _core
from webdataset.tariterators import base_plus_ext

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

# Raw names: invalid UTF-8 in a key, in a directory, in an extension, valid
# non-ASCII, and an upper-case non-ASCII extension.
RAW_NAMES = [
    b"a\xffb.cls",
    b"a\xffb.TXT",
    b"c.\xe9x",
    b"dir\xfe/k.cls",
    b"good.cls",
    b"caf\xc3\xa9.cls",
    b"x.\xc3\x9c",
]


def as_str(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def webdataset_samples(url: str, **kw: Any) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = webdataset.WebDataset(url, shardshuffle=False, **kw)
        return [{k: v for k, v in s.items() if k != "__local_path__"} for s in ds]


def chute_samples(url: str, **kw: Any) -> list[dict[str, Any]]:
    ds = chute.WebDataset(url, shardshuffle=False, **kw)
    return [{k: v for k, v in s.items() if k != "__local_path__"} for s in ds]


def python_archives(directory: Path) -> list[Path]:
    paths = []
    for label, fmt in [
        ("pax", tarfile.PAX_FORMAT),
        ("gnu", tarfile.GNU_FORMAT),
        ("ustar", tarfile.USTAR_FORMAT),
    ]:
        path = directory / f"py-{label}.tar"
        with tarfile.open(path, "w", format=fmt) as tf:
            for i, raw in enumerate(RAW_NAMES):
                info = tarfile.TarInfo(as_str(raw))
                payload = str(i).encode()
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
        paths.append(path)
    return paths


def gnu_archives(directory: Path) -> list[Path]:
    if shutil.which("tar") is None:
        return []
    if "GNU tar" not in subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout:
        return []
    src = directory / "src"
    for i, raw in enumerate(RAW_NAMES):
        target = bytes(src).rstrip(b"/") + b"/" + raw
        Path(target.decode("utf-8", "surrogateescape")).parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            f.write(str(i).encode())
    paths = []
    for fmt in ["gnu", "pax", "ustar", "v7"]:
        path = directory / f"gnu-{fmt}.tar"
        names = [as_str(raw) for raw in RAW_NAMES]
        subprocess.run(
            ["tar", f"--format={fmt}", "-cf", str(path), "-C", str(src), *names], check=True
        )
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def name_archives(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    directory = tmp_path_factory.mktemp("names")
    return python_archives(directory) + gnu_archives(directory)


def test_keys_and_extensions_of_names_that_are_not_utf8(name_archives: list[Path]) -> None:
    assert len(name_archives) >= 3
    for path in name_archives:
        reference = webdataset_samples(str(path))
        assert [s["__key__"] for s in reference] == [
            "a\udcffb",
            "c",
            "dir\udcfe/k",
            "good",
            "café",
            "x",
        ], path
        assert "\udce9x" in reference[1] and "ü" in reference[5]
        assert chute_samples(str(path)) == reference, path
        assert [(k, f) for k, f, _ in _core.read_tar_samples(str(path))] == [
            (s["__key__"], {e: v for e, v in s.items() if not e.startswith("__")})
            for s in reference
        ]


def test_fields_named_by_such_extensions(name_archives: list[Path]) -> None:
    for path in name_archives:
        rows = list(
            chute.WebDataset(str(path), shardshuffle=False)
            .to_tuple("__key__", "cls;\udce9x;ü")
            .batched(3)
        )
        assert rows == [
            (["a\udcffb", "c", "dir\udcfe/k"], [b"0", b"2", b"3"]),
            (["good", "café", "x"], [b"4", b"5", b"6"]),
        ]


def test_errors_name_such_members_and_handlers_cover_them(name_archives: list[Path]) -> None:
    path = str(name_archives[0])
    # No sample has an npy: the error names the first sample's key, printable.
    with pytest.raises(chute.DataError) as info:
        list(chute.WebDataset(path, shardshuffle=False).to_tuple("__key__", "npy"))
    message = str(info.value)
    assert f"'{path}'" in message and "a\\xffb" in message
    message.encode("utf-8")  # no lone surrogates: it prints anywhere
    seen: list[BaseException] = []
    ds = chute.WebDataset(path, shardshuffle=False)
    keep = ds.to_tuple("__key__", "txt", handler=lambda e: seen.append(e) or True)
    assert list(keep) == [("a\udcffb", b"1")]
    assert len(seen) == 5 and all(isinstance(e, chute.DataError) for e in seen)
    skipping = chute.WebDataset(path, shardshuffle=False).to_tuple(
        "__key__", "txt", handler=cwds.ignore_and_continue
    )
    assert list(skipping) == [("a\udcffb", b"1")]
    assert skipping.stats()["samples_skipped"] == 5


def webdataset_split(name: str) -> tuple[str, str] | None:
    """webdataset's rule: tar_file_iterator drops metadata members,
    group_by_keys splits with base_plus_ext and lowercases the suffix."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None
    if re.match(r"__[^/]*__($|/)", name):
        return None
    key, ext = base_plus_ext(name)
    return None if key is None else (key, ext.lower())


def payload_splits(names: list[str], tmp_path: Path) -> list[tuple[str, str | None, str | None]]:
    path = tmp_path / "names.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name in names:
            info = tarfile.TarInfo(name)
            tf.addfile(info, io.BytesIO(b""))
    return [(n, k, e) for n, _, _, _, k, e in _core.list_tar_payloads(str(path))]


def test_key_rule_is_webdatasets_on_every_short_name(tmp_path: Path) -> None:
    # Every name of up to five characters from the ones the rule looks at
    # (and a non-ASCII letter whose case folds), as list_tar_payloads splits it.
    alphabet = ["a", ".", "/", "\n", "_", "Σ"]
    names = [
        "".join(p)
        for n in range(1, 6)
        for p in itertools.product(alphabet, repeat=n)
        # tarfile keeps a trailing slash on a regular member; names that are
        # only slashes and dots are not names of files.
        if p[-1] != "/" and set(p) - {"/", "."}
    ]
    got = payload_splits(names, tmp_path)
    assert [n for n, _, _ in got] == names
    for name, key, ext in got:
        expected = webdataset_split(name)
        assert (None if key is None else (key, ext)) == expected, repr(name)


def test_extensions_are_lowered_as_python_lowers_them(tmp_path: Path) -> None:
    # Every code point (lone surrogates only as tarfile writes undecodable
    # bytes), in runs whose neighbours also exercise Σ's final form, and
    # random strings around Σ with cased and case-ignorable neighbours.
    points = [
        c for c in range(0x80, 0x110000) if not 0xD800 <= c < 0xDC80 and not 0xDD00 <= c < 0xE000
    ]
    chunks = ["".join(chr(c) for c in points[i : i + 3000]) for i in range(0, len(points), 3000)]
    rng = random.Random(0)
    pool = ["Σ", "A", "a", "'", "\u0301", "\u00ad", "1", " ", "\udcff", "İ", "ǅ", "ʰ"]
    chunks += ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 8))) for _ in range(3000)]
    extensions = [c.replace("/", "").replace(".", "") for c in chunks]
    got = payload_splits([f"k{i}.{e}" for i, e in enumerate(extensions)], tmp_path)
    for (_, _, ext), original in zip(got, extensions, strict=True):
        assert ext == original.lower(), ascii(original)
