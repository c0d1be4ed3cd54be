"""The url schemes chute reads are one table, the engine's
(csrc/io/remote_source.cc, ``_core.remote_schemes()``): chute.remote reads
it, and every list of schemes in the docs and docstrings agrees with it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from chute import _core, remote
from chute.remote import _stores

ROOT = Path(os.environ.get("CHUTE_SOURCE_ROOT") or Path(__file__).resolve().parents[2])
TABLE = _core.remote_schemes()
NAMES = {scheme.name for scheme in TABLE}
EVERY_NAME = NAMES | {alias for scheme in TABLE for alias in scheme.aliases}

# Where the docs list the schemes; each of these must hold at least one list
# (a list reworded into prose is then noticed here, not silently skipped).
LISTING_FILES = [
    "README.md",
    "docs/remote.md",
    "docs/usage.md",
    "docs/errors.md",
    "python/chute/datasets/h5.py",
    "python/chute/datasets/parquet.py",
    "python/chute/datasets/tardataset.py",
    "python/chute/wds/dataset.py",
    "python/chute/remote/__init__.py",
    "python/chute/remote/_options.py",
]

# A scheme as the docs write it: `s3://`, ``s3://``, http(s)://, not followed
# by the rest of a url.
_SCHEME = re.compile(r"`{0,2}\b([a-z][a-z0-9]*)(\(s\))?://(?![\w/.{$*\[-])`{0,2}")
# What may stand between two schemes of one list.
_BETWEEN = re.compile(r"[\s,()]*(?:(?:and|or)\b[\s,()]*)?")


def scheme_lists(text: str) -> list[set[str]]:
    """The runs of three or more schemes written as one list (outside
    Markdown tables), each as the set of schemes it names."""
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    runs: list[list[str]] = []
    run: list[str] = []
    end = -1
    for match in _SCHEME.finditer(text):
        if run and not _BETWEEN.fullmatch(text[end : match.start()]):
            runs.append(run)
            run = []
        name = match.group(1)
        run += [name, name + "s"] if match.group(2) else [name]
        end = match.end()
    runs.append(run)
    return [set(run) for run in runs if len(run) >= 3]


def test_scheme_lists_are_found_as_written():
    assert scheme_lists("`http(s)://`, `s3://` and `hf://` urls") == [{"http", "https", "s3", "hf"}]
    assert scheme_lists("``s3://``, ``gs://``,\n    ``az://`` (``abfs://``)") == [
        {"s3", "gs", "az", "abfs"}
    ]
    # Urls, two schemes, and a table row are not lists.
    assert scheme_lists("`s3://b/k`, `gs://b/k`, `az://c/k`") == []
    assert scheme_lists("`s3://` or `gs://` and then `az://b/k`") == []
    assert scheme_lists("| `az://` | `azure://`, `abfs://`, `adl://` |") == []


def test_python_reads_the_engines_table():
    assert set(_stores.SCHEMES) == EVERY_NAME
    for scheme in TABLE:
        for name in (scheme.name, *scheme.aliases):
            for url in (f"{name}://bucket/key", f"{name.upper()}://bucket/key"):
                assert remote.is_remote_url(url)
                assert _stores.store_of(url) == scheme.store
    for url in ["/tmp/x.tar", "file:///x.tar", "pipe:cat x", "ftp://h/x", "x.tar"]:
        assert not remote.is_remote_url(url)
        assert _stores.store_of(url) == ""


def test_every_store_in_the_table_is_one_chute_remote_makes():
    # A scheme of a new kind of store needs its branch in Stores._make.
    assert {scheme.store for scheme in TABLE} <= set(_stores.STORES)
    assert set(_stores.READ_ONLY_STORES) <= set(_stores.STORES)


@pytest.mark.parametrize("relative", LISTING_FILES)
def test_the_docs_lists_of_schemes_are_the_table(relative: str):
    # Each list names the table's schemes (their aliases left to
    # docs/remote.md's table), or every name and alias.
    lists = scheme_lists((ROOT / relative).read_text(encoding="utf-8"))
    assert lists, f"{relative} lists no schemes"
    for found in lists:
        assert found in (NAMES, EVERY_NAME), f"{relative}: {sorted(found)}"


def test_no_other_file_lists_other_schemes():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "python" / "chute").rglob("*.py"))
    for path in files:
        for found in scheme_lists(path.read_text(encoding="utf-8")):
            assert found in (NAMES, EVERY_NAME), f"{path.relative_to(ROOT)}: {sorted(found)}"


def test_docs_remote_table_has_every_scheme():
    text = (ROOT / "docs" / "remote.md").read_text(encoding="utf-8")
    header = "| Scheme | Aliases | Store | Globs listed and indexes written |"
    assert header in text
    rows = []
    for line in text[text.index(header) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    expected = [
        [
            f"`{scheme.name}://`",
            ", ".join(f"`{alias}://`" for alias in scheme.aliases),
            "no" if scheme.store in _stores.READ_ONLY_STORES else "yes",
        ]
        for scheme in TABLE
    ]
    assert [[row[0], row[1], row[3]] for row in rows] == expected


def test_read_only_stores_refuse_listing_and_writes():
    for scheme in TABLE:
        url = f"{scheme.name}://host/org/repo/shards/*.tar"
        if scheme.store not in _stores.READ_ONLY_STORES:
            continue
        with pytest.raises(ValueError) as info:
            _stores.list_objects(_stores.Stores(remote.RemoteOptions()), url)
        assert str(info.value) == (
            f"cannot list {url!r}: http(s) and hf:// servers offer no listing; "
            "name the objects (brace patterns such as shard-{000..127}.tar work)"
        )
        session = remote.RemoteSession(remote.RemoteOptions())
        with session, pytest.raises(ValueError) as info:
            session.put(url, b"x")
        assert str(info.value) == (
            f"cannot write {url!r}: http(s) and hf:// urls are read-only here"
        )
    assert {s.name for s in TABLE if s.store in _stores.READ_ONLY_STORES} == {
        "http",
        "https",
        "hf",
    }


def test_missing_obstore_names_every_scheme(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(remote.RemoteDependencyError) as info:
        _stores.obstore_module()
    named = ", ".join(f"{scheme.name}://" for scheme in TABLE)
    assert str(info.value) == (
        f"reading remote urls ({named}) needs obstore: pip install 'chute[remote]'"
    )
    assert named.startswith("http://, https://, s3://, gs://")
