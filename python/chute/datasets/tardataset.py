"""``TarDataset``: tar shards (the webdataset layout) as a map-style dataset.

Each shard's sidecar index (``chute.tarindex``) says where every sample's
members lie, so sample ``i`` is read by offset: any torch sampler works,
``shuffle=True`` is an exact shuffle of the whole dataset rather than a
buffer's, and ``DistributedSampler`` partitions it. The indexed engine reads
the samples of an index batch together (neighbours in one read) and decodes
them on native threads with the field decoders a ``WebDataset.decode(...)``
would use: the decode options go through the same compiler
(``chute.stream.compiler``) as a WebDataset's stages. Members the engine does
not decode (txt, json, ...) come back as bytes and are decoded in Python as
webdataset decodes them: the slow path.

Samples are webdataset's: ``ds[i]`` equals the i-th sample of
``WebDataset(urls).decode(...)`` (followed by ``to_tuple(*fields)`` when
`fields` is a tuple), counting shards in the order given and samples in
archive order. ``chute.DataLoader(ds, batch_size=..., shuffle=True)``
yields what ``torch.utils.data.DataLoader`` yields over those samples with
the same arguments: the order is torch's (its sampler, its generator), the
collation torch's default, written straight into the batch's tensors.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data

from chute import _core
from chute.common.errors import SkippedSamples, engine_errors, translate
from chute.common.handlers import (
    Handler,
    reraise_exception,
    warn_and_continue,
)
from chute.common.warning_types import SkippedSampleWarning
from chute.datasets.decode_epochs import DecodeEpochs
from chute.datasets.indexed import IndexedDataset, ProcessState
from chute.decoding.decoders import python_decode
from chute.decoding.extensions import KEY_FIELD, URL_FIELD
from chute.gpu.pinning import pin_hooks
from chute.loader.engine import default_threads
from chute.loader.frameworks import check_foreign_read
from chute.loader.protocol import LoaderSettings
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.remote_urls import (
    expand_file_patterns,
    merge_options,
    remote_tar_index,
)
from chute.sources.shards import local_path, remote_scheme_list
from chute.sources.tarcolumns import concatenate_indexes
from chute.sources.tarindex import ShardColumns, load_indexes
from chute.stream.compiler import CompiledPipeline, compile_stages, error_handlers
from chute.stream.convert import DROPPED, BatchConverter, pin_copy, refuse_python_image
from chute.stream.fluent import Fluent
from chute.stream.native import ErrorHandlers, field_plan
from chute.stream.prefix import MEMBER, OutputField
from chute.stream.stages import PythonRun, Stage

FieldsSpec = str | Sequence[str] | Mapping[str, str] | None
DecodeSpec = str | Sequence[str | Callable[[str, bytes], Any]] | None


@dataclass
class _Native:
    """One engine batch, and the errors of the samples it skipped."""

    batch: Any
    skipped: list[Exception]


class _Engine(_core.IndexedEngine):
    """The native engine, with the ids of the batches in flight, so that the
    errors of the samples it skipped go to the batch they were in."""

    def __init__(self, plan: Any) -> None:
        super().__init__(plan)
        self.in_flight: collections.deque[np.ndarray] = collections.deque()
        self.skips = SkippedSamples()

    def submit_ids(self, idx: np.ndarray, epoch: int) -> None:
        self.submit(idx, epoch)
        self.in_flight.append(idx)

    def next_native(self, timeout: float) -> _Native:
        """The oldest batch in flight, with its skipped samples' errors."""
        try:
            batch = self.next(timeout)
        except BaseException as exc:
            # A failed batch was taken; one timed out or interrupted was not.
            while len(self.in_flight) > self.outstanding():
                self.in_flight.popleft()
            if isinstance(exc, _core.DataError | _core.ReadError):
                with engine_errors():  # as chute.common.errors maps it
                    raise
            raise
        idx = self.in_flight.popleft()
        lost = int(idx.size) - int(batch.size)
        return _Native(batch, self.skips.of_batch(self.take_skipped(), idx.tolist(), lost))


