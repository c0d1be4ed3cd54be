"""``WebLoader``: chute's DataLoader with webdataset's fluent methods."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from chute.loader.dataloader import DataLoader
from chute.stream.fluent import Fluent
from chute.wds.dataset import WebDataset
from chute.wds.run import EMPTY_MESSAGE


class WebLoader(Fluent, DataLoader):  # type: ignore[type-arg]
    """webdataset's WebLoader: a DataLoader with the fluent methods
    (``.batched``, ``.unbatched``, ``.shuffle``, ``.map``, ``.with_epoch``,
    ``.repeat``...) applied in Python to what it yields. As in webdataset,
    the stages restart with each pass over the DataLoader, and an epoch of
    ``with_epoch(n)`` passes over it as often as it takes to yield `n`. The
    DataLoader is chute's: a chute dataset's Python stages run on
    ``num_workers`` worker processes in the order of one process (see
    ``chute.DataLoader``); any other dataset goes to torch's. As webdataset's
    does, it raises when ``num_workers`` exceeds a WebDataset's shards (its
    empty_check: one of webdataset's workers would get no shard)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stages = []

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        items = self._passes()
        if self.repetitions != 1 and self.epoch_items > 0:
            items = islice(items, self.epoch_items)
        return items

    def _passes(self) -> Iterator[Any]:
        dataset = self.dataset
        if isinstance(dataset, WebDataset) and dataset.leaves_a_worker_without_shards(
            self.num_workers
        ):
            # webdataset's worker processes split the shards; one left
            # without fails its empty_check.
            raise ValueError(EMPTY_MESSAGE)
        for _ in range(self.repetitions):
            items: Iterator[Any] = super().__iter__()
            for stage in self.stages:
                items = stage(items)
            count = 0
            for item in items:
                count += 1
                yield item
            if count == 0:
                return
