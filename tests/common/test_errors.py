"""Engine failures as the exceptions code written for webdataset and the
standard library catches, with messages that name the data and keep the C++
source location on ``err.where``."""

from __future__ import annotations

import errno
import gc
import io
import re
import tarfile
import warnings
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pytest
import torch
import webdataset
from conftest import image_samples, tiny_samples, write_shards

LOCATION = re.compile(r"\[[\w.+-]+\.(cc|h):\d+\]")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_shards(tmp_path_factory.mktemp("good"), tiny_samples(10), per_shard=10)[0]


def first_error(lib: Any, urls: list[str], **kw: Any) -> BaseException:
    error: BaseException | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves files open
        try:
            list(lib.WebDataset(urls, shardshuffle=False, **kw))
        except Exception as exc:
            error = exc.with_traceback(None)  # its frames hold webdataset's open file
            error.__context__ = None
        gc.collect()
    assert error is not None, "no error"
    return error


def test_a_missing_shard_is_a_file_not_found_error(good: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.tar")
    for lib in (webdataset, chute):
        assert isinstance(first_error(lib, [good, missing]), FileNotFoundError)
    err = first_error(chute, [good, missing])
    assert isinstance(err, chute.ReadError) and isinstance(err, OSError)
    assert (err.errno, err.filename) == (errno.ENOENT, missing)
    assert str(err) == f"cannot open '{missing}': No such file or directory"
    assert err.where is not None and err.where.startswith("file_source.cc:")


def test_a_directory_is_an_is_a_directory_error(good: str, tmp_path: Path) -> None:
    for lib in (webdataset, chute):
        assert isinstance(first_error(lib, [str(tmp_path)]), IsADirectoryError)
    assert first_error(chute, [str(tmp_path)]).errno == errno.EISDIR


def test_a_truncated_archive_is_a_tarfile_read_error(good: str, tmp_path: Path) -> None:
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(good).read_bytes()[:1700])
    for lib in (webdataset, chute):
        assert isinstance(first_error(lib, [str(cut)]), tarfile.ReadError)
    err = first_error(chute, [str(cut)])
    assert isinstance(err, chute.DataError) and isinstance(err, ValueError)
    assert "cut.tar" in str(err) and not LOCATION.search(str(err)) and err.where


def test_messages_have_no_empty_fields_and_no_source_location(tmp_path: Path) -> None:
    samples = image_samples(4, png_every=1)
    samples[2]["png"] = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
    urls = write_shards(tmp_path, samples, 4)
    with pytest.raises(chute.DataError) as info:
        list(chute.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("png"))
    message = str(info.value)
    assert re.search(r"member 'img000002\.png' at offset \d+: \w", message), message
    assert ": :" not in message and not LOCATION.search(message)


def test_skip_messages_carry_no_source_location(tmp_path: Path) -> None:
    samples = image_samples(4)
    samples[1]["jpg"] = b"garbage"
    urls = write_shards(tmp_path, samples, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = chute.WebDataset(urls, shardshuffle=False, handler=wds.warn_and_continue)
        assert len(list(ds.decode("rgb8").to_tuple("jpg"))) == 3
    (warning,) = [w for w in caught if issubclass(w.category, chute.SkippedSampleWarning)]
    assert "img000001.jpg" in str(warning.message)
    assert not LOCATION.search(str(warning.message)) and ": :" not in str(warning.message)


def test_errors_cross_torch_worker_processes_with_their_class(good: str, tmp_path: Path) -> None:
    ds = chute.WebDataset([str(tmp_path / "gone.tar")], shardshuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    with pytest.raises(FileNotFoundError, match="gone.tar"):
        list(loader)


def test_indexed_errors_are_translated_too(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(4096, dtype="f8").reshape(1024, 4))
    ds = chute.H5Dataset(path, {"x": "x"})
    it = iter(chute.DataLoader(ds, batch_size=64))
    next(it)
    path.write_bytes(b"")  # cut to nothing while the rows are mapped
    with pytest.raises(chute.ReadError) as info:
        for _ in it:
            pass
    assert "rows.h5" in str(info.value) and not LOCATION.search(str(info.value))


def test_decoding_error_is_webdatasets_shape() -> None:
    cause = ValueError("x")
    err = wds.DecodingError(url="u", key="k", k="jpg", sample={"a": 1})
    err.__cause__ = cause
    assert (err.url, err.key, err.k, err.sample) == ("u", "k", "jpg", {"a": 1})
    assert "'jpg'" in str(err) and "'k'" in str(err) and isinstance(err, Exception)


def test_compressed_stream_hint_instead_of_a_bad_checksum(tmp_path: Path, good: str) -> None:
    import bz2

    packed = tmp_path / "shard.tar.bz2"
    packed.write_bytes(bz2.compress(Path(good).read_bytes()))
    err = first_error(chute, [str(packed)])
    assert isinstance(err, tarfile.ReadError)
    assert "bzip2-compressed stream" in str(err) and "checksum" not in str(err)
    text = io.BytesIO()
    text.write(b"this is plain text, not an archive\n" * 40)
    plain = tmp_path / "notes.tar"
    plain.write_bytes(text.getvalue())
    assert "bad header checksum" in str(first_error(chute, [str(plain)]))
