"""A webdataset-compatible pipeline over tar shards that runs on the native
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
import functools
import os
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset
from typing_extensions import Self

from chute import _core
from chute.collate import combine_values, default_collate
from chute.decoders import IMAGE_SPECS, NativeDecode, native_decode_for, python_decode
from chute.handlers import (
    Handler,
    ignore_and_continue,
    reraise_exception,
    warn_and_continue,
)
from chute.pinning import pin_hooks
from chute.shards import (
    Splitter,
    apply_splitter,
    expand_urls,
    rank_and_world_size,
    single_node_only,
    split_by_node,
    split_by_worker,
    worker_and_num_workers,
)

_UNSET: Any = object()


@dataclass
class _Stage:
    kind: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _OutputField:
    """One field of the native part's output, and where it comes from."""

    name: str
    extensions: list[str]  # member extensions, alternatives in order
    decode_name: str | None  # the name webdataset's decoder would see; None: not decoded
    required: bool = True  # False: a dict sample's member that later samples may lack
    native: NativeDecode | None = None


@dataclass(frozen=True)
class _EngineSettings:
    threads: int
    prefetch: int | None
    timeout: float
    pin_memory: bool = False


@dataclass
class _CompiledPipeline:
    fields: list[_OutputField]
    tuple_output: bool  # to_tuple reached natively
    keep_others: bool  # dict samples: members not named by a field come along
    renamed_away: set[str]  # dict samples: extensions consumed by a rename
    decoded: bool  # a decode stage ran natively
    image_spec: str | None
    batch_size: int | None  # batched natively
    partial: bool
    python_stages: list[_Stage]
    shuffle: tuple[int, int, int] | None  # capacity, initial, seed
    torch_collate: bool = False  # batches shaped as torch's default collate makes them


# Python stages that hold items across calls: a mid-epoch checkpoint cannot
# replay them exactly.
_STATEFUL_PYTHON_STAGES = frozenset({"batched", "unbatched", "shuffle", "compose"})


def _handler_policy(handler: Handler) -> Any:
    return _core.ErrorPolicy.RAISE if handler is reraise_exception else _core.ErrorPolicy.SKIP


