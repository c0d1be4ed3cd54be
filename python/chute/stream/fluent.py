"""webdataset's fluent interface, recorded: each stage method returns a copy
with one more stage (the same `Stage` that ``chute.stream.filters`` builds), and
nothing runs until the pipeline is iterated. ``with_epoch``, ``repeat`` and
``with_length`` change the pipeline itself and return it, as in webdataset.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from typing_extensions import Self

from chute.common.collate import default_collate
from chute.common.handlers import Handler, reraise_exception
from chute.stream import filters
from chute.stream.stages import Compose, Stage


class Fluent:
    """The fluent methods. WebDataset and DataPipeline compile the stages onto
    the engine; WebLoader applies them in Python to what its DataLoader
    yields. Per epoch, the stages run `repetitions` times over the source
    (each pass with its own shuffle buffers and partial last batch, as
    webdataset's), and a repeating epoch stops after `epoch_items` items."""

    stages: list[Stage]
    repetitions: int = 1
    epoch_items: int = -1
    nominal_length: int | None = None  # with_length

    def _copy(self) -> Self:
        """A copy to record one more stage on."""
        return copy.copy(self)

    def _compose(self, *stages: Stage) -> Self:
        result = self._copy()
        result.stages = [*self.stages, *stages]
        return result

    def compose(self, *fns: Stage | Callable[[Iterator[Any]], Iterator[Any]]) -> Self:
        """Append stages: recorded stages (``wds.map(f)``...) as they are,
        other callables (iterator in, iterator out) to run in Python."""
        return self._compose(*(fn if isinstance(fn, Stage) else Compose(fn) for fn in fns))

    def shuffle(self, size: int, **kw: Any) -> Self:
        if size < 1:
            return self
        return self._compose(filters.shuffle(size, **kw))

    def decode(
        self,
        *args: str | Callable[[str, bytes], Any],
        pre: Sequence[Callable[[str, bytes], Any]] | None = None,
        post: Sequence[Callable[[str, bytes], Any]] | None = None,
        only: str | Iterable[str] | None = None,
        partial: bool = False,
        handler: Handler = reraise_exception,
        size: int | tuple[int, int] | None = None,
        crop: str = "center",
        flip: bool = False,
        resize: int | None = None,
        scale: tuple[float, float] | None = None,
        ratio: tuple[float, float] | None = None,
        normalize: tuple[Any, Any] | None = None,
        dtype: torch.dtype | str | None = None,
        layout: str | None = None,
    ) -> Self:
        """See ``chute.stream.filters.decode``."""
        return self._compose(
            filters.decode(
                *args,
                handler=handler,
                pre=pre,
                post=post,
                only=only,
                partial=partial,
                size=size,
                crop=crop,
                flip=flip,
                resize=resize,
                scale=scale,
                ratio=ratio,
                normalize=normalize,
                dtype=dtype,
                layout=layout,
            )
        )

    def rename(self, keep: bool = True, handler: Handler = reraise_exception, **kw: str) -> Self:
        return self._compose(filters.rename(keep=keep, handler=handler, **kw))

    def to_tuple(self, *args: str, **kw: Any) -> Self:
        return self._compose(filters.to_tuple(*args, **kw))

    def map(self, f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Self:
        return self._compose(filters.map(f, handler=handler))

    def map_dict(self, handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> Self:
        return self._compose(filters.map_dict(handler=handler, **kw))

    def map_tuple(
        self, *fns: Callable[[Any], Any] | None, handler: Handler = reraise_exception
    ) -> Self:
        return self._compose(filters.map_tuple(*fns, handler=handler))

    def select(self, predicate: Callable[[Any], bool]) -> Self:
        return self._compose(filters.select(predicate))

    def batched(
        self,
        batchsize: int,
        collation_fn: Callable[[list[Any]], Any] | None = default_collate,
        partial: bool = True,
    ) -> Self:
        return self._compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Self:
        return self._compose(filters.unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Self:
        """Lists of `batchsize` samples, not collated."""
        return self._compose(filters.batched(batchsize, collation_fn=None, partial=partial))

    def unlisted(self) -> Self:
        return self._compose(filters.unlisted())

    def slice(self, *args: int | None) -> Self:
        return self._compose(filters.slice(*args))

    def rsample(self, p: float = 0.5) -> Self:
        return self._compose(filters.rsample(p))

    def log_keys(self, logfile: str | None = None) -> Self:
        return self._compose(filters.log_keys(logfile))

    def rename_keys(self, *args: tuple[str, str], **kw: Any) -> Self:
        return self._compose(filters.rename_keys(*args, **kw))

    def extract_keys(self, *args: str | Sequence[str], **kw: Any) -> Self:
        return self._compose(filters.extract_keys(*args, **kw))

    def xdecode(self, *args: tuple[str, Callable[[Any], Any]], **kw: Any) -> Self:
        return self._compose(filters.xdecode(*args, **kw))

    def mcached(self) -> Self:
        """Keep the items in memory after the first pass (see ``filters.Cached``)."""
        return self.compose(filters.Cached())

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Self:
        """Each epoch yields this many items (batches when batched), passing
        over the shards as often as needed, as webdataset does."""
        self.repetitions = sys.maxsize
        self.epoch_items = max(nsamples, nbatches)
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> Self:
        """Each epoch passes `nepochs` times over the shards (forever when
        not positive), stopping after `nbatches` items when positive."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.epoch_items = nbatches
        return self

    def with_length(self, n: int, silent: bool = False) -> Self:
        """Gives the pipeline a ``len()`` of `n`; its epochs do not change."""
        if not silent:
            warnings.warn(
                ".with_length() only sets the value of __len__ for compatibility with some "
                "training environments. It does not change the number of samples in an epoch.",
                stacklevel=2,
            )
        self.nominal_length = n
        return self
