"""What the framework runs share: the data (1,000 samples with an id, as
arrays and as 10 tar shards, written by conftest.py), the two loaders each
run trains on (map-style and a stream), and the record each rank writes."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import torch

BATCH = 32
SHARDS = 10


def arrays(data: Path) -> chute.ArrayDataset:
    return chute.ArrayDataset(x=np.load(data / "x.npy"), id=np.load(data / "id.npy"))


def stream(data: Path, length: int | None = None) -> Any:
    """The shards shuffled (shards and a buffer), split across ranks (the
    default even_batches="cap": every rank the same batch count)."""
    ds = (
        chute.WebDataset(
            [str(data / f"shard-{i:06d}.tar") for i in range(SHARDS)],
            shardshuffle=True,
            seed=3,
            nodesplitter=wds.split_by_node,
        )
        .shuffle(100)
        .decode()
        .to_tuple("x.npy", "id.cls")
        .batched(BATCH)
    )
    return ds if length is None else ds.with_length(length, silent=True)


def ids_of(batch: Any) -> list[int]:
    ids = batch["id"] if isinstance(batch, dict) else batch[1]
    return [int(i) for i in torch.as_tensor(ids).tolist()]


def inputs_of(batch: Any) -> torch.Tensor:
    return torch.as_tensor(batch["x"] if isinstance(batch, dict) else batch[0])


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


@contextmanager
def chute_warnings(record: dict[str, Any]) -> Iterator[None]:
    """Collects the warnings of chute's own categories into record["warnings"]."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    record["warnings"] = sorted(
        {w.category.__name__ for w in caught if w.category.__module__.startswith("chute")}
    )


def write(out: Path, record: dict[str, Any]) -> None:
    (out / f"rank{rank()}.json").write_text(json.dumps(record))
