"""The protocol between ``chute.DataLoader`` and the datasets it runs on the
engine: a dataset that implements `EngineDataset` is iterated by chute; any
other dataset is handed to torch's DataLoader."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from chute.workers.main import Outgoing, WorkerContext
    from chute.workers.pool import WorkerPool


@dataclass(frozen=True)
class LoaderSettings:
    """What ``chute.DataLoader`` asks of one epoch, in torch's terms."""

    batch_size: int | None
    drop_last: bool
    collate_fn: Callable[[list[Any]], Any] | None  # None: torch's default collation
    threads: int  # native threads (the loader's num_workers, at least one)
    prefetch: int  # batches in flight
    timeout: float  # seconds to wait for one batch; 0: no limit
    pin_memory: bool
    # num_workers=0: a dataset whose batches are little more than copies may
    # make each one in the consumer's own next(), without engine threads.
    inline_reads: bool = False


class EngineDataset(ABC):
    """A dataset ``chute.DataLoader`` iterates on the engine."""

    # True: the loader's sampler draws the index batches and the dataset reads
    # them (map-style); its position is the sampler's. False: the dataset
    # orders and splits its samples across ranks itself (streams), keeps its
    # own position, and ``distributed=True`` adds no DistributedSampler.
    index_driven: ClassVar[bool]

    @abstractmethod
    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        """One epoch of batches, as torch's DataLoader with `settings` would
        yield them. `index_batches` are the sampler's batches when the dataset
        is index-driven, else None."""

    def loader_state(self, running: Iterator[Any] | None = None) -> dict[str, Any]:
        """For a loader's ``state_dict()`` (datasets that are not
        index-driven): the position of `running`, the iterator a
        ``loader_batches`` call returned, or of the next epoch when None."""
        raise ValueError(f"{type(self).__name__} keeps no position of its own")

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """Makes the next iteration resume at `state` (from `loader_state`)."""
        raise ValueError(f"{type(self).__name__} keeps no position of its own")

    # -- worker processes (see chute.workers) ---------------------------------------

    def python_work(self, settings: LoaderSettings) -> bool:
        """Whether an epoch with `settings` runs Python per sample or per
        batch that worker processes can take over (then ``num_workers > 0``
        starts them)."""
        return False

    def worker_dataset(self) -> EngineDataset:
        """The dataset the workers get a copy of."""
        return self

    def reads_remote(self) -> bool:
        """Whether reading this dataset uses the remote client (workers that
        read it then cannot start by fork once this process has used the
        client). True unless a dataset knows it reads local data only."""
        return True

    def worker_batches(
        self,
        settings: LoaderSettings,
        index_batches: Iterator[Sequence[int]] | None,
        pool: WorkerPool,
    ) -> Iterator[Any]:
        """What `loader_batches` yields, with the Python work done by the
        workers of `pool` (which hold copies of `worker_dataset()`)."""
        raise NotImplementedError(f"{type(self).__name__} runs on no worker process")

    def worker_task(self, kind: str, spec: Any, context: WorkerContext) -> Iterator[Outgoing]:
        """In a worker, on its copy of the dataset: the results of the task
        `spec` that `worker_batches` handed out."""
        raise NotImplementedError(f"{type(self).__name__} runs on no worker process")
