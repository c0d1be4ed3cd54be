"""Index-driven datasets on worker processes.

The loader draws the index batches from its sampler, as it does without
workers, and deals them round-robin: batch ``b`` goes to worker
``b % num_workers``, each worker holding ``prefetch`` of them at a time.
A worker reads its batches with its own engine and runs their Python work
(members decoded in Python, a custom ``collate_fn``); the loader takes the
results back in the order it dealt them, so the batches, their order and a
resumed position are those of a loader without workers.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from chute.loader.protocol import LoaderSettings
from chute.workers.failures import Failure, caught_warnings
from chute.workers.main import Interrupted, Outgoing, WorkerContext
from chute.workers.transport import pack

if TYPE_CHECKING:
    from chute.workers.pool import WorkerPool

# Results are bounded by the index batches dealt, not by credits.
_UNBOUNDED = 1 << 62


class WorkerDataset(Protocol):
    """What the workers ask of an index-driven dataset (``IndexedDataset``
    implements it; see its methods of the same names)."""

    def worker_epoch(self) -> Any: ...

    def enter_worker_epoch(self, state: Any) -> None: ...

    def loader_batch_outputs(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]]
    ) -> Generator[tuple[list[Any], bool], None, None]: ...

    def stats(self) -> dict[str, Any]: ...


class WorkerBatches(Iterator[Any]):
    """One epoch of an index-driven dataset on `pool`'s workers."""

    def __init__(
        self,
        pool: WorkerPool,
        dataset: WorkerDataset,
        settings: LoaderSettings,
        index_batches: Iterable[Sequence[int]],
    ) -> None:
        self.pool = pool
        self.timeout = settings.timeout
        # The workers' engines do not pin: the loader pins their arenas.
        self.pin = settings.pin_memory
        spec = {
            "settings": dataclasses.replace(
                settings,
                collate_fn=None,
                threads=pool.threads,
                prefetch=pool.prefetch,
                pin_memory=False,
            ),
            "collate": settings.collate_fn is not None,
            "epoch": dataset.worker_epoch(),
        }
        self.tag = pool.new_task("indexed", spec, _UNBOUNDED)
        self.source = iter(index_batches)
        self.exhausted = False
        self.dealt = 0
        self.taken = 0
        self.ready: list[Any] = []  # results of the batch being handed out
        self.finished = False
        self.worker_stats: dict[int, dict[str, Any]] = {}

    def _deal(self) -> None:
        pool = self.pool
        ahead = pool.prefetch * pool.num_workers
        while not self.exhausted and self.dealt - self.taken < ahead:
            try:
                indices = next(self.source)
            except StopIteration:
                self.exhausted = True
                for worker in range(pool.num_workers):
                    pool.send(worker, ("end", self.tag))
                return
            pool.send(self.dealt % pool.num_workers, ("indices", self.tag, np.asarray(indices)))
            self.dealt += 1

    def __next__(self) -> Any:
        while not self.ready:
            if self.finished:
                raise StopIteration
            self._next_batch()
        return self.ready.pop(0)

    def _next_batch(self) -> None:
        try:
            self._deal()
            if self.exhausted and self.taken == self.dealt:
                self.close()
                return
            worker = self.taken % self.pool.num_workers
            message = self.pool.receive(worker, self.tag, self.timeout)
            self.taken += 1
            if message[0] == "error":
                failure: Failure = message[2]
                failure.reraise()
            if message[0] == "end":  # the worker's dataset stopped the epoch
                self.close()
                return
            body = message[2]
            for caught in body["warnings"]:
                caught.reissue()
            self.worker_stats[worker] = body["stats"]
            self.ready = self.pool.unpack(worker, body["items"], self.pin)
            if body["stop"]:
                self.close()
            if body["error"] is not None:
                self.close()
                body["error"].reraise()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            if self.pool.alive:
                self.pool.stop_task(self.tag)

    def stats(self) -> dict[str, Any]:
        """The workers' dataset counters, added up."""
        out: dict[str, Any] = {}
        for figures in self.worker_stats.values():
            for key, value in figures.items():
                if isinstance(value, (int, float)):
                    out[key] = out.get(key, 0) + value
        return out


def indexed_task(
    dataset: WorkerDataset, spec: dict[str, Any], context: WorkerContext
) -> Iterator[Outgoing]:
    """A worker's part of an epoch: its index batches, each turned into what
    the loader yields for it (see `IndexedDataset.loader_batch_outputs`)."""
    settings: LoaderSettings = spec["settings"]
    if spec["collate"]:
        settings = dataclasses.replace(settings, collate_fn=context.collate_fn)
    dataset.enter_worker_epoch(spec["epoch"])

    def index_batches() -> Iterator[Any]:
        while (indices := context.next_indices()) is not None:
            yield indices

    outputs = dataset.loader_batch_outputs(settings, index_batches())
    try:
        while True:
            error = None
            results: list[Any] = []
            stop = False
            with warnings.catch_warnings(record=True) as records:
                warnings.simplefilter("always")
                try:
                    results, stop = next(outputs)
                except StopIteration:
                    yield Outgoing(("end", context.tag))
                    return
                except Interrupted:
                    raise
                except Exception as exc:  # noqa: BLE001 - raised by the loader in its place
                    error = Failure.capture(exc, context.where)
            packed, fd = pack(results, context.arenas)
            del results
            body = {
                "items": packed,
                "stop": stop,
                "error": error,
                "warnings": caught_warnings(records),
                "stats": dataset.stats(),
            }
            yield Outgoing(("out", context.tag, body), fd)
            if error is not None or stop:
                return
    finally:
        outputs.close()
