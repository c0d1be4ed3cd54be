"""Engine failures as the exceptions code written for webdataset and the
standard library catches, with messages that name the data and keep the C++
source location on ``err.where``."""

from __future__ import annotations

import errno
import gc
import io
import os
import pickle
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

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

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


def test_a_path_through_a_file_is_a_not_a_directory_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    through = str(plain / "shard.tar")
    for lib in (webdataset, chute):
        assert isinstance(first_error(lib, [through]), NotADirectoryError)
    err = first_error(chute, [through])
    assert (err.errno, err.filename) == (errno.ENOTDIR, through)


def link_to_itself(path: Path) -> None:
    """Makes `path` a symbolic link to itself: opening it fails with ELOOP,
    an OS error that no finer class than OSError stands for."""
    os.symlink(path.name, path)


def test_any_other_os_error_keeps_its_number_strerror_and_filename(tmp_path: Path) -> None:
    loop = tmp_path / "loop.tar"
    link_to_itself(loop)
    reference = first_error(webdataset, [str(loop)])
    err = first_error(chute, [str(loop)])
    assert isinstance(reference, OSError) and reference.errno == errno.ELOOP
    assert isinstance(err, chute.ReadError) and type(err).__name__ == "EngineReadError"
    assert (err.errno, err.strerror, err.filename) == (
        errno.ELOOP,
        os.strerror(errno.ELOOP),
        str(loop),
    )
    assert str(err) == f"cannot open '{loop}': {os.strerror(errno.ELOOP)}"


def test_a_message_that_ends_like_an_os_error_is_not_one(tmp_path: Path) -> None:
    # The command's stderr ends with ENOENT's words; the command failed, no
    # system call of chute's did.
    url = f"pipe:cat {tmp_path / 'gone.tar'}"
    err = first_error(chute, [url])
    assert str(err).endswith(": No such file or directory"), str(err)
    assert isinstance(err, chute.ReadError) and not isinstance(err, FileNotFoundError)
    assert (err.errno, err.strerror, err.filename) == (None, None, None)
    assert err.url == url


def test_a_missing_file_named_with_quotes_is_a_file_not_found_error_naming_it(
    tmp_path: Path,
) -> None:
    import h5py

    path = tmp_path / "bob's 'rows'.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(64, dtype="f8").reshape(16, 4))
    ds = chute.H5Dataset(path, {"x": "x"})
    path.unlink()  # after the dataset read its layout: the engine's open fails
    with pytest.raises(FileNotFoundError) as info:
        list(chute.DataLoader(ds, batch_size=4))
    err = info.value
    assert isinstance(err, chute.ReadError)
    assert (err.errno, err.strerror, err.filename) == (
        errno.ENOENT,
        os.strerror(errno.ENOENT),
        str(path),
    )
    assert str(err) == f"cannot open '{path}': No such file or directory"


def test_a_token_file_that_is_missing_is_a_file_not_found_error(tmp_path: Path) -> None:
    index = tmp_path / "tokens.idx"
    index.write_bytes(b"MMIDIDX\x00\x00")  # its .bin is missing: the engine opens that first
    with pytest.raises(FileNotFoundError) as info:
        chute.TokenDataset(str(index), 16)
    err = info.value
    assert isinstance(err, chute.ReadError)
    assert (err.errno, err.filename) == (errno.ENOENT, str(tmp_path / "tokens.bin"))
    assert str(err) == f"cannot open '{tmp_path / 'tokens.bin'}': No such file or directory"
    # The engine's own class carries the number too, its message unchanged.
    with pytest.raises(chute.ReadError) as raw:
        chute._core.TokenFile(str(tmp_path / "tokens.bin"), "raw", "uint16", "")
    assert (raw.value.errno, raw.value.filename) == (errno.ENOENT, str(tmp_path / "tokens.bin"))
    assert str(raw.value).startswith(f"cannot open '{tmp_path / 'tokens.bin'}': No such file")


def test_os_errors_pickle_with_their_number_and_filename(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone.tar")
    err = first_error(chute, [missing])
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err) and str(copy) == str(err)
    assert (copy.errno, copy.strerror, copy.filename) == (err.errno, err.strerror, missing)
    assert (copy.failure_scope, copy.url, copy.where) == ("read", missing, err.where)


def passed_on(sample: Any) -> Any:
    return sample


def test_os_errors_cross_chute_worker_processes_with_their_number(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone.tar")
    ds = chute.WebDataset([missing], shardshuffle=False).map(passed_on)  # Python work: workers
    with pytest.raises(FileNotFoundError) as info:
        list(chute.DataLoader(ds, batch_size=None, num_workers=1))
    assert (info.value.errno, info.value.filename) == (errno.ENOENT, missing)
    assert isinstance(info.value, chute.ReadError)


def test_handlers_get_os_errors_with_their_number(good: str, tmp_path: Path) -> None:
    loop = tmp_path / "loop.tar"
    link_to_itself(loop)
    seen: list[BaseException] = []

    def keep_going(error: BaseException) -> bool:
        seen.append(error)
        return True

    ds = chute.WebDataset([str(loop), good], shardshuffle=False, handler=keep_going)
    assert len(list(ds)) == 10
    (err,) = seen
    assert (err.errno, err.filename) == (errno.ELOOP, str(loop))
    # The indexed engine's skipped samples: the shard is replaced after it was indexed.
    shard = tmp_path / "shard.tar"
    shard.write_bytes(Path(good).read_bytes())
    seen.clear()
    indexed = chute.TarDataset(str(shard), handler=keep_going)
    shard.unlink()
    link_to_itself(shard)
    assert list(chute.DataLoader(indexed, batch_size=5)) == []
    assert len(seen) == 10
    assert {(e.errno, e.filename) for e in seen} == {(errno.ELOOP, str(shard))}
    assert sorted(e.sample_index for e in seen) == list(range(10))


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
