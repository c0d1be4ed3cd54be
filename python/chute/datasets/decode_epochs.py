"""The epoch that a map-style dataset's random decoding draws from.

Random crops and flips draw from (seed, epoch, sample), so an epoch's draws
are the same whatever the threads or workers. Which epoch: the one
``set_epoch`` set (``chute.DataLoader.set_epoch`` reaches it), else the one
after the last; a worker process takes the epoch its loader dealt it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from chute.datasets.indexed import IndexedDataset
from chute.loader.protocol import LoaderSettings


class DecodeEpochs(IndexedDataset):
    """The base of the datasets whose decoding draws per epoch."""

    _epoch = 0
    _epoch_set = False
    _draw_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the decoders' random draws (``chute.DataLoader.set_epoch``
        reaches it)."""
        self._epoch = int(epoch)
        self._epoch_set = True
        self._draw_epoch = self._epoch

    def _begin_epoch(self) -> None:
        """A loader's epoch begins: its draws use the epoch set, else the
        next one."""
        self._draw_epoch = self._epoch
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        self._begin_epoch()
        return super().loader_batches(settings, index_batches)

    def worker_epoch(self) -> Any:
        self._begin_epoch()
        return self._draw_epoch

    def enter_worker_epoch(self, state: Any) -> None:
        self._draw_epoch = int(state)
