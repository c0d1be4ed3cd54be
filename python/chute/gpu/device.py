"""Batches handed to a CUDA device (``chute.DataLoader(..., device="cuda")``).

The pattern of apex's data_prefetcher and Lightning: while the user's step
runs on the device, the next batch is copied there on a side CUDA stream
(``non_blocking=True``, from page-locked memory, so the copy engine does it
while the step computes). When a batch is handed over, the stream the user
works on (the current stream) waits on the copy's event, and each tensor
is marked as used on that stream (``record_stream``), so the caching
allocator does not reuse its memory for a later copy before the user's work
on it is done. The host batch is kept until its copy has finished: its
memory (an arena of the engine or of a worker) is reused only then.

Every tensor of a batch is moved, in tuples, lists, dicts and namedtuples
at any depth; everything else (ints, strings, numpy arrays) stays as it is.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

# Batches copied ahead of the one the user works on.
AHEAD = 1

_NO_STATE = object()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def handoff_device(device: str | int | torch.device | None) -> torch.device | None:
    """The device batches are handed to: None for none (``None`` or a CPU
    device); a CUDA device, its index left out for the current device at
    the start of each iteration. ValueError for other devices and where
    CUDA is not available."""
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"chute.DataLoader: device={device!r} is not a device ({exc})") from None
    if resolved.type == "cpu":
        return None
    if resolved.type != "cuda":
        raise ValueError(
            f"chute.DataLoader: device={device!r}: batches are handed to CUDA devices only "
            "('cuda', 'cuda:N'); 'cpu' or None keeps them in host memory"
        )
    if not cuda_available():
        raise ValueError(
            f"chute.DataLoader: device={device!r}, but CUDA is not available here "
            "(torch.cuda.is_available() is False); pass device=None or 'cpu' to keep "
            "batches in host memory"
        )
    return resolved


def move_tensors(batch: Any, move: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`batch` with `move` applied to every tensor it holds (in tuples,
    namedtuples, lists and dicts); anything else is kept as it is."""
    kind = type(batch)
    if isinstance(batch, torch.Tensor):
        return move(batch)
    if kind is tuple or kind is list:
        return kind([move_tensors(v, move) for v in batch])
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return kind(*(move_tensors(v, move) for v in batch))
    if isinstance(batch, dict):
        moved = {k: move_tensors(v, move) for k, v in batch.items()}
        return moved if kind is dict else kind(moved)
    return batch


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor `batch` holds, where `move_tensors` looks for them."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            yield from tensors_in(v)
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from tensors_in(v)


class CopyEvents(NamedTuple):
    """The two ends of one batch's copy on the side stream."""

    begun: Any
    ended: Any


@dataclass
class TransferFigures:
    """What handing batches over cost (``stats()``'s ``transfer_*``)."""

    host_seconds: float = 0.0  # the loop's thread starting copies and handing them over
    device_seconds: float = 0.0  # the copies themselves, timed on the device
    bytes: int = 0

    def as_stats(self) -> dict[str, Any]:
        return {
            "transfer_host_seconds": self.host_seconds,
            "transfer_seconds": self.device_seconds,
            "transfer_bytes": self.bytes,
        }


class CudaCopies:
    """Copies to one CUDA device on a side stream of its own: `device`
    without an index means the current device (as ``tensor.to("cuda")``
    does; under DDP each rank sets its own with ``torch.cuda.set_device``)."""

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]

    def start(self, batch: Any) -> tuple[Any, CopyEvents]:
        """`batch` on the device (its copy enqueued on the side stream) and
        the events that mark the copy's start and end."""
        with torch.cuda.stream(self.stream):
            begun = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begun.record(self.stream)
            moved = move_tensors(batch, lambda t: t.to(self.device, non_blocking=True))
            ended = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ended.record(self.stream)
        return moved, CopyEvents(begun, ended)

    def hand_over(self, moved: Any, event: Any) -> Any:
        """`moved`, for use on the current stream: that stream waits for the
        copy, and the tensors' memory is not reused before its work on them
        is done."""
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event.ended)
        for tensor in tensors_in(moved):
            if tensor.device == self.device:
                tensor.record_stream(consumer)
        return moved

    def finished(self, event: Any) -> bool:
        return bool(event.ended.query())

    def wait(self, event: Any) -> None:
        event.ended.synchronize()

    def seconds(self, event: Any) -> float:
        """How long a finished copy took on the device."""
        return float(event.begun.elapsed_time(event.ended)) / 1e3


class DeviceBatches(Iterator[Any]):
    """The batches of `source` on a device (through `copies`, a
    `CudaCopies`), `AHEAD` of them copying while the user works on the
    current one.

    `state` (when given) tells the source's resumable state; the state
    before each batch is pulled is kept with it, so that `state()` is that
    of the batches handed to the user, not of those copied ahead."""

    def __init__(
        self,
        source: Iterator[Any],
        copies: Any,
        state: Callable[[], Any] | None = None,
    ) -> None:
        self.source = source
        self.copies = copies
        self.source_state = state
        self.exhausted = False
        # (batch on the device, its copy's event, the host batch, the state before it)
        self.ahead: deque[tuple[Any, Any, Any, Any]] = deque()
        # (event, host batch): handed over, the host memory kept until the copy ends
        self.copying: list[tuple[Any, Any]] = []
        self.figures = TransferFigures()

    def __next__(self) -> Any:
        self._fill()
        if not self.ahead:
            self.close()
            raise StopIteration
        moved, event, host, _ = self.ahead.popleft()
        self.copying.append((event, host))
        del host
        started = time.perf_counter()
        batch = self.copies.hand_over(moved, event)
        self.figures.host_seconds += time.perf_counter() - started
        self._fill()  # the next copies run while the user's step does
        still: list[tuple[Any, Any]] = []
        for e, h in self.copying:
            if self.copies.finished(e):
                self.figures.device_seconds += self.copies.seconds(e)
            else:
                still.append((e, h))
        self.copying = still
        return batch

    def _fill(self) -> None:
        while not self.exhausted and len(self.ahead) < AHEAD:
            state = self._capture_state()
            try:
                host = next(self.source)
            except StopIteration:
                self.exhausted = True
                return
            started = time.perf_counter()
            moved, event = self.copies.start(host)
            self.figures.host_seconds += time.perf_counter() - started
            self.figures.bytes += sum(t.nbytes for t in tensors_in(host))
            self.ahead.append((moved, event, host, state))

    def _capture_state(self) -> Any:
        if self.source_state is None:
            return _NO_STATE
        try:
            return self.source_state()
        except Exception as exc:  # noqa: BLE001 - raised when the state is asked for
            return exc

    def state(self) -> Any:
        """The source's state as of the batches handed over: the one taken
        before the oldest batch copied ahead was pulled; the source's own
        when none is ahead. Raises what taking it raised."""
        if not self.ahead:
            assert self.source_state is not None
            return self.source_state()
        state = self.ahead[0][3]
        if isinstance(state, Exception):
            raise state
        return state

    def close(self) -> None:
        """Waits for the copies under way, then lets go of their batches
        and of the source."""
        for _, event, _, _ in self.ahead:
            self.copies.wait(event)
        for event, _ in self.copying:
            self.copies.wait(event)
            self.figures.device_seconds += self.copies.seconds(event)
        self.ahead.clear()
        self.copying.clear()
        self.exhausted = True
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