class TarDataset(DecodeEpochs):
    """Map-style samples of tar shards, read by offset through their index.

    Args:
        urls: shards as ``WebDataset`` takes them: a brace pattern
            (``"data/shard-{000000..000099}.tar"``), several joined by
            ``::``, a glob (sorted), or a list of these. Local files (or
            ``file:`` urls), or remote objects (``s3://``, ``gs://``,
            ``az://``, ``http(s)://``, ``hf://``; globs listed on buckets),
            read with ranged requests of the samples a batch needs.
        decode: what ``WebDataset.decode(...)`` takes: an image spec
            (``"rgb8"``, ``"torchrgb8"``, ``"l8"``, ...), a sequence of specs
            and handler callables, ``""`` for the default decoders without
            images, or None for no decoding (members stay bytes).
        fields: a tuple of field specs (``("jpg;png", "cls")``) gives tuples,
            as ``.to_tuple(...)``; a mapping ``{"image": "jpg;png", ...}``
            gives dicts with those names; None gives webdataset's sample
            dicts (``__key__``, ``__url__``, ``__local_path__`` and every
            member).
        index: where the sidecar indexes live: None beside each shard, or a
            directory (a local one, for remote shards too). A missing, stale
            or corrupt index is built on first open (every shard on several
            threads, with progress on a terminal) and saved there; see
            ``chute.tarindex``.
        handler: webdataset's handler for bad samples: ``reraise_exception``
            raises (naming shard, member and offset), the ``*_and_continue``
            handlers drop the sample, so its batch comes out shorter.
        num_threads: engine threads behind ``ds[i]`` and ``__getitems__``
            (default: the CPUs this process may use; 1 inside a torch worker).
        storage_options, remote: how remote shards are reached, as for
            ``WebDataset`` (a remote shard without an index beside it, or
            in `index`, is read once to build one).
        seed: seeds the decoders' random draws (``crop="random"``,
            ``flip``): those of sample i derive from (seed, epoch, i), so they
            do not depend on batch size, workers or ranks. The epoch is the
            one ``set_epoch`` sets, else each ``chute.DataLoader`` pass
            advances it by one.
        **decode_options: the image options of ``WebDataset.decode``
            (``size=(h, w)``, ``crop``, ``flip``, ...).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        decode: DecodeSpec = None,
        fields: FieldsSpec = None,
        index: str | os.PathLike[str] | None = None,
        *,
        handler: Handler = reraise_exception,
        num_threads: int | None = None,
        seed: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        remote: RemoteOptions | None = None,
        **decode_options: Any,
    ) -> None:
        self._remote = merge_options(remote, storage_options=storage_options)
        self.urls = expand_file_patterns(urls, self._remote, "shard")
        if not self.urls:
            raise ValueError("TarDataset: no shards given")
        self._paths = []
        for url in self.urls:
            if is_remote_url(url):
                self._paths.append(url)
                continue
            path = local_path(url)
            if path is None:
                raise ValueError(
                    f"TarDataset reads local shards and {remote_scheme_list()} urls; "
                    f"{url!r} is neither"
                )
            if not os.path.isfile(path):
                raise FileNotFoundError(2, "tar shard not found", path)
            self._paths.append(path)
        self.index_dir = None if index is None else os.fspath(index)
        self.handler = handler
        self.seed = int(seed)
        self._columns = concatenate_indexes(self._load_indexes())
        self._stages, self._names = _stages(decode, fields, handler, decode_options)
        # Nothing this dataset holds may hold it back (no bound method, no
        # closure over self): in a reference cycle it, and the threads of its
        # engines, would outlive the user's last reference until a collection.
        columns = self._columns
        # Dict samples carry every extension of the dataset, in order of first appearance.
        self._compiled: CompiledPipeline = compile_stages(
            self._stages, lambda: columns.extensions, seed=self.seed
        )
        self._handlers: ErrorHandlers = error_handlers(self._stages, handler)
        self._skips = _Skips(self._handlers.member)
        self._converter = BatchConverter(self._compiled, self.urls, self._skips.member_failure)
        self._init_indexed(num_threads)

    def _load_indexes(self) -> list[ShardColumns]:
        """Every shard's index in order: local ones through load_indexes,
        remote ones from beside the object (see remote_tar_index), several
        at once (each costs round trips)."""
        local = [p for p in self._paths if not is_remote_url(p)]
        loaded = iter(load_indexes(local, self.index_dir, threads=default_threads()))
        remote = [p for p in self._paths if is_remote_url(p)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            documents = dict(
                zip(
                    remote,
                    pool.map(lambda u: remote_tar_index(u, self._remote, self.index_dir), remote),
                    strict=True,
                )
            )
        columns = []
        for path in self._paths:
            if is_remote_url(path):
                # Checked by size and version: a store keeps no modification time to compare.
                indexed = ShardColumns.from_document(documents[path])
                columns.append(dataclasses.replace(indexed, mtime_ns=-1))
            else:
                columns.append(next(loaded))
        return columns

    # -- map-style protocol ------------------------------------------------------------

    def __len__(self) -> int:
        return self._columns.num_samples

    def __getitem__(self, index: int) -> Any:
        idx = self._one_index(index)
        native = self._read_native(idx)
        rows = self._rows(native.batch)
        if not rows:  # skipped by the handler: a single sample has nothing else to give
            raise translate(native.skipped[0]) if native.skipped else IndexError(int(idx[0]))
        return rows[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples of a whole index batch, read and decoded in one native
        call: what torch's fetcher hands to its collate_fn (without the ones
        the handler skipped)."""
        check_foreign_read(self, "__getitems__")
        native = self._read_native(self._as_indices(indices))
        self._report(native.skipped)
        return self._rows(native.batch)

    def read_batch(self, idx: np.ndarray) -> Any:
        """The samples `idx`, collated as torch's default collate does."""
        native = self._read_native(idx)
        self._report(native.skipped)
        return self._collated(native.batch)

    def state_identity(self) -> dict[str, Any]:
        """What a loader state of this dataset records of it, and must find
        again when loaded: the shards as given and the digest of each one's
        tar headers (from its index), which decide the samples and their order."""
        return {
            "shards": list(self.urls),
            "headers_digests": list(self._columns.headers_digests),
        }

    # -- the engine -----------------------------------------------------------------------

    def field_names(self) -> list[str]:
        if self._names is not None:
            return list(self._names)
        return [f.name for f in self._compiled.fields]

    def _native_field_names(self) -> list[str]:
        return [f.name for f in self._compiled.fields if f.extensions]

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        c = self._columns
        source = _core.TarIndexSource(
            self.urls,
            self._paths,
            c.sizes,
            c.mtimes_ns,
            c.versions,
            c.extension_table,
            c.shard_starts,
            c.sample_offsets,
            c.key_starts,
            c.keys,
            c.member_starts,
            c.member_extensions,
            c.member_offsets,
            c.member_sizes,
            c.member_header_offsets,
            remote=(
                get_session(self._remote).queue
                if any(is_remote_url(p) for p in self._paths)
                else None
            ),
        )
        return [source], {}

    def _make_engine(
        self, state: ProcessState, threads: int, in_flight: int, hooks: tuple[int, int] | None
    ) -> Any:
        compiled = self._compiled
        plan = _core.IndexedPlan()
        plan.samples = state.sources[0]
        everywhere = self._columns.everywhere
        plan.set_fields(
            [
                # Dict samples stack only the members every sample has: a
                # stacked row cannot say that its sample lacks the member.
                field_plan(
                    f,
                    stack=compiled.tuple_output or f.extensions[0] in everywhere,
                    optional=not f.required,
                    decode_opts=compiled.decode_opts,
                )
                for f in compiled.fields
                if f.extensions
            ]
        )
        plan.keep_other_members = compiled.keep_others
        plan.collect_keys = not compiled.tuple_output or any(
            f.name == KEY_FIELD for f in compiled.fields
        )
        plan.seed = self.seed
        plan.on_error = self._handlers.policy
        plan.num_threads = threads
        plan.max_in_flight = in_flight
        if hooks is not None:
            plan.set_pin_hooks(*hooks)
        return _Engine(plan)

    def _submit(self, engine: Any, idx: np.ndarray) -> None:
        engine.submit_ids(idx, self._draw_epoch)

    def _wait(self, engine: Any, timeout: float) -> Any:
        return engine.next_native(timeout)

    def _assemble(self, arrays: Any, idx: np.ndarray) -> Any:
        return arrays

    def _pin(self, batch: Any) -> Any:
        return batch  # engine batches: loader_batches pins what it makes of them

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        source = state.sources[0]
        return {
            "reads": int(source.reads),
            "bytes_read": int(source.bytes_read),
            "samples_skipped": self._skips.count,
        }

    # -- batches ----------------------------------------------------------------------------

    def iter_batches(
        self,
        index_batches: Iterable[Sequence[int]],
        num_threads: int,
        prefetch: int,
        timeout: float = 0,
        pin_memory: bool = False,
    ) -> Iterator[Any]:
        """For each index batch, its samples collated as torch's default
        collate does (see `IndexedDataset.iter_batches`)."""
        copy_to_pinned = pin_memory and pin_hooks() is None and torch.cuda.is_available()
        for native in self._native_batches(
            index_batches, num_threads, prefetch, timeout, pin_memory
        ):
            stop = self._report(native.skipped)
            if native.batch.size > 0:
                out = self._collated(native.batch)
                yield pin_copy(out) if copy_to_pinned else out
            if stop:
                return

    def loader_batch_outputs(
        self, settings: LoaderSettings, index_batches: Iterator[Sequence[int]]
    ) -> Generator[tuple[list[Any], bool], None, None]:
        collate_fn = settings.collate_fn
        # A custom collate_fn gets the samples, as torch's fetcher hands them over.
        pin_memory = settings.pin_memory and collate_fn is None
        copy_to_pinned = pin_memory and pin_hooks() is None and torch.cuda.is_available()
        natives = self._native_batches(
            index_batches, settings.threads, settings.prefetch, settings.timeout, pin_memory
        )
        try:
            for native in natives:
                stop = self._report(native.skipped)
                results = []
                if native.batch.size > 0:
                    if collate_fn is not None:
                        results.append(collate_fn(self._rows(native.batch)))
                    else:
                        out = self._collated(native.batch)
                        results.append(pin_copy(out) if copy_to_pinned else out)
                        del out
                del native
                yield results, stop
                del results
                if stop:
                    return
        finally:
            natives.close()

    # -- worker processes ------------------------------------------------------------------

    def reads_remote(self) -> bool:
        return any(is_remote_url(path) for path in self._paths)

    def python_work(self, settings: LoaderSettings) -> bool:
        c = self._compiled
        return (
            settings.collate_fn is not None
            or bool(c.python_stages)
            or any(f.native is None and f.decode_name is not None for f in c.fields)
        )

    def _native_batches(
        self,
        index_batches: Iterable[Sequence[int]],
        num_threads: int,
        prefetch: int,
        timeout: float,
        pin_memory: bool,
    ) -> Generator[_Native, None, None]:
        batches: Iterator[Any] = IndexedDataset.iter_batches(
            self, index_batches, num_threads, prefetch, timeout, pin_memory
        )
        try:
            yield from batches
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _rows(self, batch: Any) -> list[Any]:
        """The samples of an engine batch, as webdataset makes them."""
        rows: Iterator[Any] = (r for r in self._converter.rows(batch) if r is not DROPPED)
        for stage in self._compiled.python_stages:
            rows = stage.apply(rows, PythonRun())
        if self._names is not None:
            names = self._names
            return [dict(zip(names, row, strict=True)) for row in rows]
        return list(rows)

    def _collated(self, batch: Any) -> Any:
        """An engine batch as torch's default collate makes a batch of its
        samples: stacked columns become tensors without a copy."""
        columns = None if self._compiled.python_stages else self._columns_of(batch)
        if columns is None:
            return torch.utils.data.default_collate(self._rows(batch))
        if self._names is not None:
            return dict(zip(self._names, columns.values(), strict=True))
        if self._compiled.tuple_output:
            return list(columns.values())  # torch collates tuples into lists
        return columns

    def _columns_of(self, batch: Any) -> dict[str, Any] | None:
        """Each output field collated across the batch, or None when a sample
        lacks a member (torch's collate of such dicts is left to torch)."""
        c = self._compiled
        converter = self._converter
        # torch collates a column of tuple samples as a tuple, of dict samples as a list.
        container: type = tuple if c.tuple_output and self._names is None else list
        out: dict[str, Any] = {}
        if not c.tuple_output:
            out[KEY_FIELD] = list(batch.keys())
            out[URL_FIELD] = [self.urls[i] for i in batch.source_indices()]
            if converter.local_paths[0] is not None:
                out["__local_path__"] = [converter.local_paths[i] for i in batch.source_indices()]
        for f in c.fields:
            if f.name == KEY_FIELD:
                out[f.name] = container(batch.keys())
                continue
            if f.name == URL_FIELD:
                out[f.name] = container(self.urls[i] for i in batch.source_indices())
                continue
            column = batch.column(converter.native_index[f.name])
            if isinstance(column, np.ndarray):
                out[f.name] = (
                    converter.image_tensor(column)
                    if _is_torch_image(f)
                    else torch.from_numpy(column)
                )
                continue
            if any(v is None for v in column):
                return None
            values = [self._value(f, v) for v in column]
            out[f.name] = torch.utils.data.default_collate(container(values))
        # Members no field names (none when the fields cover the dataset's extensions).
        if not c.tuple_output and c.keep_others and any(batch.other_members()):
            return None
        return out

    def _value(self, f: OutputField, value: Any) -> Any:
        """One sample's value of field `f` from an engine column, as
        webdataset's decoder makes it."""
        native = f.native
        if native is None:
            if f.decode_name is None:
                return value
            name = f.extensions[0] if f.decode_name == MEMBER else f.decode_name
            if self._converter.transforms:
                refuse_python_image(name, self._compiled.image_spec)
            return python_decode(name, value, self._compiled.image_spec)
        if native.decoder == _core.FieldDecoder.INT:
            return int(value)
        if _is_torch_image(f):
            return self._converter.image_tensor(value)
        return torch.from_numpy(value) if native.as_torch else value

    def _report(self, errors: list[Exception]) -> bool:
        """Hands the skipped samples' errors to the handlers of their scopes
        (see ``chute.stream.native.ErrorHandlers``); True when one asks to stop."""
        self._skips.count += len(errors)
        return self._handlers.report(errors)

    def __repr__(self) -> str:
        return f"TarDataset({len(self.urls)} shards, {len(self)} samples)"


