"""``WebDataset``: webdataset's pipeline over tar shards, run on the native
engine.

The fluent chain (``.shuffle().decode().rename().to_tuple().batched()``) is
recorded, not executed. When iterated, the longest prefix of the chain that
the engine understands is compiled into a plan; the engine reads, groups,
shuffles, decodes and collates on native threads, and Python only receives
finished batches. Stages after that prefix (``map``, ``select``, a custom
collation, ...) run in Python per sample or per batch: the documented slow
path, counted in ``stats()["python_items"]``.

Each ``iter()`` is an iteration of its own (its own engine, position and
figures), so a dataset can be iterated by two loops, threads or loaders at
once; ``state_dict()`` and ``stats()`` describe the oldest one still running.
"""

from __future__ import annotations

import copy
import os
import random
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlparse

from torch.utils.data import IterableDataset
from typing_extensions import Self

from chute import _core
from chute.common.autotune import AutoThreads
from chute.common.errors import engine_errors
from chute.common.handlers import Handler, reraise_exception
from chute.common.stats import empty_stats
from chute.decoding.extensions import (
    INT_EXTENSIONS,
    KEY_FIELD,
    NATIVE_IMAGE_EXTENSIONS,
    NPY_EXTENSION,
)
from chute.loader.engine import default_threads
from chute.loader.frameworks import check_foreign_read
from chute.loader.protocol import EngineDataset, LoaderSettings
from chute.remote import RemoteOptions, is_remote_url
from chute.sources.remote_urls import (
    expand_remote_globs,
    is_remote_glob,
    merge_options,
    native_source,
)
from chute.sources.shards import (
    Splitter,
    apply_splitter,
    expand_urls,
    local_path,
    rank_and_world_size,
    single_node_only,
    split_by_worker,
    worker_and_num_workers,
)
from chute.stream.compiler import CompiledPipeline, compile_stages
from chute.stream.fluent import Fluent
from chute.stream.native import (
    UNBATCHED_BATCH_BYTES,
    EngineSettings,
    ErrorHandlers,
    engine_seed,
    field_plan,
)
from chute.stream.stages import PythonRun, Stage
from chute.wds.even import (
    EVEN_BATCH_MODES,
    batches_of,
    check_countable,
    even_samples,
    indexed_length,
    needs_even_counts,
)
from chute.wds.parallel import WorkerEpochRun, has_worker_work, stream_task
from chute.wds.resume import StreamPosition, fingerprint, position_from_state
from chute.wds.run import EMPTY_MESSAGE, EpochIteration, EpochRun, as_torch_loader
from chute.wds.tarread import tar_samples

if TYPE_CHECKING:
    from chute.workers.main import Outgoing, WorkerContext
    from chute.workers.pool import WorkerPool

# Members a dict sample may have that the engine decodes, whether or not the
# first sample has them (pipe: and remote shards are not opened to look).
NATIVE_MEMBER_EXTENSIONS = [
    *sorted(NATIVE_IMAGE_EXTENSIONS),
    NPY_EXTENSION,
    *sorted(INT_EXTENSIONS),
]


