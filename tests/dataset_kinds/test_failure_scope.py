"""Index-driven datasets route a member that does not decode to the decode
stage's handler, as a ``MemberDecodeError`` naming its url and member, by
the scope and place the engine sets on the failure, not by its message's
words: the data here lies in a folder named "a tar archive", words that
once sent a failure to the read handler."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chute.common.errors import MemberDecodeError, failure_scope
from conftest import png_bytes, shard_with_a_cut_jpeg
from helpers import CollectingHandler, refusing_handler

BAD = 4  # the sample (row) whose image does not decode


@pytest.fixture()
def shard(tmp_path: Path) -> str:
    return shard_with_a_cut_jpeg(tmp_path / "a tar archive", BAD)


@pytest.fixture()
def parquet(tmp_path: Path) -> str:
    rng = np.random.default_rng(6)
    images = [png_bytes(rng, 6, 5) for _ in range(8)]
    images[BAD] = images[BAD][:30]
    folder = tmp_path / "a tar archive"
    folder.mkdir()
    path = folder / "images.parquet"
    table = pa.table({"image": pa.array(images, pa.binary()), "label": pa.array(range(8))})
    pq.write_table(table, path, row_group_size=3)
    return str(path)


def check_member_error(error: BaseException, url: str, member: str, key: str, k: str) -> None:
    assert isinstance(error, MemberDecodeError), type(error)
    assert isinstance(error, wds.DecodingError) and isinstance(error, chute.DataError)
    assert failure_scope(error) == "member"
    assert (error.url, error.member, error.sample_key) == (url, member, key)
    assert (error.key, error.k) == (key, k)


def test_tar_dataset_member_that_does_not_decode_names_url_and_member(shard: str) -> None:
    ds = chute.TarDataset(shard, decode="rgb8", fields=("jpg", "cls"))
    with pytest.raises(MemberDecodeError) as info:
        ds[BAD]
    check_member_error(info.value, shard, "img000004.jpg", "img000004", "jpg")
    with pytest.raises(MemberDecodeError) as info:
        list(chute.DataLoader(ds, batch_size=3))
    check_member_error(info.value, shard, "img000004.jpg", "img000004", "jpg")


def test_tar_dataset_member_failure_goes_to_the_decode_handler(shard: str) -> None:
    decode = CollectingHandler()
    ds = chute.TarDataset(shard, decode="rgb8", fields=("jpg", "cls"), handler=decode)
    # One handler for every scope through TarDataset's arguments; told apart
    # here, the failure must reach the decode stage's.
    ds._handlers = dataclasses.replace(ds._handlers, read=refusing_handler, field=refusing_handler)
    batches = list(chute.DataLoader(ds, batch_size=3))
    assert sum(len(b[1]) for b in batches) == 7
    assert len(decode.errors) == 1
    check_member_error(decode.errors[0], shard, "img000004.jpg", "img000004", "jpg")


def test_parquet_image_that_does_not_decode_names_file_and_column(parquet: str) -> None:
    ds = chute.ParquetDataset(parquet, decode={"image": "rgb8"})
    with pytest.raises(MemberDecodeError) as info:
        ds[BAD]
    check_member_error(info.value, parquet, "image", str(BAD), "image")
    decode = CollectingHandler()
    ds = chute.ParquetDataset(parquet, decode={"image": "rgb8"}, handler=decode)
    ds._handlers = dataclasses.replace(ds._handlers, read=refusing_handler, field=refusing_handler)
    rows = [b["label"].tolist() for b in chute.DataLoader(ds, batch_size=3)]
    assert sum(rows, []) == [i for i in range(8) if i != BAD]
    assert len(decode.errors) == 1
    check_member_error(decode.errors[0], parquet, "image", str(BAD), "image")
