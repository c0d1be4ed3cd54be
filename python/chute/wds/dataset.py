"""``WebDataset``: webdataset's pipeline over tar shards, run on the native
engine.

The fluent chain (``.shuffle().decode().rename().to_tuple().batched()``) is
recorded, not executed. When iterated, the longest prefix of the chain that
the engine understands is compiled into a plan; the engine reads, groups,
shuffles, decodes and collates on native threads, and Python only receives
finished batches. Stages after that prefix (``map``, ``select``, a custom
collation, ...) run in Python per sample or per batch: the documented slow
path, counted in ``stats()["python_items"]``.
"""

from __future__ import annotations

import copy
import os
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, ClassVar

import torch
from torch.utils.data import IterableDataset, default_convert

from chute import _core
from chute.engine import default_threads
from chute.extensions import KEY_FIELD
from chute.handlers import Handler, reraise_exception
from chute.loading import EngineDataset, LoaderSettings
from chute.remote import RemoteOptions
from chute.remote._datasets import (
    expand_remote_globs,
    is_remote_glob,
    merge_options,
    native_source,
)
from chute.shards import (
    Splitter,
    apply_splitter,
    expand_urls,
    rank_and_world_size,
    single_node_only,
    split_by_worker,
    worker_and_num_workers,
)
from chute.wds.compiler import (
    CompiledPipeline,
    compile_stages,
    engine_handler,
    native_torch_batch,
)
from chute.wds.convert import BatchConverter, pin_copy
from chute.wds.even import EVEN_BATCH_MODES, even_batch_count, indexed_length
from chute.wds.native import (
    EngineSettings,
    apply_pin_hooks,
    field_plan,
    handler_policy,
    report_skips,
)
from chute.wds.pystages import apply_python_stage, python_batched
from chute.wds.stages import STATEFUL_PYTHON_STAGES, Fluent, Stage

# torch ships default_convert without annotations.
_default_convert: Callable[[Any], Any] = default_convert


def engine_seed(base_seed: int, rank: int, worker: int) -> int:
    """The engine's seed for a rank's torch worker: ranks and workers read
    different shards, so their shuffles and per-image draws (crops, flips)
    differ too."""
    return (base_seed * 1_000_003 + rank * 1009 + worker) & ((1 << 63) - 1)