class WebDataset(Fluent, IterableDataset[Any], EngineDataset):
    """Drop-in for ``webdataset.WebDataset`` that runs on native threads.

    chute-specific keyword arguments:

    - ``threads``: decode threads (default: ``chute.loader.engine.default_threads()``,
      the CPUs this process may run on; one inside a torch DataLoader worker).
    - ``streams``: logical streams (default 1, which keeps webdataset's exact
      single-process order). Shards are dealt round-robin to streams and
      batches are taken from streams in turn; the order depends on the number
      of streams, never on the number of threads.
    - ``prefetch``: batches in flight.
    - ``pipe_timeout``: seconds a ``pipe:`` command may stay silent.
    - ``shuffle_max_bytes``: byte budget of each shuffle buffer (the memory
      its samples hold).
    - ``timeout``: seconds to wait for a batch before ``TimeoutError``.
    - Remote shards (``http(s)://``, ``s3://``, ``gs://``, ``az://``,
      ``hf://``; ``pip install 'chute[remote]'``) are read by
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
      of the rank with the fewest samples (that rank ends with its partial
      batch; no rank reads a shard twice); ``"repeat"`` makes every rank
      yield the count of the rank with the most, a shorter one reading its
      shards again once its whole pass was delivered (counted in
      ``stats()["samples_repeated"]``); ``"off"`` leaves counts as they
      fall. Ranks count their samples once (a header scan, cached per
      shard) and agree through ``torch.distributed`` when it is
      initialised, else by splitting the shard list as ``split_by_node``
      does. When Python forms the batches (a Python stage before
      ``.batched``) the count is in samples; a Python stage whose items
      cannot be counted (``.select``) raises under DDP. In torch DataLoader
      worker processes, worker w of every rank yields the same count (the
      node and worker splits redone: ``split_by_node``,
      ``split_by_worker``). The exact counts: docs/epochs.md.
    - ``elastic``: the epoch's samples in one global order from (seed,
      epoch), dealt to the ranks (world size from torch.distributed or
      RANK/WORLD_SIZE) in spans with equal batch counts, each sample once;
      ``state_dict()`` then holds the global position and resumes on any
      world size (``chute.wds.elastic_stream``). Needs each shard's sample count
      (``chute.sources.sample_counts``: a tar shard's sidecar index, built when
      missing; local or remote shards, not ``pipe:``), the same
      ``seed`` on every rank, a native batch size, ``streams=1`` and one pass
      per epoch; ``nodesplitter``, ``workersplitter`` and ``even_batches``
      are not used.

    ``repeat=True`` (webdataset accepts and ignores it) makes the engine read
    the shard list again and again: one endless pass.

    ``handler`` handles failures to open or read a shard and malformed
    archives; a ``decode``, ``to_tuple`` or ``rename`` stage's own handler
    handles its members that do not decode or samples that lack a field.
    Where a decode stage has none, the dataset's handler does; where a
    ``to_tuple`` or ``rename`` has none, a missing field raises, as in
    webdataset.
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
        elastic: bool = False,
    ) -> None:
        super().__init__()
        if even_batches not in EVEN_BATCH_MODES:
            raise ValueError(f"even_batches must be 'cap', 'repeat' or 'off', not {even_batches!r}")
        self.even_batches = even_batches
        self.elastic = bool(elastic)
        if url_to_name is not None:
            raise ValueError("chute.WebDataset does not support url_to_name= (use a .map stage)")
        if (select_files is not None or rename_files is not None) and (
            resampled or mode == "resampled" or repeat or elastic
        ):
            raise ValueError(
                "select_files=/rename_files= read the shards in Python (chute.wds.tarread), "
                "which takes no resampled=, repeat= or elastic="
            )
        self.select_files = select_files
        self.rename_files = rename_files
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
        self.check_shard_urls(self.urls)
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
        self.repeat_shards = repeat
        self.shardshuffle = bool(shardshuffle) and not resampled
        self.cache_dir = cache_dir
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self.empty_check = empty_check
        env_seed = os.environ.get("WDS_SEED")
        # A seed drawn here, not given, gives way to a loaded state's.
        self._seed_given = seed is not None or env_seed is not None
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
        self._epoch = 0
        self._epoch_set = False
        self._resume: StreamPosition | None = None
        self._reset_runtime()

    def check_shard_urls(self, urls: list[str]) -> None:
        """ValueError for urls of a format other than tar that this class
        is not the reader of (a subclass reads its own)."""
        parquet = [u for u in urls if urlparse(u).path.endswith(".parquet")]
        if parquet:
            raise ValueError(
                f"{parquet[0]!r} is a Parquet file, and WebDataset reads tar shards: read "
                "Parquet files with chute.ParquetStream(urls, columns=...), whose samples' "
                "fields are the columns"
            )

    def _reset_runtime(self) -> None:
        """Per-object runtime state, never shared with copies or pickled."""
        self._iterations: list[weakref.ref[EpochIteration]] = []
        self.finished_stats: dict[str, Any] = {}

    def _copy(self) -> Self:
        result = copy.copy(self)
        result._reset_runtime()
        return result

    def with_length(self, n: int | None = None, silent: bool = False) -> Self:
        """``len()`` of the pipeline is `n` (webdataset's, which warns that it
        does not change the epoch unless `silent`); without `n`, the items
        its stages make of every sample, counted from the shards' sidecar
        indexes. Changes this pipeline and returns it, as webdataset does."""
        if n is None:
            self.nominal_length = indexed_length(self.urls, self.stages)
            return self
        return super().with_length(n, silent=silent)

    def __getstate__(self) -> dict[str, Any]:
        # A dataset pickles for spawn/forkserver worker processes even while
        # this process iterates it: engines and live iterations stay here.
        state = self.__dict__.copy()
        state["_iterations"] = []
        state["finished_stats"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        if self.nominal_length is None:
            raise TypeError("this WebDataset has no length; use .with_length(n)")
        return self.nominal_length

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops every running iteration of this dataset (their engines and
        threads end; a later ``next()`` on them raises StopIteration)."""
        for it in self._live_iterations():
            it.close()

    def set_epoch(self, epoch: int) -> None:
        """Seeds of the shard shuffle and the shuffle buffers derive from the
        epoch. Without a call, each new iteration advances the epoch by one."""
        self._epoch = epoch
        self._epoch_set = True

    def _live_iterations(self) -> list[EpochIteration]:
        live = [it for ref in self._iterations if (it := ref()) is not None and it.running]
        self._iterations = [weakref.ref(it) for it in live]
        return live

    def stats(self) -> dict[str, Any]:
        """Figures of the oldest running iteration (else the latest one):
        the engine's counters (samples read, skipped, yielded; busy seconds of
        the read and decode stages; bytes; shuffle-buffer and batch-memory
        bytes, current and peak; batches waiting), plus ``python_items``
        (items through Python stages, the slow path) and ``wait_seconds``
        (time the consumer spent waiting for the engine). Zeros before any
        iteration in this process: inside torch DataLoader worker processes
        each worker's copy of the dataset counts its own."""
        live = self._live_iterations()
        if live:
            return live[0].stats()
        if self.finished_stats:
            return dict(self.finished_stats)
        return empty_stats()

    @property
    def reads_in_python(self) -> bool:
        """Whether the shards are read in Python (``select_files=`` or
        ``rename_files=``; see chute.wds.tarread)."""
        return self.select_files is not None or self.rename_files is not None

    def _refuse_states(self) -> None:
        if self.reads_in_python:
            raise ValueError(
                "a WebDataset with select_files=/rename_files= reads its shards in Python "
                "and keeps no state: state_dict()/load_state_dict() are not supported"
            )

    def state_fingerprint(self) -> dict[str, Any]:
        order: dict[str, Any] = {
            "shardshuffle": self.shardshuffle,
            "resampled": self.resampled,
            "repeat": self.repeat_shards,
            "streams": self.streams,
            "shuffle_max_bytes": self.shuffle_max_bytes,
        }
        if not self.elastic:
            # Each rank's position is in its own part of the shards.
            order["world_size"] = rank_and_world_size()[1]
            order["even_batches"] = self.even_batches
            if needs_even_counts(self.even_batches):
                # A rank held to an even count drains each pass before it
                # reads its shards again; states taken before it did (no
                # such key) name batches this order no longer forms.
                order["even_passes"] = "drained"
        return fingerprint(self.urls, self.stages, self.elastic, order)

    def state_dict(self) -> dict[str, Any]:
        """Where the oldest running iteration stands; ``load_state_dict``
        makes the next iteration resume right after it, with the same order.
        With no iteration running it names the start of the next epoch."""
        self._refuse_states()
        live = self._live_iterations()
        if live:
            return live[0].state()
        return self._next_epoch_state()

    def _next_epoch_state(self) -> dict[str, Any]:
        return StreamPosition(epoch=self._epoch, shuffle_seed=None, seed=self.seed).as_state(
            self.state_fingerprint()
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next iteration resume at `state` (from ``state_dict``);
        ValueError when it is malformed or comes from another dataset or
        pipeline (shard list, stages, batch size, settings that decide the
        order, a seed given to this dataset). A dataset that drew its own
        seed takes the state's, so that this epoch and the next ones follow
        the interrupted run's order."""
        self._refuse_states()
        position = position_from_state(state, self.state_fingerprint())
        assert position.seed is not None
        if position.seed != self.seed and self._seed_given:
            raise ValueError(
                f"WebDataset state was taken with seed {position.seed}; this dataset has "
                f"seed {self.seed}: their orders differ (leave the seed out to take the state's)"
            )
        self.seed = position.seed
        self._resume = position

    def loader_state(self, running: Iterator[Any] | None = None) -> dict[str, Any]:
        self._refuse_states()
        if isinstance(running, EpochIteration) and running.running:
            return running.state()
        return self._next_epoch_state()

    def load_loader_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state)

    # ------------------------------------------------------------------ iteration

    def first_sample_extensions(self, urls: list[str]) -> list[str]:
        """Member extensions dict samples get native fields for: those of the
        first sample of the first local shard that has one (a cheap look;
        any failure is left for the engine to report in its place), then the
        extensions the engine decodes. pipe: and remote shards are not opened
        twice."""
        found: list[str] = []
        for url in urls:
            if local_path(url) is None:
                continue
            try:
                with engine_errors():
                    members = _core.peek_tar_sample(
                        url,
                        self.cache_dir or "",
                        self.pipe_timeout,
                        # A handler that goes on passes over a bad first sample.
                        skip_errors=self.handler is not reraise_exception,
                    )
            except (_core.DataError, _core.ReadError):
                continue
            if members is not None:
                found = list(members)
                break
        return found + [e for e in NATIVE_MEMBER_EXTENSIONS if e not in found]

    def compile_pipeline(
        self,
        first_sample_extensions: Callable[[], Sequence[str]],
        *,
        seed: int,
        shuffle_seed: int | None = None,
    ) -> CompiledPipeline:
        """The stages compiled (``chute.stream.compiler.compile_stages``); a
        format whose members are typed otherwise than by extension adjusts
        the decoders here."""
        return compile_stages(
            self.stages, first_sample_extensions, seed=seed, shuffle_seed=shuffle_seed
        )

    def shard_urls(self) -> tuple[list[str], int]:
        if any(is_remote_glob(u) for u in self.urls):
            self.urls = expand_remote_globs(self.urls, self.remote)
        if self.elastic:
            return list(self.urls), 0  # the elastic segment deals the samples to ranks
        urls = apply_splitter(self.nodesplitter, list(self.urls))
        worker_urls = apply_splitter(self.workersplitter, urls)
        worker, _ = worker_and_num_workers()
        if self.resampled and not worker_urls:
            worker_urls = urls  # resampling draws from every shard the node has
        return worker_urls, worker

    def leaves_a_worker_without_shards(self, num_workers: int) -> bool:
        """Whether webdataset's `num_workers` worker processes, splitting
        this dataset's shards with split_by_worker, would leave one without
        a shard: its empty_check then raises. (chute.DataLoader's workers
        are threads over one shard list: none is left without.)"""
        if (
            not self.empty_check
            or self.workersplitter is not split_by_worker
            or self.resampled
            or self.elastic
        ):
            return False
        return num_workers > len(self.shard_urls()[0])

    def __iter__(self) -> Iterator[Any]:
        check_foreign_read(self, "__iter__")  # chute's loader calls loader_batches
        return self.iterate()

    def iterate(
        self,
        *,
        threads: int | None = None,
        prefetch: int | None = None,
        timeout: float | None = None,
        pin_memory: bool = False,
        loader: LoaderSettings | None = None,
        pool: WorkerPool | None = None,
    ) -> Iterator[Any]:
        """One epoch, with the engine settings overridden for this iteration
        (``chute.DataLoader`` passes its ``num_workers`` here as threads).

        `loader`: yield what torch's DataLoader with these settings would
        (``batch_size=None``: items through torch's ``default_convert``; a
        batch size with the default collate: batches collated by torch's
        rules, by the engine when the pipeline ends in native stages without
        a ``.batched``, else in Python; a ``collate_fn``: it is called on
        lists of items). `pool`: worker processes that run the engine and the
        item-wise Python stages (see chute.wds.parallel)."""
        resume, self._resume = self._resume, None
        if resume is not None:
            self._epoch = resume.epoch
            self._epoch_set = False
        epoch = self._epoch
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False
        if self.reads_in_python:
            return self._read_in_python(epoch, loader)
        settings = EngineSettings(
            # num_workers="auto" (an AutoThreads) passes as it is: the engine's tuner reads it.
            threads=threads
            if isinstance(threads, AutoThreads)
            else max(1, threads or self.threads or default_threads()),
            prefetch=prefetch if prefetch is not None else self.prefetch,
            timeout=timeout if timeout is not None else self.timeout,
            pin_memory=pin_memory,
        )
        run = (
            EpochRun(self, epoch, settings, loader, resume)
            if pool is None
            else WorkerEpochRun(self, epoch, settings, loader, resume, pool)
        )
        it = EpochIteration(run)
        self._iterations.append(weakref.ref(it))
        return it

    def _read_in_python(self, epoch: int, loader: LoaderSettings | None) -> Iterator[Any]:
        """One epoch with the shards read and every stage run in Python
        (chute.wds.tarread): the slow path of select_files=/rename_files=."""
        urls, _ = self.shard_urls()
        if self.shardshuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(urls)
        figures = empty_stats()
        self.finished_stats = figures

        def count(n: int) -> None:
            figures["python_items"] += n

        in_python = PythonRun(count, self.handler)

        def passes() -> Iterator[Any]:
            if not urls and self.empty_check:
                raise ValueError(EMPTY_MESSAGE)
            for _ in range(self.repetitions):
                samples = 0

                def counted(items: Iterator[Any]) -> Iterator[Any]:
                    nonlocal samples
                    for item in items:
                        samples += 1
                        count(1)
                        yield item

                items = counted(
                    tar_samples(
                        urls, self.handler, self.select_files, self.rename_files, self.remote
                    )
                )
                for stage in self.stages:
                    items = stage.apply(items, in_python)
                yielded = 0
                for item in items:
                    yielded += 1
                    yield item
                if samples == 0 and self.empty_check:
                    raise ValueError(EMPTY_MESSAGE)
                if yielded == 0:
                    return  # a pass that yields nothing would repeat forever

        items = passes()
        if self.repetitions != 1 and self.epoch_items > 0:
            items = islice(items, self.epoch_items)
        return items if loader is None else as_torch_loader(items, loader, native=False)

    def loader_batches(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]] | None
    ) -> Iterator[Any]:
        return self.iterate(
            threads=settings.threads,
            prefetch=settings.prefetch,
            timeout=settings.timeout,
            pin_memory=settings.pin_memory,
            loader=settings,
        )

    def reads_remote(self) -> bool:
        return any(is_remote_url(url) for url in self.urls)

    def python_work(self, settings: LoaderSettings) -> bool:
        if self.reads_in_python:
            return False  # nothing runs on the engine: everything stays here
        # The shuffle seed given keeps the compiler from drawing on a
        # shuffle's rng (that draw belongs to the epoch).
        compiled = self.compile_pipeline(
            lambda: self.first_sample_extensions(self.urls), seed=0, shuffle_seed=0
        )
        return has_worker_work(compiled)

    def worker_batches(
        self,
        settings: LoaderSettings,
        index_batches: Iterator[Sequence[int]] | None,
        pool: WorkerPool,
    ) -> Iterator[Any]:
        return self.iterate(
            timeout=settings.timeout, pin_memory=settings.pin_memory, loader=settings, pool=pool
        )

    def worker_task(self, kind: str, spec: Any, context: WorkerContext) -> Iterator[Outgoing]:
        return stream_task(self, spec, context)

    def make_plan(
        self,
        compiled: CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        pass_index: int,
        settings: EngineSettings,
        handlers: ErrorHandlers,
    ) -> Any:
        plan = _core.StreamPlan()
        plan.urls = urls
        plan.cache_dir = self.cache_dir or ""
        plan.pipe_timeout = float(self.pipe_timeout)
        remote_source = self.set_plan_source(plan, urls)
        batched = compiled.batch_size is not None
        native_fields = [f for f in compiled.fields if f.extensions]
        # A field some samples may lack is never stacked: a list column says
        # which rows have it (dict samples are collated from rows anyway).
        plan.fields = [
            field_plan(
                f,
                stack=batched and f.required,
                optional=not f.required,
                decode_opts=compiled.decode_opts,
            )
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
        plan.repeat = self.repeat_shards
        if compiled.shuffle is not None:
            capacity, initial, shuffle_seed = compiled.shuffle
            plan.shuffle_capacity = capacity
            plan.shuffle_initial = initial
            plan.shuffle_max_bytes = self.shuffle_max_bytes
            base_seed = shuffle_seed
        else:
            base_seed = self.seed
        plan.seed = engine_seed(base_seed, rank, worker, pass_index)
        plan.epoch = epoch
        plan.batch_size = compiled.batch_size or 64
        plan.max_batch_bytes = 0 if batched else UNBATCHED_BATCH_BYTES
        plan.samples_one_by_one = not batched
        plan.partial = compiled.partial if batched else True
        plan.on_error = handlers.policy
        even = None if self.elastic else self.even_count(compiled, urls)
        if even is not None:
            if batched:
                plan.max_batches = even
            else:
                plan.max_samples = even  # Python batches them, the same on every rank
            # A rank short of the count reads its shards again, but only
            # once every sample of its pass was batched.
            plan.repeat_to_limit = True
        return plan

    def set_plan_source(self, plan: Any, urls: list[str]) -> Any:
        """Tells `plan` how to reach `urls`. Returns what reaches them when
        their bytes arrive slowly (the remote session's native source; a
        subclass's own reader), and more shards are then opened ahead;
        None for local tar shards."""
        remote_source = native_source(urls, self.remote)
        if remote_source is not None:
            plan.remote = remote_source.remote
            plan.cache_dir = remote_source.cache_dir
            plan.cache_limit_bytes = remote_source.cache_limit_bytes
            plan.cache_fsync = remote_source.cache_fsync
        return remote_source

    def even_count(self, compiled: CompiledPipeline, urls: list[str]) -> int | None:
        """What every rank's engine is held to this epoch: its batches when
        it batches, else its samples (Python stages that count, such as a
        ``.map`` and a ``.batched`` after it, then make the same items of
        them on every rank); None when ranks need not agree (see
        even_samples; several passes per epoch or resampling leave the count
        to the pipeline). ValueError when they must agree but a Python stage
        makes the count unknowable (even.check_countable)."""
        if self.repetitions != 1 or self.resampled:
            return None
        check_countable(self.even_batches, compiled.python_stages)
        samples = even_samples(
            self.even_batches,
            urls,
            self.urls,
            self.nodesplitter,
            self.cache_dir or "",
            self.pipe_timeout,
            remote=self.remote,
            workersplitter=self.workersplitter,
        )
        if samples is None or compiled.batch_size is None:
            return samples
        return batches_of(samples, compiled.batch_size, compiled.partial)
