"""TarDataset and H5Dataset expand their file patterns as ParquetDataset and
TokenDataset do (chute.sources.remote_urls.expand_file_patterns): brace ranges
and ``::`` groups, then globs sorted; a literal path that exists is taken as
it is; a glob that matches nothing names what was looked for."""

from __future__ import annotations

import errno
from pathlib import Path

import chute
import h5py
import numpy as np
import pytest
from conftest import tiny_samples, write_shards


def _h5(path: Path, first: int, rows: int) -> str:
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(first, first + rows, dtype=np.int64)
    return str(path)


def test_h5_brace_pattern_reads_each_file_in_order(tmp_path: Path) -> None:
    _h5(tmp_path / "part-0.h5", 0, 3)
    _h5(tmp_path / "part-1.h5", 3, 2)
    _h5(tmp_path / "part-2.h5", 100, 1)  # outside the range
    ds = chute.H5Dataset(str(tmp_path / "part-{0..1}.h5"), ["x"])
    assert [int(ds[i]["x"]) for i in range(len(ds))] == [0, 1, 2, 3, 4]
    groups = chute.H5Dataset(f"{tmp_path}/part-1.h5::{tmp_path}/part-0.h5", ["x"])
    assert [int(groups[i]["x"]) for i in range(len(groups))] == [3, 4, 0, 1, 2]


def test_h5_glob_matches_sorted_and_no_match_is_named(tmp_path: Path) -> None:
    _h5(tmp_path / "b.h5", 10, 1)
    _h5(tmp_path / "a.h5", 20, 1)
    ds = chute.H5Dataset(str(tmp_path / "*.h5"), ["x"])
    assert [int(ds[i]["x"]) for i in range(len(ds))] == [20, 10]
    pattern = str(tmp_path / "none-*.h5")
    with pytest.raises(FileNotFoundError) as info:
        chute.H5Dataset(pattern, ["x"])
    assert (info.value.errno, info.value.strerror, info.value.filename) == (
        errno.ENOENT,
        "no HDF5 file matches the pattern",
        pattern,
    )
    missing = str(tmp_path / "missing.h5")
    with pytest.raises(FileNotFoundError) as info:
        chute.H5Dataset(missing, ["x"])
    assert (info.value.strerror, info.value.filename) == ("HDF5 file not found", missing)


def test_tar_glob_with_no_match_is_named(tmp_path: Path) -> None:
    pattern = str(tmp_path / "shard-*.tar")
    with pytest.raises(FileNotFoundError) as info:
        chute.TarDataset(pattern)
    assert (info.value.errno, info.value.strerror, info.value.filename) == (
        errno.ENOENT,
        "no shard matches the pattern",
        pattern,
    )


def test_tar_path_with_glob_characters_that_exists_is_read_as_it_is(tmp_path: Path) -> None:
    # "shard[0].tar" as a glob matches "shard0.tar"; the file of that very
    # name is the one meant.
    (named,) = write_shards(tmp_path / "a", tiny_samples(3, seed=1), per_shard=3)
    (other,) = write_shards(tmp_path / "b", tiny_samples(5, seed=2), per_shard=5)
    literal = tmp_path / "shard[0].tar"
    Path(named).rename(literal)
    Path(other).rename(tmp_path / "shard0.tar")
    ds = chute.TarDataset(str(literal))
    assert len(ds) == 3
    assert ds.urls == [str(literal)]