class _Fluent:
    """webdataset's fluent interface: each method returns a copy with one more
    stage recorded. WebDataset compiles the stages onto the engine; WebLoader
    applies them in Python to what its DataLoader yields."""

    stages: list[_Stage]
    epoch_items: int

    def _compose(self, stage: _Stage) -> Self:
        result = copy.copy(self)
        result.stages = [*self.stages, stage]
        return result

    def shuffle(
        self,
        size: int,
        initial: int = 100,
        rng: random.Random | None = None,
        seed: int | None = None,
        handler: Handler | None = None,
    ) -> Self:
        if size < 1:
            return self
        return self._compose(
            _Stage("shuffle", (size,), {"initial": initial, "rng": rng, "seed": seed})
        )

    def decode(
        self,
        *specs: str | Callable[[str, bytes], Any],
        handler: Handler = reraise_exception,
        size: tuple[int, int] | None = None,
        crop: str = "center",
        flip: bool = False,
    ) -> Self:
        """``specs`` as webdataset (an image spec such as ``"torchrgb8"``, or
        handler callables, which run on the slow path). chute's additions:
        ``size=(h, w)`` resizes (shorter side) and crops each image to a fixed
        size in C++, ``crop`` is ``"center"``, ``"random"`` or ``"none"``
        (plain resize), ``flip`` mirrors half of the images at random."""
        for spec in specs:
            if isinstance(spec, str) and spec.lower() not in IMAGE_SPECS:
                raise ValueError(f"Unknown imagespec: {spec}")
        if crop not in ("center", "random", "none"):
            raise ValueError(f"crop must be 'center', 'random' or 'none', not {crop!r}")
        if size is not None and (len(size) != 2 or min(size) < 1):
            raise ValueError(f"size must be (height, width) with positive values, not {size!r}")
        return self._compose(
            _Stage("decode", specs, {"handler": handler, "size": size, "crop": crop, "flip": flip})
        )

    def rename(self, keep: bool = True, handler: Handler = reraise_exception, **kw: str) -> Self:
        return self._compose(_Stage("rename", (), {"keep": keep, "handler": handler, "names": kw}))

    def to_tuple(self, *args: str, handler: Handler = reraise_exception) -> Self:
        if len(args) == 1 and " " in args[0]:
            args = tuple(args[0].split())
        return self._compose(_Stage("to_tuple", args, {"handler": handler}))

    def map(self, f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Self:
        return self._compose(_Stage("map", (f,), {"handler": handler}))

    def map_dict(self, handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> Self:
        return self._compose(_Stage("map_dict", (), {"handler": handler, "fns": kw}))

    def map_tuple(self, *fns: Callable[[Any], Any], handler: Handler = reraise_exception) -> Self:
        return self._compose(_Stage("map_tuple", fns, {"handler": handler}))

    def select(self, predicate: Callable[[Any], bool]) -> Self:
        return self._compose(_Stage("select", (predicate,)))

    def batched(
        self,
        batchsize: int,
        collation_fn: Callable[[list[Any]], Any] | None = default_collate,
        partial: bool = True,
    ) -> Self:
        if batchsize < 1:
            raise ValueError(f"batchsize must be >= 1, got {batchsize}")
        return self._compose(
            _Stage("batched", (batchsize,), {"collation_fn": collation_fn, "partial": partial})
        )

    def unbatched(self) -> Self:
        return self._compose(_Stage("unbatched"))

    def compose(self, *fns: Callable[[Iterator[Any]], Iterator[Any]]) -> Self:
        """Append generator stages (iterator in, iterator out), run in Python."""
        result = self
        for fn in fns:
            result = result._compose(_Stage("compose", (fn,)))
        return result

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Self:
        """Each epoch yields this many items (batches when batched), restarting
        the shard list as often as needed, as webdataset does."""
        result = copy.copy(self)
        result.epoch_items = max(nsamples, nbatches)
        return result


class WebDataset(_Fluent, IterableDataset[Any]):
    """Drop-in for ``webdataset.WebDataset`` that runs on native threads.

    chute-specific keyword arguments:

    - ``threads``: decode threads (default: the number of CPUs, at most 8;
      one inside a torch DataLoader worker process).
    - ``streams``: logical streams (default 1, which keeps webdataset's exact
      single-process order). Shards are dealt round-robin to streams and
      batches are taken from streams in turn; the order depends on the number
      of streams, never on the number of threads.
    - ``prefetch``: batches in flight.
    - ``pipe_timeout``: seconds a ``pipe:`` command may stay silent.
    - ``shuffle_max_bytes``: byte budget of each shuffle buffer (encoded bytes).
    - ``timeout``: seconds to wait for a batch before ``TimeoutError``.
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
    ) -> None:
        super().__init__()
        if even_batches not in ("cap", "repeat", "off"):
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
        self.threads = threads  # None: chosen per iteration, see _default_threads
        self.streams = streams
        self.prefetch = prefetch
        self.pipe_timeout = pipe_timeout
        self.shuffle_max_bytes = shuffle_max_bytes
        self.timeout = timeout
        self.stages: list[_Stage] = []
        self.epoch_items = -1  # with_epoch
        self.nominal_length: int | None = None  # with_length
        self._epoch = 0
        self._epoch_set = False
        self._finished_stats: dict[str, Any] = {}
        self._live: _LiveIteration | None = None
        self._position: _Position | None = None  # of the current iteration
        self._resume: _Position | None = None
        self._python_stages: list[_Stage] = []

    def with_length(self, n: int, silent: bool = False) -> WebDataset:
        result = copy.copy(self)
        result.nominal_length = n
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
        stateful = [s.kind for s in self._python_stages if s.kind in _STATEFUL_PYTHON_STAGES]
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

    # ------------------------------------------------------------------ compilation

    def _first_sample_extensions(self, urls: list[str]) -> list[str]:
        """Extensions of the first sample, which name a dict sample's native
        fields (a later sample with other members still gets them, raw or
        decoded in Python)."""
        for url in urls:
            samples = _core.peek_tar_sample(url, self.cache_dir or "", self.pipe_timeout)
            if samples is not None:
                return list(samples)
        return []

    def _compile(
        self, urls: list[str], shuffle_seed_override: int | None = None
    ) -> _CompiledPipeline:
        stages = list(self.stages)
        position = 0
        shuffle: tuple[int, int, int] | None = None
        image_spec: str | None = None
        decode_opts: dict[str, Any] | None = None
        decoded = False
        # None until known: dict samples keep every member under its extension.
        fields: list[_OutputField] | None = None  # None: no stage has named fields yet
        renamed_away: set[str] = set()
        tuple_output = False
        batch_size: int | None = None
        partial = True
        while position < len(stages):
            stage = stages[position]
            if stage.kind == "shuffle" and not decoded and fields is None and shuffle is None:
                size = int(stage.args[0])
                initial = min(int(stage.kwargs["initial"]), size)
                rng = stage.kwargs["rng"]
                seed = stage.kwargs["seed"]
                if shuffle_seed_override is not None:
                    shuffle_seed = shuffle_seed_override
                elif rng is not None:
                    shuffle_seed = rng.getrandbits(63)
                elif seed is not None:
                    shuffle_seed = int(seed)
                else:
                    shuffle_seed = self.seed
                shuffle = (size, initial, shuffle_seed)
            elif (
                stage.kind == "decode"
                and not decoded
                and batch_size is None
                and not tuple_output
                and all(isinstance(s, str) for s in stage.args)
                and len(stage.args) <= 1
            ):
                decoded = True
                image_spec = stage.args[0].lower() if stage.args else None
                decode_opts = stage.kwargs
                # Fields renamed before decoding are decoded under their new name,
                # as webdataset's Decoder sees it (often: not at all).
                for f in fields or []:
                    f.decode_name = f.name
            elif (
                stage.kind == "rename"
                and batch_size is None
                and not tuple_output
                and stage.kwargs["keep"]
            ):
                names: dict[str, str] = stage.kwargs["names"]
                fields = self._rename_fields(fields or [], names, decoded, renamed_away)
            elif stage.kind == "to_tuple" and batch_size is None and not tuple_output:
                fields = [self._resolve_field(spec, fields or [], decoded) for spec in stage.args]
                tuple_output = True
            elif (
                stage.kind == "batched"
                and batch_size is None
                and stage.kwargs["collation_fn"] is default_collate
            ):
                batch_size = int(stage.args[0])
                partial = bool(stage.kwargs["partial"])
            else:
                break
            position += 1

        keep_others = not tuple_output
        if not tuple_output:
            # Dict samples: members nobody renamed keep their extension as name.
            present = {e for f in fields or [] for e in f.extensions}
            extra = [e for e in self._first_sample_extensions(urls) if e not in present]
            fields = (fields or []) + [
                _OutputField(e, [e], "@member" if decoded else None, required=False) for e in extra
            ]
        assert fields is not None
        for f in fields:
            f.native = self._native_decoder(f, image_spec)
        compiled = _CompiledPipeline(
            fields=fields,
            tuple_output=tuple_output,
            keep_others=keep_others,
            renamed_away=renamed_away,
            decoded=decoded,
            image_spec=image_spec if decoded else None,
            batch_size=batch_size,
            partial=partial,
            python_stages=stages[position:],
            shuffle=shuffle,
        )
        self._decode_opts = decode_opts or {}
        return compiled

    @staticmethod
    def _resolve_field(spec: str, fields: list[_OutputField], decoded: bool) -> _OutputField:
        """The output field for `spec` ("a;b" alternatives), built from earlier
        fields or, for names no stage has touched, from member extensions."""
        if spec in ("__key__", "__url__"):
            return _OutputField(spec, [], None)
        known = {f.name: f for f in fields}
        alternatives: list[str] = []
        decode_names: set[str | None] = set()
        for alt in spec.split(";"):
            if alt in known:
                alternatives.extend(known[alt].extensions)
                decode_names.add(known[alt].decode_name)
            else:
                alternatives.append(alt)
                decode_names.add("@member" if decoded else None)
        if len(decode_names) != 1:
            raise ValueError(
                f"alternatives in {spec!r} were decoded differently; list them separately"
            )
        return _OutputField(spec, alternatives, decode_names.pop())

    def _rename_fields(
        self,
        fields: list[_OutputField],
        names: dict[str, str],
        decoded: bool,
        renamed_away: set[str],
    ) -> list[_OutputField]:
        renamed = []
        for new_name, spec in names.items():
            field_ = self._resolve_field(spec, fields, decoded)
            renamed.append(_OutputField(new_name, field_.extensions, field_.decode_name))
            renamed_away.update(field_.extensions)
        consumed = {alt for spec in names.values() for alt in spec.split(";")}
        return [f for f in fields if f.name not in consumed and f.name not in names] + renamed

    @staticmethod
    def _native_decoder(f: _OutputField, image_spec: str | None) -> NativeDecode | None:
        if f.decode_name is None or not f.extensions:
            return None
        names = f.extensions if f.decode_name == "@member" else [f.decode_name]
        choices = {native_decode_for(n, image_spec) for n in names}
        if len(choices) != 1:
            raise ValueError(
                f"field {f.name!r}: alternatives {';'.join(f.extensions)} decode differently; "
                "decode them in separate fields"
            )
        return choices.pop()

    def _field_plan(self, f: _OutputField, stack: bool, optional: bool) -> Any:
        plan = _core.FieldPlan()
        plan.name = f.name
        plan.extensions = [e.lower() for e in f.extensions]
        plan.optional = optional
        plan.stack = stack
        native = f.native
        if native is None:
            plan.decoder = _core.FieldDecoder.RAW
            return plan
        plan.decoder = native.decoder
        if native.image_spec is not None:
            atype, etype, mode = IMAGE_SPECS[native.image_spec]
            plan.color = _core.ColorMode.GRAY if mode == "l" else _core.ColorMode.RGB
            spec = _core.ImageOutputSpec()
            spec.chw = atype == "torch"
            spec.to_float = etype == "float"
            opts = self._decode_opts
            if opts.get("size") is not None:
                spec.out_height, spec.out_width = opts["size"]
                spec.crop = {
                    "center": _core.CropMode.CENTER,
                    "random": _core.CropMode.RANDOM,
                    "none": _core.CropMode.NONE,
                }[opts["crop"]]
            spec.random_flip = bool(opts.get("flip"))
            plan.image = spec
        return plan

    # ------------------------------------------------------------------ iteration

    def _shard_urls(self) -> tuple[list[str], int]:
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
        settings = _EngineSettings(
            threads=max(1, threads or self.threads or _default_threads()),
            prefetch=prefetch if prefetch is not None else self.prefetch,
            timeout=timeout if timeout is not None else self.timeout,
            pin_memory=pin_memory,
        )
        compiled = self._compile(urls, resume.shuffle_seed if resume is not None else None)
        native_torch_batch = (
            torch_batch is not None
            and compiled.batch_size is None
            and not compiled.python_stages
            and self.epoch_items <= 0
        )
        if native_torch_batch:
            assert torch_batch is not None
            compiled.batch_size, drop_last = torch_batch
            compiled.partial = not drop_last
            compiled.torch_collate = True
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
            items = _apply_python_stage(stage, items, self._python_counter)
        if self.epoch_items > 0 and not self._native_epoch_cap(compiled):
            items = islice(items, self.epoch_items)
        if torch_batch is not None and not native_torch_batch:
            size, drop_last = torch_batch
            items = _python_batched(items, size, torch.utils.data.default_collate, not drop_last)
        return items

    def _native_epoch_cap(self, compiled: _CompiledPipeline) -> bool:
        return not compiled.python_stages and compiled.batch_size is not None

    def _python_counter(self, n: int) -> None:
        if self._live is not None:
            self._live.python_items += n

    def _make_plan(
        self,
        compiled: _CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        settings: _EngineSettings,
    ) -> Any:
        plan = _core.StreamPlan()
        plan.urls = urls
        plan.cache_dir = self.cache_dir or ""
        plan.pipe_timeout = float(self.pipe_timeout)
        batched = compiled.batch_size is not None
        native_fields = [f for f in compiled.fields if f.extensions]
        plan.fields = [
            self._field_plan(f, stack=batched, optional=not f.required) for f in native_fields
        ]
        plan.keep_other_members = compiled.keep_others
        plan.collect_keys = not compiled.tuple_output or any(
            f.name == "__key__" for f in compiled.fields
        )
        plan.num_streams = self.streams
        plan.num_threads = settings.threads
        # Upcoming shards parsed at once: parsing is the bottleneck of tiny
        # samples, and one parser per decode thread keeps both fed.
        plan.parse_ahead = min(settings.threads, 4)
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
        # Ranks and torch workers read different shards; their shuffles differ too.
        plan.seed = (base_seed * 1_000_003 + rank * 1009 + worker) & ((1 << 63) - 1)
        plan.epoch = epoch
        plan.batch_size = compiled.batch_size or 64
        plan.partial = compiled.partial if batched else True
        plan.max_batches = (
            self.epoch_items if (self.epoch_items > 0 and self._native_epoch_cap(compiled)) else -1
        )
        plan.on_error = _handler_policy(self._effective_handler())
        even = self._even_batch_count(compiled, urls)
        if even is not None:
            plan.max_batches = even
            plan.repeat = True  # a rank short of batches reads its shards again
        return plan

    def _even_batch_count(self, compiled: _CompiledPipeline, urls: list[str]) -> int | None:
        """The batch count every rank yields this epoch, or None when ranks
        need not agree (single process, or the count is already fixed)."""
        rank, world_size = rank_and_world_size()
        batch_size = compiled.batch_size
        if (
            world_size <= 1
            or self.even_batches == "off"
            or batch_size is None
            or compiled.python_stages
            or self.epoch_items > 0
            or self.resampled
        ):
            return None
        count = functools.partial(
            _shard_samples, cache_dir=self.cache_dir or "", timeout=self.pipe_timeout
        )
        reduce_max = self.even_batches == "repeat"
        if dist.is_available() and dist.is_initialized():
            total = torch.tensor([sum(count(u) for u in urls)], dtype=torch.int64)
            dist.all_reduce(total, op=dist.ReduceOp.MAX if reduce_max else dist.ReduceOp.MIN)
            samples = int(total.item())
        elif self.nodesplitter is split_by_node:
            per_rank = [sum(count(u) for u in self.urls[r::world_size]) for r in range(world_size)]
            samples = max(per_rank) if reduce_max else min(per_rank)
        else:
            raise ValueError(
                f"rank {rank} of {world_size}: cannot agree on a batch count without "
                "torch.distributed; initialise the process group, use split_by_node, "
                "or pass even_batches='off'"
            )
        if compiled.partial:
            return -(-samples // batch_size)
        return samples // batch_size

    def _effective_handler(self) -> Handler:
        for stage in self.stages:
            if stage.kind == "decode" and stage.kwargs["handler"] is not reraise_exception:
                return stage.kwargs["handler"]  # type: ignore[no-any-return]
        return self.handler

    def _native_items(
        self,
        compiled: _CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        settings: _EngineSettings,
        resume: _Position | None,
    ) -> Iterator[Any]:
        plan = self._make_plan(compiled, urls, worker, rank, epoch, settings)
        position = self._position
        assert position is not None
        skip_rows = 0
        if resume is not None:
            plan.skip_batches = resume.batches
            skip_rows = resume.rows
        copy_to_pinned = settings.pin_memory and not _apply_pin_hooks(plan)
        handler = self._effective_handler()
        engine = _core.StreamEngine(plan)
        self._live = _LiveIteration(engine)
        converter = _BatchConverter(compiled, urls)
        try:
            live = self._live
            while True:
                started = time.perf_counter()
                batch = engine.next(settings.timeout)
                live.wait_seconds += time.perf_counter() - started
                stop = _report_skips(engine, handler)
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
                    yield _pin_copy(out) if copy_to_pinned else out
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


def _apply_pin_hooks(plan: Any) -> bool:
    """Pins batch memory in the engine; False when CUDA is there but the
    runtime's functions were not found (the caller then copies)."""
    hooks = pin_hooks()
    if hooks is not None:
        plan.set_pin_hooks(*hooks)
        return True
    return not torch.cuda.is_available()


def _pin_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, tuple):
        return tuple(_pin_copy(v) for v in value)
    if isinstance(value, list):
        return [_pin_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _pin_copy(v) for k, v in value.items()}
    return value


_SHARD_SAMPLES: dict[tuple[str, int, int], int] = {}


def _shard_samples(url: str, cache_dir: str, timeout: float) -> int:
    """Samples in a shard, scanned once per (url, size, mtime)."""
    local = _local_path(url)
    stat = os.stat(local) if local is not None and os.path.exists(local) else None
    key = (url, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
    if key not in _SHARD_SAMPLES:
        _SHARD_SAMPLES[key] = int(_core.scan_tar_samples(url, cache_dir, timeout)["samples"])
    return _SHARD_SAMPLES[key]


def _default_threads() -> int:
    """All cores in the main process; one inside a torch DataLoader worker,
    where the worker processes already use the cores."""
    if torch.utils.data.get_worker_info() is not None:
        return 1
    return min(os.cpu_count() or 1, 8)


def _local_path(url: str) -> str | None:
    """webdataset's ``__local_path__``: the path of a plain-file url."""
    parsed = urlparse(url)
    return parsed.path if parsed.scheme in ("", "file") else None


def _report_skips(engine: Any, handler: Handler) -> bool:
    """Hands the errors of skipped samples to the handler; True when it asks to stop."""
    errors = engine.take_skipped()
    if handler is ignore_and_continue or not errors:
        return False
    for error in errors:
        if handler is warn_and_continue:
            warnings.warn(str(error), stacklevel=3)
        elif not handler(error):
            return True
    return False


class _BatchConverter:
    """Turns the engine's columns into what webdataset would have produced."""

    def __init__(self, compiled: _CompiledPipeline, urls: list[str]) -> None:
        self.compiled = compiled
        self.urls = urls
        self.local_paths = [_local_path(u) for u in urls]
        self.native_index = {}
        index = 0
        for f in compiled.fields:
            if f.extensions:
                self.native_index[f.name] = index
                index += 1

    def _decode_python(self, f: _OutputField, name: str, payload: bytes) -> Any:
        if f.decode_name is None:
            return payload
        decode_as = name if f.decode_name == "@member" else f.decode_name
        return python_decode(decode_as, payload, self.compiled.image_spec)

    def _column(self, f: _OutputField, batch: Any) -> Any:
        if f.name == "__key__":
            return batch.keys()
        if f.name == "__url__":
            return [self.urls[i] for i in batch.source_indices()]
        column = batch.column(self.native_index[f.name])
        native = f.native
        if native is None:
            # Raw column: decoded in Python (the member's own extension decides
            # for "@member" fields; the first alternative is what we know).
            return combine_values([self._decode_python(f, f.extensions[0], p) for p in column])
        if isinstance(column, np.ndarray):
            if native.decoder == _core.FieldDecoder.IMAGE and native.as_torch:
                return torch.from_numpy(column)
            return column
        return combine_values([self._item(native, v) for v in column])

    @staticmethod
    def _item(native: NativeDecode, value: Any) -> Any:
        if native.decoder == _core.FieldDecoder.INT:
            return int(value)
        if native.decoder == _core.FieldDecoder.IMAGE and native.as_torch:
            return torch.from_numpy(value)
        return value

    def batch(self, batch: Any) -> Any:
        c = self.compiled
        if c.tuple_output:
            columns = tuple(self._column(f, batch) for f in c.fields)
            if c.torch_collate:
                # torch transposes a tuple batch with zip: its columns are tuples.
                return [_as_torch_column(v, tuple) for v in columns]
            return columns
        rows = list(self.rows(batch))
        if not rows:
            return {}
        collated = default_collate(rows)
        if c.torch_collate:
            # torch gathers a dict batch's values per key in a list.
            return {k: _as_torch_column(v, list) for k, v in collated.items()}
        return collated

    def rows(self, batch: Any) -> Iterator[Any]:
        c = self.compiled
        n = batch.size
        columns: list[Any] = []
        for f in c.fields:
            if f.name == "__key__":
                columns.append(batch.keys())
            elif f.name == "__url__":
                columns.append([self.urls[i] for i in batch.source_indices()])
            else:
                columns.append(batch.column(self.native_index[f.name]))
        others = batch.other_members() if c.keep_others else None
        keys = batch.keys() if not c.tuple_output else None
        sources = batch.source_indices() if not c.tuple_output else None
        for i in range(n):
            values: list[Any] = []
            present: list[bool] = []
            for f, column in zip(c.fields, columns, strict=True):
                value = column[i]
                if value is None:
                    values.append(None)
                    present.append(False)
                    continue
                present.append(True)
                if f.name in ("__key__", "__url__"):
                    values.append(value)
                elif f.native is None:
                    values.append(self._decode_python(f, f.extensions[0], value))
                else:
                    values.append(self._item(f.native, value))
            if c.tuple_output:
                yield tuple(values)
                continue
            assert keys is not None and sources is not None and others is not None
            url = self.urls[sources[i]]
            sample: dict[str, Any] = {"__key__": keys[i], "__url__": url}
            local = self.local_paths[sources[i]]
            if local is not None:
                sample["__local_path__"] = local
            for f, value, has in zip(c.fields, values, present, strict=True):
                if has:
                    sample[f.name] = value
            for ext, payload in others[i].items():
                if ext in c.renamed_away:
                    continue
                sample[ext] = python_decode(ext, payload, c.image_spec) if c.decoded else payload
            yield sample


def _as_torch_column(column: Any, container: type) -> Any:
    """A column collated by webdataset's rules, as torch's default collate
    would have made it: arrays become tensors (sharing memory), other values
    go through torch's collate in the container torch would have built."""
    if isinstance(column, np.ndarray):
        return torch.from_numpy(column)
    if isinstance(column, torch.Tensor):
        return column
    return torch.utils.data.default_collate(container(column))


def _apply_python_stage(
    stage: _Stage, items: Iterator[Any], count: Callable[[int], None]
) -> Iterator[Any]:
    kind = stage.kind
    handler: Handler = stage.kwargs.get("handler", reraise_exception)

    def guarded(fn: Callable[[Any], Any]) -> Iterator[Any]:
        for item in items:
            count(1)
            try:
                yield fn(item)
            except Exception as exn:
                if handler(exn):
                    continue
                return

    if kind == "map":
        return guarded(stage.args[0])
    if kind == "map_dict":
        fns: dict[str, Callable[[Any], Any]] = stage.kwargs["fns"]

        def apply_dict(sample: dict[str, Any]) -> dict[str, Any]:
            sample = dict(sample)
            for key, fn in fns.items():
                sample[key] = fn(sample[key])
            return sample

        return guarded(apply_dict)
    if kind == "map_tuple":
        tuple_fns = stage.args

        def apply_tuple(sample: Sequence[Any]) -> tuple[Any, ...]:
            values = list(sample)
            for i, fn in enumerate(tuple_fns):
                if fn is not None:
                    values[i] = fn(values[i])
            return tuple(values)

        return guarded(apply_tuple)
    if kind == "select":
        predicate = stage.args[0]
        return (item for item in items if predicate(item))
    if kind == "batched":
        return _python_batched(
            items, int(stage.args[0]), stage.kwargs["collation_fn"], stage.kwargs["partial"]
        )
    if kind == "unbatched":
        return _python_unbatched(items)
    if kind == "compose":
        return stage.args[0](items)  # type: ignore[no-any-return]
    if kind == "shuffle":
        return _python_shuffle(items, int(stage.args[0]), stage.kwargs)
    if kind == "decode":
        return guarded(_python_decoder(stage))
    if kind == "rename":
        names: dict[str, str] = stage.kwargs["names"]
        keep = stage.kwargs["keep"]

        def rename(sample: dict[str, Any]) -> dict[str, Any]:
            out = dict(sample) if keep else {}
            if keep:
                for spec in names.values():
                    for alt in spec.split(";"):
                        out.pop(alt, None)
            for new, spec in names.items():
                out[new] = _getfirst(sample, spec)
            return out

        return guarded(rename)
    if kind == "to_tuple":
        specs = stage.args
        return guarded(lambda sample: tuple(_getfirst(sample, s) for s in specs))
    raise AssertionError(f"unknown stage {kind}")


def _getfirst(sample: dict[str, Any], spec: str) -> Any:
    for alt in spec.split(";"):
        if alt in sample:
            return sample[alt]
    raise ValueError(f"didn't find {spec.split(';')} in {list(sample.keys())}")


def _python_decoder(stage: _Stage) -> Callable[[dict[str, Any]], dict[str, Any]]:
    specs = stage.args
    image_spec = next((s.lower() for s in specs if isinstance(s, str)), None)
    callables = [s for s in specs if not isinstance(s, str)]

    def decode(sample: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in sample.items():
            if key.startswith("__") or not isinstance(value, bytes):
                out[key] = value
                continue
            result = None
            for fn in callables:
                result = fn("." + key, value)
                if result is not None:
                    break
            out[key] = result if result is not None else python_decode(key, value, image_spec)
        return out

    return decode


def _python_batched(
    items: Iterator[Any], size: int, collation_fn: Callable[[list[Any]], Any] | None, partial: bool
) -> Iterator[Any]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
    if batch and partial:
        yield collation_fn(batch) if collation_fn is not None else batch


def _python_unbatched(items: Iterable[Any]) -> Iterator[Any]:
    for batch in items:
        if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (str, bytes)):
            yield from zip(*batch, strict=True)
        else:
            yield from batch


def _python_shuffle(items: Iterator[Any], size: int, kwargs: dict[str, Any]) -> Iterator[Any]:
    rng = kwargs.get("rng") or random.Random(kwargs.get("seed"))
    initial = min(int(kwargs.get("initial", 100)), size)
    buf: list[Any] = []
    for item in items:
        buf.append(item)
        if len(buf) >= initial:
            j = rng.randrange(len(buf))
            buf[j], buf[-1] = buf[-1], buf[j]
            if len(buf) >= size:
                yield buf.pop()
    rng.shuffle(buf)
    yield from buf


class WebLoader(_Fluent, torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """webdataset's WebLoader: torch's DataLoader with the fluent methods
    (``.batched``, ``.unbatched``, ``.shuffle``, ``.map``, ``.with_epoch``...)
    applied in Python to what it yields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stages = []
        self.epoch_items = -1

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        def repeated() -> Iterator[Any]:
            while True:
                count = 0
                for item in super(WebLoader, self).__iter__():
                    count += 1
                    yield item
                if count == 0 or self.epoch_items <= 0:
                    return

        items: Iterator[Any] = repeated()
        for stage in self.stages:
            items = _apply_python_stage(stage, items, lambda n: None)
        if self.epoch_items > 0:
            items = islice(items, self.epoch_items)
        return items
