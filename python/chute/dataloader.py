"""``chute.DataLoader``: torch's DataLoader signature, run on the engine.

- chute's map-style datasets (``H5Dataset``, ``ArrayDataset``): torch's own
  sampler machinery produces the index batches (so the order is torch's,
  including the base-seed draw from ``generator`` that every torch iterator
  makes first), and the engine reads each index batch on native threads.
- chute's ``WebDataset``: iterated in this process; ``num_workers`` becomes
  the number of native decode threads instead of worker processes.
- Any other dataset is handed to ``torch.utils.data.DataLoader`` unchanged.

Argument checking and ``len()`` are torch's: a torch DataLoader is built with
the same arguments (that spawns nothing until iterated) and consulted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import default_collate, default_convert

from chute.shards import rank_and_world_size
from chute.webdataset import WebDataset

logger = logging.getLogger("chute")
_told_fallback = False


def _native_kind(dataset: object) -> str | None:
    from chute.indexed import IndexedDataset

    if isinstance(dataset, WebDataset):
        return "stream"
    if isinstance(dataset, IndexedDataset):
        return "indexed"
    return None


class DataLoader:
    """Same arguments as ``torch.utils.data.DataLoader``, plus:

    - ``distributed``: partition a map-style dataset across ranks exactly as
      ``torch.utils.data.DistributedSampler(shuffle=shuffle, seed=seed,
      drop_last=drop_last)`` does; call ``set_epoch`` each epoch.
    - ``seed``: the DistributedSampler seed.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: torch.utils.data.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: torch.utils.data.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        distributed: bool = False,
        seed: int = 0,
    ) -> None:
        global _told_fallback
        if distributed and _native_kind(dataset) != "stream":
            # The partition of torch's DistributedSampler, by construction: rank
            # and world size from torch.distributed, else RANK/WORLD_SIZE.
            if sampler is not None or batch_sampler is not None:
                raise ValueError("distributed=True builds its own sampler; pass sampler= instead")
            rank, world_size = rank_and_world_size()
            sampler = torch.utils.data.DistributedSampler(
                dataset,
                num_replicas=world_size,
                rank=rank,
                shuffle=bool(shuffle),
                seed=seed,
                drop_last=drop_last,
            )
            shuffle = None
        self.distributed = distributed
        self._torch = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.dataset = dataset
        self.batch_size = self._torch.batch_size
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.drop_last = drop_last
        self.timeout = timeout
        self.generator = generator
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else 2
        self._kind = _native_kind(dataset)
        if self._kind is None and not _told_fallback:
            _told_fallback = True
            logger.info(
                "chute.DataLoader: %s is not a chute dataset; using torch.utils.data.DataLoader",
                type(dataset).__name__,
            )

    @property
    def sampler(self) -> Any:
        return self._torch.sampler

    @property
    def batch_sampler(self) -> Any:
        return self._torch.batch_sampler

    @property
    def threads(self) -> int:
        """Native threads: num_workers, and at least one."""
        return max(1, self.num_workers)

    def __len__(self) -> int:
        return len(self._torch)

    def set_epoch(self, epoch: int) -> None:
        """Reaches the sampler and the dataset, whichever of them has ``set_epoch``."""
        for target in (self.sampler, getattr(self.batch_sampler, "sampler", None), self.dataset):
            fn = getattr(target, "set_epoch", None)
            if callable(fn):
                fn(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._kind == "stream":
            return self._iterate_stream()
        if self._kind == "indexed" and self._torch._auto_collation:
            return self._iterate_indexed()
        return iter(self._torch)

    def _iterate_stream(self) -> Iterator[Any]:
        items = self.dataset.iterate(
            threads=self.threads,
            prefetch=self.threads * self.prefetch_factor,
            timeout=float(self.timeout),
        )
        try:
            if self.batch_size is None:
                for item in items:
                    yield default_convert(item)  # type: ignore[no-untyped-call]  # torch: unannotated
                return
            collate = self.collate_fn or default_collate
            batch: list[Any] = []
            for item in items:
                batch.append(item)
                if len(batch) == self.batch_size:
                    yield collate(batch)
                    batch = []
            if batch and not self.drop_last:
                yield collate(batch)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _index_batches(self) -> Iterator[list[int]]:
        # torch's iterator creates the sampler iterator, then draws its base
        # seed from `generator`, and only then runs the sampler: same here.
        sampler_iter: Iterator[list[int]] = iter(self._torch._index_sampler)
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        return sampler_iter

    def _iterate_indexed(self) -> Iterator[Any]:
        batches = self.dataset.iter_batches(
            self._index_batches(),
            num_threads=self.threads,
            prefetch=self.threads * self.prefetch_factor,
            timeout=float(self.timeout),
        )
        if self.collate_fn is None:
            yield from batches
            return
        # A custom collate_fn: the documented slow path, rows handed over one by one.
        for batch in batches:
            n = len(next(iter(batch.values()))) if batch else 0
            rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
            yield self.collate_fn(rows)

    def stats(self) -> dict[str, Any]:
        fn = getattr(self.dataset, "stats", None)
        return fn() if callable(fn) else {}
