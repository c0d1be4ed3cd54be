"""The stream engine routes each failure to the handler of its scope (a
decode stage's for a member that does not decode, the dataset's for reading
a shard, a ``to_tuple``'s for a missing field) by the scope and place the
engine sets on it, never by the words of its message: the data here lies in
a folder named "a tar archive", words that once sent any failure to the
read handler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset
from chute.common.errors import MemberDecodeError, failure_scope
from conftest import png_bytes, shard_with_a_cut_jpeg
from helpers import CollectingHandler, refusing_handler

BAD = 4  # the sample (row) whose image does not decode


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    return tmp_path / "a tar archive"


@pytest.fixture()
def shard(folder: Path) -> str:
    return shard_with_a_cut_jpeg(folder, BAD)


def test_a_member_that_does_not_decode_goes_to_the_decode_handler(shard: str) -> None:
    decode = CollectingHandler()
    ds = chute.WebDataset(shard, shardshuffle=False, handler=refusing_handler)
    keys = [s[0] for s in ds.decode("rgb8", handler=decode).to_tuple("__key__", "jpg")]
    theirs = webdataset.WebDataset(shard, shardshuffle=False, handler=webdataset.reraise_exception)
    expected = [
        s[0]
        for s in theirs.decode("rgb8", handler=webdataset.ignore_and_continue).to_tuple(
            "__key__", "jpg"
        )
    ]
    assert keys == expected == [f"img{i:06d}" for i in range(8) if i != BAD]
    [error] = decode.errors
    assert isinstance(error, MemberDecodeError) and isinstance(error, wds.DecodingError)
    assert failure_scope(error) == "member"
    assert (error.url, error.key, error.k) == (shard, "img000004", "jpg")
    assert (error.member, error.sample_key) == ("img000004.jpg", "img000004")


def test_a_read_failure_goes_to_the_dataset_handler(shard: str, folder: Path) -> None:
    # Words of a member's failure in the shard's very name.
    cut = folder / "member 'x.jpg' at offset 0: x.tar"
    cut.write_bytes(Path(shard).read_bytes()[:1700])
    read = CollectingHandler()
    ds = chute.WebDataset(str(cut), shardshuffle=False, handler=read)
    # The sample cut short is delivered as far as it was read, as webdataset does.
    assert list(ds.decode("rgb8", handler=refusing_handler).to_tuple("__key__")) == [("img000000",)]
    [error] = read.errors
    assert failure_scope(error) == "read" and getattr(error, "url", None) == str(cut)
    assert not isinstance(error, MemberDecodeError)


def test_a_missing_field_goes_to_the_to_tuple_handler(shard: str) -> None:
    field = CollectingHandler()
    ds = chute.WebDataset(shard, shardshuffle=False, handler=refusing_handler)
    assert list(ds.to_tuple("png", "cls", handler=field)) == []
    assert len(field.errors) == 8
    error: Any = field.errors[0]
    assert failure_scope(error) == "field"
    assert (error.url, error.sample_key, error.member) == (shard, "img000000", None)
    assert failure_scope(ValueError("not the engine's")) == "other"


def test_a_parquet_stream_row_that_does_not_decode_goes_to_the_decode_handler(
    folder: Path,
) -> None:
    rng = np.random.default_rng(6)
    blobs = [png_bytes(rng, 4, 6) for _ in range(8)]
    blobs[BAD] = b"not an image"
    folder.mkdir()
    path = folder / "rows.parquet"
    pq.write_table(pa.table({"raw": pa.array(blobs, pa.binary())}), path, row_group_size=3)
    decode = CollectingHandler()
    ds = wds.ParquetStream(str(path), handler=refusing_handler, shardshuffle=False)
    assert len(list(ds.decode("rgb8", handler=decode).to_tuple("raw"))) == 7
    [error] = decode.errors
    assert isinstance(error, MemberDecodeError) and failure_scope(error) == "member"
    # The file (not its row group's shard url), the column, the row's key.
    assert (error.url, error.member, error.k, error.sample_key) == (str(path), "raw", "raw", "4")
