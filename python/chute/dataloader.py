"""``chute.DataLoader``: torch's DataLoader signature, run on the engine.

Datasets that implement ``chute.loading.EngineDataset`` run on the engine:

- index-driven ones (``H5Dataset``, ``ArrayDataset``): torch's own sampler
  machinery produces the index batches (so the order is torch's, including
  the base-seed draw from ``generator`` that every torch iterator makes
  first), and the engine reads each index batch on native threads.
- the others (``WebDataset``): iterated in this process; ``num_workers``
  becomes the number of native decode threads instead of worker processes.

Any other dataset is handed to ``torch.utils.data.DataLoader`` unchanged.

Argument checking and ``len()`` are torch's: a torch DataLoader is built with
the same arguments (that spawns nothing until iterated) and consulted.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import torch
import torch.utils.data

from chute.index_batches import array_index_batches
from chute.loading import EngineDataset, LoaderSettings
from chute.shards import rank_and_world_size

logger = logging.getLogger("chute")
_told_fallback = False


def _state_kind(native: EngineDataset | None) -> str | None:
    """The tag of a loader's state dict: whose position it holds."""
    if native is None:
        return None
    return "indexed" if native.index_driven else "stream"


class DataLoader:
    """Same arguments as ``torch.utils.data.DataLoader``, plus:

    - ``distributed``: partition a map-style dataset across ranks exactly as
      ``torch.utils.data.DistributedSampler(shuffle=shuffle, seed=seed,
      drop_last=drop_last)`` does (shuffling unless ``shuffle=False``, as
      DistributedSampler does); call ``set_epoch`` each epoch.
    - ``seed``: the DistributedSampler seed.
    - ``progress``: show a progress bar with samples/s (tqdm when installed).

    ``state_dict()``/``load_state_dict()`` resume mid-epoch at the next unseen
    batch: the next iteration replays the same order and skips what was seen.
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
        progress: bool = False,
    ) -> None:
        global _told_fallback
        native = dataset if isinstance(dataset, EngineDataset) else None
        if distributed and (native is None or native.index_driven):
            # The partition of torch's DistributedSampler, by construction: rank
            # and world size from torch.distributed, else RANK/WORLD_SIZE.
            if sampler is not None or batch_sampler is not None:
                raise ValueError(
                    "distributed=True builds its own DistributedSampler: pass either "
                    "distributed=True or your own sampler/batch_sampler, not both"
                )
            rank, world_size = rank_and_world_size()
            sampler = torch.utils.data.DistributedSampler(
                dataset,
                num_replicas=world_size,
                rank=rank,
                # DistributedSampler's own default: shuffle unless told not to.
                shuffle=True if shuffle is None else bool(shuffle),
                seed=seed,
                drop_last=drop_last,
            )
            shuffle = None
        self.distributed = distributed
        with warnings.catch_warnings():
            if native is not None:
                # For chute's datasets num_workers counts native threads, not
                # processes: torch's "too many worker processes" advice is moot.
                warnings.filterwarnings("ignore", message="This DataLoader will create")
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
        self.progress = progress
        self._native = native
        self._position: dict[str, Any] | None = None  # the running iteration's
        self._resume: dict[str, Any] | None = None
        if native is None and not _told_fallback:
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
        reached: list[object] = []
        for target in (self.sampler, getattr(self.batch_sampler, "sampler", None), self.dataset):
            fn = getattr(target, "set_epoch", None)
            if callable(fn) and not any(target is r for r in reached):
                reached.append(target)
                fn(epoch)

    def _settings(self) -> LoaderSettings:
        return LoaderSettings(
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            collate_fn=self.collate_fn,
            threads=self.threads,
            prefetch=self.threads * self.prefetch_factor,
            timeout=float(self.timeout),
            pin_memory=self.pin_memory,
        )

    def __iter__(self) -> Iterator[Any]:
        native = self._native
        if native is not None and not native.index_driven:
            items = self._iterate_self_driven(native)
        elif native is not None and self._torch._auto_collation:
            items = self._iterate_indexed(native)
        else:
            if self._resume is not None:
                raise ValueError("load_state_dict() resumes chute datasets only")
            items = iter(self._torch)
        return (
            with_progress(items, len(self) if self._has_len() else None) if self.progress else items
        )

    def _has_len(self) -> bool:
        try:
            len(self)
        except TypeError:
            return False
        return True

    def _iterate_self_driven(self, native: EngineDataset) -> Iterator[Any]:
        if self._resume is not None:
            native.load_loader_state(self._resume["dataset"])
            self._resume = None
        yield from native.loader_batches(self._settings(), None)

    def _iterate_indexed(self, native: EngineDataset) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        generator = self.generator
        if resume is not None:
            _set_rng_state(generator, resume["rng_state"])
            if resume.get("sampler_epoch") is not None:
                self.sampler.set_epoch(resume["sampler_epoch"])
        position: dict[str, Any] = {
            "kind": "indexed",
            "rng_state": _get_rng_state(generator),
            "sampler_epoch": getattr(self.sampler, "epoch", None),
            "batches": resume["batches"] if resume is not None else 0,
        }
        # torch's iterator creates the sampler iterator, then draws its base
        # seed from `generator`, and only then runs the sampler: same here.
        index_batches: Iterator[Any] = array_index_batches(self._torch._index_sampler) or iter(
            self._torch._index_sampler
        )
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        if position["batches"]:
            index_batches = islice(index_batches, position["batches"], None)
        self._position = position
        batches = native.loader_batches(self._settings(), index_batches)
        try:
            for batch in batches:
                position["batches"] += 1
                yield batch
        finally:
            self._position = None
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def state_dict(self) -> dict[str, Any]:
        """The running iteration's position (or the start of the next epoch)."""
        native = self._native
        if native is None:
            raise ValueError("state_dict() covers chute datasets only")
        if not native.index_driven:
            return {"kind": "stream", "dataset": native.loader_state()}
        if self._position is not None:
            return dict(self._position)
        return {
            "kind": "indexed",
            "rng_state": _get_rng_state(self.generator),
            "sampler_epoch": getattr(self.sampler, "epoch", None),
            "batches": 0,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration resumes where `state` was taken."""
        expected = _state_kind(self._native)
        if state.get("kind") != expected:
            raise ValueError(
                f"state of a {state.get('kind')!r} loader given to a {expected!r} loader"
            )
        self._resume = dict(state)

    def stats(self) -> dict[str, Any]:
        """The dataset's engine figures (see README, "Stats")."""
        fn = getattr(self.dataset, "stats", None)
        return fn() if callable(fn) else {}


def _get_rng_state(generator: torch.Generator | None) -> torch.Tensor:
    # Without a generator, torch's samplers seed themselves from the global RNG.
    return generator.get_state() if generator is not None else torch.get_rng_state()


def _set_rng_state(generator: torch.Generator | None, state: torch.Tensor) -> None:
    if generator is not None:
        generator.set_state(state)
    else:
        torch.set_rng_state(state)


def with_progress(items: Iterator[Any], total: int | None) -> Iterator[Any]:
    """A progress bar counting batches and samples/s (tqdm when installed,
    else a line on stderr every second)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, unit="batch", dynamic_ncols=True)
        samples = 0
        start = time.perf_counter()
        try:
            for item in items:
                samples += _batch_rows(item)
                bar.update(1)
                bar.set_postfix(
                    samples_per_s=f"{samples / max(time.perf_counter() - start, 1e-9):,.0f}"
                )
                yield item
        finally:
            bar.close()
        return
    samples = 0
    start = last = time.perf_counter()
    for count, item in enumerate(items, start=1):
        samples += _batch_rows(item)
        now = time.perf_counter()
        if now - last >= 1.0:
            last = now
            of = f"/{total}" if total is not None else ""
            rate = samples / max(now - start, 1e-9)
            print(f"\rchute: {count}{of} batches, {rate:,.0f} samples/s", end="", file=sys.stderr)
        yield item
    print(file=sys.stderr)


def _batch_rows(batch: Any) -> int:
    """Rows in a batch: the first dimension of its first tensor or array."""
    values = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, (list, tuple))
        else [batch]
    )
    for value in values:
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
        if isinstance(value, list):
            return len(value)
    return 1