class WebDataset(Fluent, IterableDataset[Any], EngineDataset):
    """Drop-in for ``webdataset.WebDataset`` that runs on native threads.

    chute-specific keyword arguments:

    - ``threads``: decode threads (default: ``chute.engine.default_threads()``,
      the CPUs this process may run on; one inside a torch DataLoader worker).
    - ``streams``: logical streams (default 1, which keeps webdataset's exact
      single-process order). Shards are dealt round-robin to streams and
      batches are taken from streams in turn; the order depends on the number
      of streams, never on the number of threads.
    - ``prefetch``: batches in flight.
    - ``pipe_timeout``: seconds a ``pipe:`` command may stay silent.
    - ``shuffle_max_bytes``: byte budget of each shuffle buffer (encoded bytes).
    - ``timeout``: seconds to wait for a batch before ``TimeoutError``.
    - Remote shards (``http(s)://``, ``s3://``, ``gs://``, ``az://``,
      ``abfs://``, ``hf://``; ``pip install 'chute[remote]'``) are read by
      the engine in large ranges, several ahead, while they arrive.
      ``storage_options`` (the store's own keys, e.g. ``endpoint``,
      ``region``) adds to the credentials, region and endpoint of the
      standard environment; ``cache_dir`` (shared by the node's processes)
      keeps every remote shard once, bounded by ``cache_limit_bytes`` (by
      default webdataset's ``cache_size`` when positive); ``prefetch_bytes``
      bounds the bytes fetched ahead of the parser, over all shards;
      ``remote`` (a ``chute.remote.RemoteOptions``) sets the rest (range
      size, requests in flight, retries, timeouts). A glob on a bucket
      (``s3://bucket/train/*.tar``) is listed when the dataset is first
      iterated (webdataset takes none).
    - ``even_batches``: under DDP (world size > 1) every rank must yield the
      same number of batches, or the collective ops of the short rank's
      peers hang. ``"cap"`` (default) stops every rank after the batch count
      of the rank with the fewest samples; ``"repeat"`` makes every rank yield
      the count of the rank with the most, the shorter ones reading their
      shards again; ``"off"`` leaves counts as they fall. Ranks count their
      samples once (a header scan, cached per shard) and agree through
      ``torch.distributed`` when it is initialised, else by splitting the
      shard list as ``split_by_node`` does.
    """

    index_driven: ClassVar[bool] = False

    def __init__(
        self,
        urls: str | Sequence[str],
        handler: Handler = reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: bool | int | None = None,
        cache_size: int = -1,
        cache_dir: str | os.PathLike[str] | None = None,
        url_to_name: Callable[[str], str] | None = None,
        detshuffle: bool = False,
        nodesplitter: Splitter | None = single_node_only,
        workersplitter: Splitter | None = split_by_worker,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str] | None = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: int | None = None,
        *,
        threads: int | None = None,
        streams: int = 1,
        prefetch: int | None = None,
        pipe_timeout: float = 0.0,
        shuffle_max_bytes: int = 1 << 30,
        timeout: float = 0.0,
        even_batches: str = "cap",
        storage_options: Mapping[str, Any] | None = None,
        cache_limit_bytes: int | None = None,
        prefetch_bytes: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        super().__init__()
        if even_batches not in EVEN_BATCH_MODES:
            raise ValueError(f"even_batches must be 'cap', 'repeat' or 'off', not {even_batches!r}")
        self.even_batches = even_batches
        unsupported = {
            "url_to_name": url_to_name,
            "select_files": select_files,
            "rename_files": rename_files,
        }
        for name, value in unsupported.items():
            if value is not None:
                raise ValueError(f"chute.WebDataset does not support {name}= (use a .map stage)")
        if mode not in (None, "resampled"):
            raise ValueError(f"unknown mode {mode!r}")
        resampled = resampled or mode == "resampled"
        if resampled and shardshuffle not in (False, None):
            warnings.warn(
                "WebDataset(shardshuffle=...) is ignored for resampled datasets", stacklevel=2
            )
        elif shardshuffle is None and not resampled:
            warnings.warn(
                "WebDataset(shardshuffle=...) is None; set explicitly to False or a number",
                stacklevel=2,
            )
        if cache_dir is not None:
            cache_dir = os.path.expanduser(os.fspath(cache_dir))
            if not os.path.isdir(cache_dir):
                raise ValueError(f"cache directory {cache_dir} does not exist")
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("no shards given")
        if cache_limit_bytes is None and cache_size > 0:
            cache_limit_bytes = cache_size
        self.remote = merge_options(
            remote,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit_bytes=cache_limit_bytes,
            prefetch_bytes=prefetch_bytes,
        )
        self.handler = handler
        self.resampled = resampled
        self.repeat = repeat
        self.shardshuffle = bool(shardshuffle) and not resampled
        self.cache_dir = cache_dir
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self.empty_check = empty_check
        env_seed = os.environ.get("WDS_SEED")
        if seed is not None:
            self.seed = int(seed)
        elif env_seed is not None:
            self.seed = int(env_seed)
        else:
            self.seed = random.randint(0, 1_000_000)
        self.threads = threads  # None: chosen per iteration, see default_threads
        self.streams = streams
        self.prefetch = prefetch
        self.pipe_timeout = pipe_timeout
        self.shuffle_max_bytes = shuffle_max_bytes
        self.timeout = timeout
        self.stages: list[Stage] = []
        self.epoch_items = -1  # with_epoch
        self.nominal_length: int | None = None  # with_length
        self._epoch = 0
        self._epoch_set = False
        self._finished_stats: dict[str, Any] = {}
        self._live: _LiveIteration | None = None
        self._position: _Position | None = None  # of the current iteration
        self._resume: _Position | None = None
        self._python_stages: list[Stage] = []

    def with_length(self, n: int | None = None, silent: bool = False) -> WebDataset:
        """``len()`` of the pipeline is `n`; without it, the items its stages
        make of every sample, counted from the shards' sidecar indexes."""
        result = copy.copy(self)
        result.nominal_length = n if n is not None else indexed_length(self.urls, self.stages)
        return result

    def __len__(self) -> int:
        if self.nominal_length is None:
            raise TypeError("this WebDataset has no length; use .with_length(n)")
        return self.nominal_length

    def set_epoch(self, epoch: int) -> None:
        """Seeds of the shard shuffle and the shuffle buffers derive from the
        epoch. Without a call, each new iteration advances the epoch by one."""
        self._epoch = epoch
        self._epoch_set = True

    def stats(self) -> dict[str, Any]:
        """Figures of the running (else the latest) iteration: the engine's
        counters (samples read, skipped, yielded; busy seconds of the read and
        decode stages; bytes; shuffle-buffer and batch-memory bytes, current
        and peak; batches waiting), plus ``python_items`` (items through
        Python stages, the slow path) and ``wait_seconds`` (time the consumer
        spent waiting for the engine)."""
        live = self._live
        if live is None:
            return dict(self._finished_stats)
        return {
            **live.engine.stats(),
            "python_items": live.python_items,
            "wait_seconds": live.wait_seconds,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the current iteration stands; ``load_state_dict`` makes the
        next iteration resume right after it, with the same order. Before any
        iteration, or after one ended, it names the start of the next epoch."""
        p = self._position
        if p is None:
            return {"epoch": self._epoch, "batches": 0, "rows": 0, "shuffle_seed": None}
        stateful = [s.kind for s in self._python_stages if s.kind in STATEFUL_PYTHON_STAGES]
        if stateful:
            raise ValueError(
                f"cannot checkpoint mid-epoch: stages {stateful} run in Python and keep state; "
                "put .batched()/.shuffle() where the engine runs them (before any .map)"
            )
        return {
            "epoch": p.epoch,
            "batches": p.batches,
            "rows": p.rows,
            "shuffle_seed": p.shuffle_seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = _Position(
            epoch=int(state["epoch"]),
            shuffle_seed=state.get("shuffle_seed"),
            batches=int(state["batches"]),
            rows=int(state["rows"]),
        )

    def loader_state(self) -> dict[str, Any]:
        return self.state_dict()

    def load_loader_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state)

    # ------------------------------------------------------------------ iteration

    def _first_sample_extensions(self, urls: list[str]) -> list[str]:
        """Extensions of the first sample of the first shard that has one."""
        source = native_source(urls, self.remote)
        for url in urls:
            samples = _core.peek_tar_sample(
                url, self.cache_dir or "", self.pipe_timeout, source=source
            )
            if samples is not None:
                return list(samples)
        return []

    def _shard_urls(self) -> tuple[list[str], int]:
        if any(is_remote_glob(u) for u in self.urls):
            self.urls = expand_remote_globs(self.urls, self.remote)
        urls = apply_splitter(self.nodesplitter, list(self.urls))
        worker_urls = apply_splitter(self.workersplitter, urls)
        worker, _ = worker_and_num_workers()
        if self.resampled and not worker_urls:
            worker_urls = urls  # resampling draws from every shard the node has
        return worker_urls, worker

    def __iter__(self) -> Iterator[Any]:
        return self.iterate()

    def iterate(
        self,
        *,
        threads: int | None = None,
        prefetch: int | None = None,
        timeout: float | None = None,
        pin_memory: bool = False,
        torch_batch: tuple[int, bool] | None = None,
    ) -> Iterator[Any]:
        """One epoch, with the engine settings overridden for this iteration
        (``chute.DataLoader`` passes its ``num_workers`` here as threads).

        ``torch_batch=(batch_size, drop_last)`` yields what torch's DataLoader
        with that batch size and the default collate would: batches of the
        items this pipeline yields, collated by torch's rules. When the
        pipeline ends in native stages without a ``.batched``, the engine
        batches and the columns become tensors without a copy; otherwise the
        items are collated in Python."""
        urls, worker = self._shard_urls()
        if not urls:
            if self.empty_check:
                raise ValueError(
                    "No samples found in dataset; perhaps you have fewer shards than workers.\n"
                    "Turn off using empty_check=False in the WebDataset constructor."
                )
            return iter(())
        resume, self._resume = self._resume, None
        if resume is not None:
            self._epoch = resume.epoch
            self._epoch_set = False
        epoch = self._epoch
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False
        settings = EngineSettings(
            threads=max(1, threads or self.threads or default_threads()),
            prefetch=prefetch if prefetch is not None else self.prefetch,
            timeout=timeout if timeout is not None else self.timeout,
            pin_memory=pin_memory,
        )
        compiled = compile_stages(
            self.stages,
            lambda: self._first_sample_extensions(urls),
            seed=self.seed,
            shuffle_seed=resume.shuffle_seed if resume is not None else None,
        )
        torch_batched = (
            native_torch_batch(compiled, *torch_batch, self.epoch_items)
            if torch_batch is not None
            else None
        )
        if torch_batched is not None:
            compiled = torch_batched
        self._python_stages = compiled.python_stages
        # The position exists from here, before the engine starts, so a
        # checkpoint taken before the first item names this epoch.
        self._position = _Position(
            epoch=epoch,
            shuffle_seed=compiled.shuffle[2] if compiled.shuffle else None,
            batches=resume.batches if resume is not None else 0,
        )
        rank, _ = rank_and_world_size()
        items: Iterator[Any] = self._native_items(
            compiled, urls, worker, rank, epoch, settings, resume
        )
        for stage in compiled.python_stages:
            items = apply_python_stage(stage, items, self._python_counter)
        if self.epoch_items > 0 and not compiled.ends_in_native_batches:
            items = islice(items, self.epoch_items)
        if torch_batch is not None and torch_batched is None:
            size, drop_last = torch_batch
            items = python_batched(items, size, torch.utils.data.default_collate, not drop_last)
        return items

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        # With the default collate the dataset batches (natively when it can);
        # a custom collate_fn gets lists of items (the slow path).
        torch_batch = (
            (settings.batch_size, settings.drop_last)
            if settings.batch_size is not None and settings.collate_fn is None
            else None
        )
        items = self.iterate(
            threads=settings.threads,
            prefetch=settings.prefetch,
            timeout=settings.timeout,
            pin_memory=settings.pin_memory,
            torch_batch=torch_batch,
        )
        try:
            if settings.batch_size is None:
                for item in items:
                    yield _default_convert(item)
            elif torch_batch is not None:
                yield from items
            else:
                collate_fn = settings.collate_fn
                assert collate_fn is not None
                batch: list[Any] = []
                for item in items:
                    batch.append(item)
                    if len(batch) == settings.batch_size:
                        yield collate_fn(batch)
                        batch = []
                if batch and not settings.drop_last:
                    yield collate_fn(batch)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _python_counter(self, n: int) -> None:
        if self._live is not None:
            self._live.python_items += n

    def _make_plan(
        self,
        compiled: CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        settings: EngineSettings,
    ) -> Any:
        plan = _core.StreamPlan()
        plan.urls = urls
        plan.cache_dir = self.cache_dir or ""
        plan.pipe_timeout = float(self.pipe_timeout)
        remote_source = native_source(urls, self.remote)
        if remote_source is not None:
            plan.remote = remote_source.remote
            plan.cache_dir = remote_source.cache_dir
            plan.cache_limit_bytes = remote_source.cache_limit_bytes
            plan.cache_fsync = remote_source.cache_fsync
        batched = compiled.batch_size is not None
        native_fields = [f for f in compiled.fields if f.extensions]
        plan.fields = [
            field_plan(f, stack=batched, optional=not f.required, decode_opts=compiled.decode_opts)
            for f in native_fields
        ]
        plan.keep_other_members = compiled.keep_others
        plan.collect_keys = not compiled.tuple_output or any(
            f.name == KEY_FIELD for f in compiled.fields
        )
        plan.num_streams = self.streams
        plan.num_threads = settings.threads
        # Upcoming shards parsed at once: parsing is the bottleneck of tiny
        # samples, and one parser per decode thread keeps both fed.
        plan.parse_ahead = min(settings.threads, 4)
        if remote_source is not None:
            # The next shards arrive while this one is parsed (their bytes
            # bounded by prefetch_bytes), so a shard boundary never waits
            # for a round trip.
            plan.parse_ahead = max(plan.parse_ahead, 3)
        plan.prefetch_batches = (
            settings.prefetch if settings.prefetch is not None else 2 * settings.threads
        )
        plan.resampled = self.resampled
        plan.shuffle_shards = self.shardshuffle
        plan.repeat = self.repeat or self.epoch_items > 0
        if compiled.shuffle is not None:
            capacity, initial, shuffle_seed = compiled.shuffle
            plan.shuffle_capacity = capacity
            plan.shuffle_initial = initial
            plan.shuffle_max_bytes = self.shuffle_max_bytes
            base_seed = shuffle_seed
        else:
            base_seed = self.seed
        plan.seed = engine_seed(base_seed, rank, worker)
        plan.epoch = epoch
        plan.batch_size = compiled.batch_size or 64
        plan.partial = compiled.partial if batched else True
        plan.max_batches = (
            self.epoch_items if (self.epoch_items > 0 and compiled.ends_in_native_batches) else -1
        )
        plan.on_error = handler_policy(engine_handler(self.stages, self.handler))
        even = self._even_batch_count(compiled, urls)
        if even is not None:
            plan.max_batches = even
            plan.repeat = True  # a rank short of batches reads its shards again
        return plan

    def _even_batch_count(self, compiled: CompiledPipeline, urls: list[str]) -> int | None:
        """The batch count every rank yields this epoch, or None when ranks
        need not agree (see even_batch_count; a Python stage, an epoch cap or
        resampling leave the count to the pipeline)."""
        if (
            compiled.batch_size is None
            or compiled.python_stages
            or self.epoch_items > 0
            or self.resampled
        ):
            return None
        return even_batch_count(
            self.even_batches,
            compiled.batch_size,
            compiled.partial,
            urls,
            self.urls,
            self.nodesplitter,
            self.cache_dir or "",
            self.pipe_timeout,
            remote=self.remote,
        )

    def _native_items(
        self,
        compiled: CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        settings: EngineSettings,
        resume: _Position | None,
    ) -> Iterator[Any]:
        plan = self._make_plan(compiled, urls, worker, rank, epoch, settings)
        position = self._position
        assert position is not None
        skip_rows = 0
        if resume is not None:
            plan.skip_batches = resume.batches
            skip_rows = resume.rows
        copy_to_pinned = settings.pin_memory and not apply_pin_hooks(plan)
        handler = engine_handler(self.stages, self.handler)
        engine = _core.StreamEngine(plan)
        self._live = _LiveIteration(engine)
        converter = BatchConverter(compiled, urls)
        try:
            live = self._live
            while True:
                started = time.perf_counter()
                batch = engine.next(settings.timeout)
                live.wait_seconds += time.perf_counter() - started
                stop = report_skips(engine, handler)
                if batch is None:
                    break
                if compiled.batch_size is not None:
                    position.batches += 1
                    if batch.size == 0:  # the handler skipped every row of it
                        if stop:
                            break
                        continue
                    out = converter.batch(batch)
                    # While the next batch is awaited only the caller keeps
                    # this one alive: once it lets go, its buffer is free for
                    # the batches being decoded.
                    del batch
                    yield pin_copy(out) if copy_to_pinned else out
                    del out
                else:
                    for i, row in enumerate(converter.rows(batch)):
                        if i < skip_rows:
                            continue
                        position.rows = i + 1
                        yield row
                    skip_rows = 0
                    position.batches += 1
                    position.rows = 0
                if stop:
                    break
        finally:
            engine.close()
            live = self._live
            self._finished_stats = {
                **engine.stats(),
                "python_items": live.python_items,
                "wait_seconds": live.wait_seconds,
            }
            self._live = None
            self._position = None


@dataclass
class _Position:
    """Where an iteration stands: enough to replay it up to here."""

    epoch: int
    shuffle_seed: int | None
    batches: int = 0  # engine batches fully handed out
    rows: int = 0  # rows handed out of the next one (unbatched pipelines)


@dataclass
class _LiveIteration:
    engine: Any
    python_items: int = 0
    wait_seconds: float = 0.0
