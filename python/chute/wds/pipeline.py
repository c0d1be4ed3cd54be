"""webdataset's composable pipelines: ``DataPipeline``, ``tarfile_to_samples``,
``FluidWrapper``, ``MockDataset``.

``wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node,
wds.split_by_worker, wds.tarfile_to_samples(), wds.shuffle(1000),
wds.decode("rgb8"), wds.to_tuple("jpg", "cls"), wds.batched(32))`` runs on
the native engine exactly as the fluent ``WebDataset`` chain with the same
stages does: the shard source and the stages before ``tarfile_to_samples``
(splitters, a shard shuffle, any function of url dicts) pick the urls in
Python on every iteration, and the stages after it are compiled like the
fluent chain's (a callable chute does not know runs in Python from there
on). Any other pipeline runs in Python as webdataset runs it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.utils.data import DataLoader, IterableDataset
from typing_extensions import Self

from chute.common.handlers import Handler, reraise_exception
from chute.common.stats import empty_stats
from chute.loader.frameworks import check_foreign_read
from chute.loader.protocol import EngineDataset, LoaderSettings
from chute.stream.fluent import Fluent
from chute.stream.stages import Compose, Stage
from chute.stream.stages.batching import python_batched
from chute.wds.dataset import WebDataset
from chute.wds.run import converted_items
from chute.wds.shardlists import ResampledShards, SimpleShardList

if TYPE_CHECKING:
    from chute.workers.pool import WorkerPool


class _TarfileSamples:
    """``tarfile_to_samples(handler=...)``: url dicts in, samples out. In a
    DataPipeline it marks where the engine takes over (unless it has
    select_files/rename_files: then the pipeline runs in Python); called on
    url dicts it reads each shard."""

    def __init__(
        self,
        handler: Handler = reraise_exception,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str] | None = None,
    ) -> None:
        self.handler = handler
        self.select_files = select_files
        self.rename_files = rename_files

    @property
    def reads_in_python(self) -> bool:
        return self.select_files is not None or self.rename_files is not None

    def __call__(self, src: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in src:
            yield from WebDataset(
                [item["url"]],
                handler=self.handler,
                shardshuffle=False,
                nodesplitter=None,
                workersplitter=None,
                select_files=self.select_files,
                rename_files=self.rename_files,
                empty_check=False,
            )


def tarfile_to_samples(
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> _TarfileSamples:
    """The stage from url dicts to samples (members grouped by key);
    `rename_files` renames each member, then `select_files` keeps those
    whose (new) name it accepts, in Python (chute.wds.tarread)."""
    return _TarfileSamples(handler, select_files, rename_files)


def tarfile_samples(
    src: Iterable[dict[str, Any]], handler: Handler = reraise_exception
) -> Iterator[dict[str, Any]]:
    """``tarfile_to_samples()`` applied to `src`."""
    return _TarfileSamples(handler)(src)


class _ShardStages:
    """The urls of one iteration: the source's, through the stages that
    precede ``tarfile_to_samples`` (a WebDataset node splitter)."""

    def __init__(self, source: Any, stages: Sequence[Any]) -> None:
        self.source = source
        self.stages = list(stages)

    def __call__(self, src: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if isinstance(self.source, SimpleShardList):
            items: Iterator[Any] = iter(self.source)
        else:
            items = src  # resampling draws from the whole list: the engine does it
        for stage in self.stages:
            items = _invoke(stage, items)
        return items


def _invoke(f: Any, *args: Any) -> Any:
    """One webdataset pipeline element applied to the output of the previous one."""
    if isinstance(f, (IterableDataset, DataLoader)) and not args:
        return iter(f)
    run = getattr(f, "run", None)
    if callable(run) and not isinstance(f, Stage):
        return run(*args)
    if isinstance(f, list):
        return iter(f)
    if callable(f):
        return f(*args)
    raise ValueError(f"{f}: not a valid pipeline stage")


class DataPipeline(Fluent, IterableDataset[Any], EngineDataset):
    """webdataset's ``DataPipeline``: a source followed by stages. Runs on the
    engine when it reads tar shards with stages chute knows (see the module
    docstring); then ``state_dict``, ``set_epoch``, ``stats`` and
    ``chute.DataLoader`` work as for a WebDataset. The fluent methods
    (``.map``, ``.batched``...) append stages as ``compose`` does."""

    index_driven: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.pipeline: list[Any] = []
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, list):
                self.pipeline.extend(arg)
            else:
                self.pipeline.append(arg)
        self._native: WebDataset | None = None
        self._native_key: tuple[Any, ...] | None = None

    # -- building ------------------------------------------------------------------

    def _compose(self, *stages: Stage) -> Self:
        result = copy.copy(self)
        result.pipeline = list(self.pipeline)
        for stage in stages:
            result.append(stage.function if isinstance(stage, Compose) else stage)
        return result

    def append(self, f: Any) -> None:
        """Appends a stage to this pipeline (in place)."""
        self.pipeline.append(f)

    def stage(self, i: int) -> Any:
        return self.pipeline[i]

    def close(self) -> None:
        for step in self.pipeline:
            close = getattr(step, "close", None)
            if callable(close):
                close()
        if self._native is not None:
            self._native.close()

    def __len__(self) -> int:
        if self.nominal_length is None:
            raise TypeError("this DataPipeline has no length; use .with_length(n)")
        return self.nominal_length

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_native"] = None
        state["_native_key"] = None
        return state

    def native(self) -> WebDataset | None:
        """The WebDataset this pipeline runs as, or None when it runs in Python."""
        key = (tuple(id(p) for p in self.pipeline), self.repetitions, self.epoch_items)
        if key != self._native_key:
            self._native = self._build_native()
            self._native_key = key
        return self._native

    def _build_native(self) -> WebDataset | None:
        pipeline = self.pipeline
        if not pipeline:
            return None
        head = pipeline[0]
        if isinstance(head, WebDataset):
            native = head._compose(*(_as_stage(s) for s in pipeline[1:]))
        else:
            marker = next((i for i, p in enumerate(pipeline) if _is_tar_stage(p)), None)
            if marker is None or not isinstance(head, (SimpleShardList, ResampledShards)):
                return None
            tar_stage = pipeline[marker]
            if isinstance(tar_stage, _TarfileSamples) and tar_stage.reads_in_python:
                return None  # member names go through Python functions: webdataset's path
            handler = (
                tar_stage.handler if isinstance(tar_stage, _TarfileSamples) else reraise_exception
            )
            resampled = isinstance(head, ResampledShards) and head.endless
            urls = head.urls if isinstance(head, SimpleShardList) or resampled else None
            if urls is None:
                return None  # a finite resampled draw: the Python path draws it
            native = WebDataset(
                urls,
                handler=handler,
                resampled=resampled,
                shardshuffle=False,
                nodesplitter=_ShardStages(head, pipeline[1:marker]),
                workersplitter=None,
                empty_check=False,
                even_batches="off",
            )
            native.stages = [_as_stage(s) for s in pipeline[marker + 1 :]]
        native.repetitions = self.repetitions
        native.epoch_items = self.epoch_items
        return native

    # -- iteration ------------------------------------------------------------------

    def _python_items(self) -> Iterator[Any]:
        """One pass, in Python, as webdataset's DataPipeline runs it."""
        source = _invoke(self.pipeline[0])
        for step in self.pipeline[1:]:
            source = _invoke(step, source)
        return iter(source)

    def _python_epoch(self) -> Iterator[Any]:
        for _ in range(self.repetitions):
            count = 0
            for item in self._python_items():
                count += 1
                yield item
            if count == 0:
                return

    def __iter__(self) -> Iterator[Any]:
        check_foreign_read(self, "__iter__")  # chute's loader calls loader_batches
        return self._epoch_items()

    def _epoch_items(self) -> Iterator[Any]:
        native = self.native()
        if native is not None:
            return iter(native)
        items = self._python_epoch()
        if self.repetitions != 1 and self.epoch_items > 0:
            return islice(items, self.epoch_items)
        return items

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        native = self.native()
        if native is not None:
            return native.loader_batches(settings, index_batches)
        items = self._epoch_items()
        if settings.batch_size is None:
            return converted_items(items)
        collate = settings.collate_fn or torch.utils.data.default_collate
        return python_batched(items, settings.batch_size, collate, not settings.drop_last)

    def python_work(self, settings: LoaderSettings) -> bool:
        native = self.native()
        return native is not None and native.python_work(settings)

    def worker_dataset(self) -> EngineDataset:
        return self._need_native("worker processes")

    def worker_batches(
        self,
        settings: LoaderSettings,
        index_batches: Iterator[Sequence[int]] | None,
        pool: WorkerPool,
    ) -> Iterator[Any]:
        return self._need_native("worker processes").worker_batches(settings, index_batches, pool)

    def _need_native(self, what: str) -> WebDataset:
        native = self.native()
        if native is None:
            raise ValueError(
                f"{what} covers pipelines that read tar shards on the engine "
                "(a shard source, tarfile_to_samples(), then stages); this one runs in Python"
            )
        return native

    def set_epoch(self, epoch: int) -> None:
        native = self.native()
        if native is not None:
            native.set_epoch(epoch)
        for step in self.pipeline:
            fn = getattr(step, "set_epoch", None)
            if callable(fn):
                fn(epoch)

    def stats(self) -> dict[str, Any]:
        native = self.native()
        return native.stats() if native is not None else empty_stats()

    def state_dict(self) -> dict[str, Any]:
        return self._need_native("state_dict()").state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._need_native("load_state_dict()").load_state_dict(state)

    def loader_state(self, running: Iterator[Any] | None = None) -> dict[str, Any]:
        return self._need_native("state_dict()").loader_state(running)

    def load_loader_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_tar_stage(p: Any) -> bool:
    return isinstance(p, _TarfileSamples) or p is tarfile_samples


def _as_stage(p: Any) -> Stage:
    return p if isinstance(p, Stage) else Compose(p)


class FluidWrapper(DataPipeline):
    """A DataPipeline over `initial`, with the fluent methods."""

    def __init__(self, initial: Any) -> None:
        super().__init__(initial)


class MockDataset(IterableDataset[Any]):
    """`sample`, `length` times."""

    def __init__(self, sample: Any, length: int) -> None:
        self.sample = sample
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield self.sample