class _Skips:
    """The samples a dataset skipped, and its decode handler for members
    that fail in Python (the converter's callback: it holds this, not the
    dataset)."""

    def __init__(self, member_handler: Handler) -> None:
        self.member_handler = member_handler
        self.count = 0

    def member_failure(self, error: BaseException) -> bool:
        """A member that failed to decode in Python, for the decode handler:
        True skips its sample, False stops; reraise raises it."""
        self.count += 1
        handler = self.member_handler
        if handler is reraise_exception:
            raise error
        if handler is warn_and_continue:
            warnings.warn(str(error), SkippedSampleWarning, stacklevel=2)
            return True
        return bool(handler(error))


def _is_torch_image(f: OutputField) -> bool:
    native = f.native
    return native is not None and native.decoder == _core.FieldDecoder.IMAGE and native.as_torch


class _Recorder(Fluent):
    """Records the stages that TarDataset's arguments stand for."""

    def __init__(self) -> None:
        self.stages: list[Stage] = []
        self.epoch_items = 0


def _stages(
    decode: DecodeSpec,
    fields: FieldsSpec,
    handler: Handler,
    decode_options: dict[str, Any],
) -> tuple[list[Stage], list[str] | None]:
    """The WebDataset stages (decode, to_tuple) TarDataset's arguments mean,
    and the names of dict fields."""
    recorder = _Recorder()
    if decode is not None:
        specs = (decode,) if isinstance(decode, str) else tuple(decode)
        specs = tuple(s for s in specs if s != "")
        recorder = recorder.decode(*specs, handler=handler, **decode_options)
    elif decode_options:
        raise ValueError(f"decode options {sorted(decode_options)} need decode=...")
    names: list[str] | None = None
    if fields is None:
        return recorder.stages, None
    if isinstance(fields, Mapping):
        names = [str(k) for k in fields]
        specs_ = [str(v) for v in fields.values()]
    elif isinstance(fields, str):
        specs_ = fields.split() if " " in fields else [fields]
    else:
        specs_ = [str(f) for f in fields]
    if not specs_:
        raise ValueError("fields names no field")
    recorder = recorder.to_tuple(*specs_, handler=handler)
    return recorder.stages, names
