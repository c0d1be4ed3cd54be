"""The fault catalogue for HDF5, through chute.DataLoader(chute.H5Dataset).

Map-style batches hold exactly the rows the sampler asked for, so there is no
skip policy here: a bad chunk or a changed file is an exception that names
the file, the dataset, the row and the byte offset, raised at the position of
the batch that needed it (the batches before it arrive intact).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import chute
import h5py
import numpy as np
import pytest

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

ROWS = 512
CHUNK = 64


def write(path: Path, **kwargs: object) -> np.ndarray:
    data = np.arange(ROWS * 8, dtype="f4").reshape(ROWS, 8)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(CHUNK, 8), **kwargs)
    return data


def chunk_offset(path: Path, index: int) -> int:
    with h5py.File(path, "r") as f:
        return int(f["x"].id.get_chunk_info(index).byte_offset)


def damage(path: Path, offset: int, length: int = 40) -> None:
    """Overwrites bytes without changing the mtime, as if the file had been
    bad before it was opened (a changed mtime is reported as such)."""
    stat = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xa5" * length)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def loader(path: Path, num_workers: int = 2, batch_size: int = 32) -> chute.DataLoader:
    return chute.DataLoader(
        chute.H5Dataset(path, {"x": "x"}), batch_size=batch_size, num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_chunk_fails_to_inflate(tmp_path: Path, num_workers: int) -> None:
    path = tmp_path / "inflate.h5"
    data = write(path, compression="gzip")
    bad_chunk = 3
    offset = chunk_offset(path, bad_chunk)
    damage(path, offset + 8)
    got: list[np.ndarray] = []
    with pytest.raises(chute.DataError) as info:
        for batch in loader(path, num_workers):
            got.append(batch["x"].numpy())
    message = str(info.value)
    assert "inflate.h5" in message and "'/x'" in message, message
    assert f"chunk {bad_chunk}" in message and f"offset {offset}" in message, message
    # The batches before the damaged chunk are exact; none after it arrived.
    rows_before = bad_chunk * CHUNK
    assert len(got) == rows_before // 32
    np.testing.assert_array_equal(np.concatenate(got), data[:rows_before])


def test_fletcher32_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "f32.h5"
    write(path, fletcher32=True)
    offset = chunk_offset(path, 1)
    damage(path, offset + 16, 4)
    with pytest.raises(chute.DataError, match=r"f32\.h5.*'/x'.*chunk 1") as info:
        list(loader(path))
    assert re.search(r"offset \d+", str(info.value))


def test_shuffled_loader_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "rows.h5"
    write(path, compression="gzip")
    damage(path, chunk_offset(path, 5) + 8)
    ds = chute.H5Dataset(path, {"x": "x"})
    with pytest.raises(chute.DataError) as info:
        ds.__getitems__([1, 2, 5 * CHUNK + 7])
    assert re.search(rf"row {5 * CHUNK + 7}\b", str(info.value)), str(info.value)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_file_truncated_after_open(tmp_path: Path, num_workers: int) -> None:
    path = tmp_path / "trunc.h5"
    data = write(path)
    dl = loader(path, num_workers)
    it = iter(dl)
    np.testing.assert_array_equal(next(it)["x"].numpy(), data[:32])
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(chute.ReadError, match=r"trunc\.h5.*changed") as info:
        for _ in it:
            pass
    assert re.search(r"row \d+", str(info.value)) and "offset" in str(info.value)
    # A new iteration does not read stale or zero-filled rows either.
    with pytest.raises(chute.ReadError, match=r"trunc\.h5"):
        list(dl)


def test_file_deleted_after_open_keeps_reading(tmp_path: Path) -> None:
    # POSIX keeps an open file's data until the last descriptor closes: a file
    # deleted (or replaced by a new version) under a running job is still read
    # consistently from the version that was opened.
    path = tmp_path / "gone.h5"
    data = write(path, compression="gzip")
    dl = loader(path)
    first = next(iter(dl))["x"].numpy()
    np.testing.assert_array_equal(first, data[:32])
    path.unlink()
    write(path.with_name("other.h5"))
    got = np.concatenate([b["x"].numpy() for b in dl])
    np.testing.assert_array_equal(got, data)


def test_error_does_not_poison_the_dataset(tmp_path: Path) -> None:
    path = tmp_path / "again.h5"
    data = write(path, compression="gzip")
    damage(path, chunk_offset(path, 7) + 8)
    ds = chute.H5Dataset(path, {"x": "x"})
    dl = chute.DataLoader(ds, batch_size=CHUNK, num_workers=2)
    for _ in range(2):
        with pytest.raises(chute.DataError):
            list(dl)
    # Rows in intact chunks are still served, by both read paths.
    np.testing.assert_array_equal(ds[3]["x"].numpy(), data[3])
    rows = ds.__getitems__([0, 100, 200])
    np.testing.assert_array_equal(np.stack([r["x"].numpy() for r in rows]), data[[0, 100, 200]])
