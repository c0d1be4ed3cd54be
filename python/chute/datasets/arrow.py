"""``ArrowDataset``: Arrow IPC files as a map-style dataset — Hugging Face
``datasets``' ``save_to_disk`` directories and cache files, Feather (v2)
files, any Arrow IPC stream or file — image columns decoded and transformed
natively.

A ``save_to_disk`` directory holds ``data-NNNNN-of-NNNNN.arrow`` files (Arrow
IPC streams) beside ``state.json``, which lists them in order, and
``dataset_info.json``; a ``DatasetDict`` saved so holds one such directory per
split beside ``dataset_dict.json``. ``datasets``' cache holds the same
``.arrow`` stream files. Row ``i`` counts the rows of the files in order; each
record batch of a file is a block (``chute.datasets.blocks``).

Local files are memory-mapped: a record batch's columns are the file's own
bytes (no copy, no read), its image bytes handed to the engine where they
lie; a numeric or fixed-shape column is gathered from the mapping straight
into the batch's tensor. The message headers (a few hundred bytes each) are
read once at open, to find where every record batch lies. A file cut while
mapped reads zeros (never SIGBUS) and is noticed when a batch reading it
comes back, naming the file; one rewritten is noticed at the next record
batch read from it and refused unless its layout is the one read at open.

Remote files (``pip install 'chute[remote]'``) are read through chute's
storage layer: the message headers by ranged reads at open, then each
record batch with one ranged read, on a small thread pool ahead of the
batches; with a ``cache_dir`` each file is downloaded once into the node's
cache and mapped as a local file.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chute import _core
from chute.common.errors import EngineDataError, EngineReadError
from chute.common.handlers import Handler, reraise_exception
from chute.datasets.blocks import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_READAHEAD,
    Block,
    BlockDataset,
    ColumnKind,
    DecodeSpec,
    Encoded,
    FillValue,
)
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources import reader_threads
from chute.sources.arrow_ipc import (
    BatchLocation,
    HeaderWindow,
    LocalRanges,
    layout_digest,
    walk_local_file,
    walk_messages,
)
from chute.sources.remote_urls import cached_copy, dataset_remote_options, expand_file_patterns
from chute.sources.shards import file_change_key, local_path, remote_scheme_list

# Files one dataset keeps mapped in a process (the process maps a few
# hundred at most: chute's SIGBUS guard has a slot per mapped file).
_MAPPINGS = 64
# datasets' ArrayXD extension types: fixed-shape arrays as nested lists.
_DATASETS_ARRAYS = tuple(f"datasets.features.features.Array{n}DExtensionType" for n in range(2, 6))


def pyarrow_module() -> Any:
    """pyarrow, with its ipc module loaded (the optional extra)."""
    try:
        import pyarrow
        import pyarrow.ipc
    except ImportError:
        raise ImportError(
            "chute reads Arrow files with pyarrow: pip install 'chute[arrow]'"
        ) from None
    return pyarrow


@dataclass
class _ArrowFile:
    """One Arrow IPC file as its message headers describe it."""

    url: str
    path: str  # the local path, or the url of a remote object
    size: int
    version: str  # a remote object's ETag; "" for local files
    schema: Any  # pyarrow Schema
    batches: list[BatchLocation]
    digest: str  # of its schema and record batch layout
    stat: tuple[int, ...] | None = None  # a local file's change key when last checked
    features: dict[str, Any] = field(default_factory=dict)  # datasets' features, if recorded


# -- column kinds ---------------------------------------------------------------------


def _storage(type_: Any) -> Any:
    pa = pyarrow_module()
    return type_.storage_type if isinstance(type_, pa.BaseExtensionType) else type_


def _extension(field_: Any) -> tuple[str, bytes]:
    """A field's extension type name and metadata ("" when none): from its
    type when pyarrow knows the extension (datasets imported registers its
    own), else from the field's metadata, where the IPC format keeps them."""
    pa = pyarrow_module()
    if isinstance(field_.type, pa.BaseExtensionType):
        return field_.type.extension_name, field_.type.__arrow_ext_serialize__()
    meta = field_.metadata or {}
    return (
        meta.get(b"ARROW:extension:name", b"").decode(),
        meta.get(b"ARROW:extension:metadata", b""),
    )


def _binary(pa: Any, type_: Any) -> bool:
    return bool(pa.types.is_binary(type_) or pa.types.is_large_binary(type_))


def _numeric(pa: Any, type_: Any) -> bool:
    return bool(
        pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
    )


def _image_struct(pa: Any, type_: Any) -> bool:
    """The hub's image (and audio) feature: ``struct<bytes: binary, path: string>``."""
    if not pa.types.is_struct(type_):
        return False
    names = [type_.field(i).name for i in range(type_.num_fields)]
    return "bytes" in names and _binary(pa, type_.field("bytes").type)


def column_kind(field_: Any, features: Mapping[str, Any]) -> ColumnKind:
    """What ArrowDataset makes of a column (see docs/arrow_mds.md):
    `features` are datasets' features recorded in the file, if any."""
    pa = pyarrow_module()
    type_ = _storage(field_.type)
    name = str(field_.type)
    if _image_struct(pa, type_):
        feature = features.get(field_.name)
        hf_type = feature.get("_type") if isinstance(feature, dict) else None
        return ColumnKind("encoded", name, image=hf_type in (None, "Image"))
    if _binary(pa, type_):
        return ColumnKind("encoded", name)
    if _numeric(pa, type_):
        return ColumnKind("tensor", name, dtype=np.dtype(type_.to_pandas_dtype()), nullable=True)
    shape = _fixed_shape(field_)
    if shape is not None:
        dims, value_type = shape
        return ColumnKind(
            "tensor", name, dtype=np.dtype(value_type.to_pandas_dtype()), shape=dims, nullable=True
        )
    return ColumnKind("list", name)


def _fixed_shape(field_: Any) -> tuple[tuple[int, ...], Any] | None:
    """A column of numeric arrays of one shape: fixed-size lists (nested) of
    numbers, or datasets' ArrayXD with every dimension fixed; its per-row
    shape and value type, else None."""
    pa = pyarrow_module()
    ext, meta = _extension(field_)
    type_ = _storage(field_.type)
    if ext in _DATASETS_ARRAYS:
        try:
            dims, _ = json.loads(meta)
        except (ValueError, TypeError):
            return None
        if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
            return None  # a dynamic first dimension: lists
        value = type_
        for _ in dims:
            if not (pa.types.is_list(value) or pa.types.is_large_list(value)):
                return None
            value = value.value_type
        return (tuple(dims), value) if _numeric(pa, value) else None
    dims = []
    while pa.types.is_fixed_size_list(type_):
        dims.append(type_.list_size)
        type_ = type_.value_type
    if dims and _numeric(pa, type_) and not pa.types.is_boolean(type_):
        return tuple(dims), type_
    return None


# -- blocks ---------------------------------------------------------------------------


class _RecordBatch(Block):
    """One record batch's columns, as the dataset reads them."""

    def __init__(
        self, dataset: ArrowDataset, batch: Any, nbytes: int, mapping: Any, url: str
    ) -> None:
        self._dataset = dataset
        self._batch = batch
        self.rows = int(batch.num_rows)
        self.nbytes = nbytes
        self._mapping = mapping  # the file mapping the batch's buffers lie in, or None
        self._url = url
        self._tensors: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}

    def check(self) -> None:
        """Raises when the file this record batch is mapped from was cut
        after it was mapped: its pages past the new end read as zeros."""
        if self._mapping is not None and self._mapping.check_size():
            raise EngineReadError(
                f"file '{self._url}' was cut to {int(self._mapping.valid_size)} bytes after the "
                f"dataset mapped it ({int(self._mapping.size)} bytes); open the dataset again"
            )

    def _column(self, name: str) -> Any:
        pa = pyarrow_module()
        column = self._batch.column(name)
        return column.storage if isinstance(column, pa.ExtensionArray) else column

    def encoded(self, column: str) -> Encoded:
        return self._dataset.encoded_column(self._column(column), column)

    def tensor(self, column: str, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        held = self._tensors.get(column)
        if held is None:
            held = self._tensors[column] = _tensor_view(
                self._column(column), self._dataset._kinds[column], column
            )
        values, present = held
        return values[positions], None if present is None else present[positions]

    def values(self, column: str, positions: np.ndarray) -> list[Any]:
        pa = pyarrow_module()
        taken = self._column(column).take(pa.array(positions, type=pa.int64()))
        return list(taken.to_pylist())


def _tensor_view(array: Any, kind: ColumnKind, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """A numeric or fixed-shape column of one record batch as numpy
    ``[rows, *shape]``, a view of the batch's buffer where it can be (no
    nulls below the rows), and a bool mask of the rows present when some are
    null (their values are unspecified)."""
    pa = pyarrow_module()
    assert kind.dtype is not None
    rows = len(array)
    present = np.asarray(array.is_valid()) if array.null_count else None
    if not kind.shape:
        if pa.types.is_boolean(array.type):
            values = array.fill_null(False).to_numpy(zero_copy_only=False)
        else:
            data = array.buffers()[1]
            values = np.frombuffer(data, dtype=kind.dtype)[array.offset : array.offset + rows]
        return values, present
    values_array = array
    for k, dim in enumerate(kind.shape):
        if pa.types.is_fixed_size_list(values_array.type):
            start = values_array.offset * dim
            values_array = values_array.values.slice(start, len(values_array) * dim)
            continue
        # datasets' ArrayXD: variable-size lists, each of the fixed length.
        offsets = np.asarray(values_array.offsets)
        lengths = np.diff(offsets)
        if k == 0 and present is not None:
            lengths = lengths[present]
        if lengths.size and (lengths != dim).any():
            bad = int(np.flatnonzero(lengths != dim)[0])
            raise EngineDataError(
                f"column {name!r}: an array of {int(lengths[bad])} where its type says "
                f"{kind.shape} (dimension {k})"
            )
        if k == 0 and present is not None:
            # Null rows hold no values: the present ones' values, spread out.
            return _spread_rows(values_array, kind, present), present
        values_array = values_array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if values_array.null_count:
        raise EngineDataError(
            f"column {name!r}: a null inside an array, which a tensor cannot hold"
        )
    data = values_array.buffers()[1]
    flat = np.frombuffer(data, dtype=kind.dtype)[
        values_array.offset : values_array.offset + len(values_array)
    ]
    return flat.reshape(rows, *kind.shape), present


def _spread_rows(array: Any, kind: ColumnKind, present: np.ndarray) -> np.ndarray:
    """The rows of an ArrayXD column that has null rows, as numpy (zeros
    where null)."""
    assert kind.dtype is not None
    out = np.zeros((len(array), *kind.shape), dtype=kind.dtype)
    for i in np.flatnonzero(present).tolist():
        out[i] = np.asarray(array[i].as_py(), dtype=kind.dtype)
    return out


# -- the dataset ----------------------------------------------------------------------


class ArrowDataset(BlockDataset):
    """Map-style rows of Arrow IPC files (``save_to_disk`` directories,
    ``datasets``' cache files, Feather v2), concatenated in the order given.

    Args:
        urls: a ``save_to_disk`` directory (its files in ``state.json``'s
            order; a ``DatasetDict``'s directory with `split`), an Arrow IPC
            file (stream or file format: ``.arrow``, ``.feather``, ``.ipc``),
            a brace pattern, a glob (sorted), or a list of these; local paths
            or remote urls (see the module doc).
        columns, decode, fill_null, handler, cache_bytes, readahead,
        num_threads, seed, storage_options, cache_dir, cache_limit_bytes,
        remote, **decode_options: as for ``ParquetDataset``; a record batch
            is what a row group is there.
        split: the split of a ``DatasetDict`` directory (``"train"``).
        base: the directory that image paths without their bytes (``{"bytes":
            None, "path": ...}``, what ``datasets`` keeps of images made from
            files) are relative to; default the current directory, as
            ``datasets`` opens them. Absolute paths and urls are read as they
            are.

    A batch is a dict ``{column: value}``: decoded images, numeric columns
    and fixed-shape numeric arrays (fixed-size lists, ``datasets``'
    ``Array2D`` to ``Array5D``) as tensors of ``[batch, ...]``, any other
    column a list of pyarrow's values; ``ds[i]`` is the dict of one row.
    """

    dataset_name = "ArrowDataset"

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        decode: DecodeSpec = None,
        *,
        split: str | None = None,
        base: str | os.PathLike[str] | None = None,
        fill_null: Mapping[str, FillValue] | None = None,
        handler: Handler = reraise_exception,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        readahead: int = DEFAULT_READAHEAD,
        num_threads: int | None = None,
        seed: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        remote: RemoteOptions | None = None,
        **decode_options: Any,
    ) -> None:
        pyarrow_module()
        self._remote = dataset_remote_options(remote, storage_options, cache_dir, cache_limit_bytes)
        self._base = os.fspath(base) if base is not None else None
        self.urls = self._resolve(urls, split)
        if not self.urls:
            raise ValueError("ArrowDataset: no files given")
        self._per_process: dict[str, Any] = {}  # url -> a remote object's ranged reader
        self._mappings: OrderedDict[str, Any] = OrderedDict()  # url -> mapping, recent last
        self._held_copies: list[Any] = []  # open node-cache entries: not evicted
        self._lock = threading.Lock()
        self._files = [self._describe(url) for url in self.urls]
        first = self._files[0]
        chosen = list(first.schema.names) if columns is None else [str(c) for c in columns]
        kinds: dict[str, ColumnKind] = {}
        for f in self._files:
            for name in chosen:
                if name not in f.schema.names:
                    raise ValueError(
                        f"'{f.url}' has no column {name!r} (its columns: "
                        f"{', '.join(f.schema.names)})"
                    )
                type_ = f.schema.field(name).type
                if type_ != first.schema.field(name).type:
                    raise ValueError(
                        f"column {name!r} is {type_} in '{f.url}' but "
                        f"{first.schema.field(name).type} in '{first.url}'"
                    )
                kinds.setdefault(name, column_kind(f.schema.field(name), first.features))
        self._record_batches = [(k, b) for k, f in enumerate(self._files) for b in f.batches]
        self._init_blocks(
            columns=chosen,
            kinds=kinds,
            block_rows=[b.rows for _, b in self._record_batches],
            block_names=[
                f"file '{f.url}', record batch {g}"
                for f in self._files
                for g in range(len(f.batches))
            ],
            block_urls=[self._files[k].url for k, _ in self._record_batches],
            where=f"'{first.url}'",
            decode=decode,
            fill_null=fill_null,
            handler=handler,
            cache_bytes=cache_bytes,
            readahead=readahead,
            num_threads=num_threads,
            seed=seed,
            decode_options=decode_options,
        )

    # -- opening ------------------------------------------------------------------------

    def _resolve(
        self, urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], split: str | None
    ) -> list[str]:
        """The files of `urls`: directories replaced by the files their
        ``state.json`` lists (``dataset_dict.json``: those of `split`)."""
        out: list[str] = []
        for url in expand_file_patterns(urls, self._remote, "Arrow file"):
            listed = self._directory_files(url, split)
            out.extend([url] if listed is None else listed)
        return out

    def _directory_files(self, url: str, split: str | None) -> list[str] | None:
        """The files a ``save_to_disk`` directory at `url` holds, in order;
        None when `url` is not such a directory."""
        root = url.rstrip("/")

        def read(name: str) -> Any:
            target = f"{root}/{name}"
            if is_remote_url(url):
                try:
                    data = get_session(self._remote).read_bytes(target)
                except (FileNotFoundError, _core.ReadError):
                    return None
            else:
                path = local_path(target) or target
                if not os.path.isfile(path):
                    return None
                with open(path, "rb") as f:
                    data = f.read()
            try:
                return json.loads(data)
            except ValueError as e:
                raise EngineDataError(f"'{target}' is not JSON: {e}") from None

        if not is_remote_url(url):
            path = local_path(url) or url
            if not os.path.isdir(path):
                return None
        elif root.rsplit("/", 1)[-1].endswith((".arrow", ".feather", ".ipc", ".arrows")):
            return None
        splits = read("dataset_dict.json")
        if splits is not None:
            names = [str(s) for s in splits.get("splits", [])]
            if split is None or split not in names:
                raise ValueError(
                    f"'{url}' holds a DatasetDict of splits {names}: name one with split=..."
                )
            return self._directory_files(f"{root}/{split}", None)
        state = read("state.json")
        if state is None:
            if is_remote_url(url):
                return None  # an object, not a directory
            raise FileNotFoundError(
                2, "no state.json here: not a directory saved by datasets' save_to_disk", url
            )
        try:
            names = [str(entry["filename"]) for entry in state["_data_files"]]
        except (KeyError, TypeError):
            raise EngineDataError(
                f"'{root}/state.json' does not list the dataset's files (_data_files)"
            ) from None
        return [f"{root}/{name}" for name in names]

    def _describe(self, url: str) -> _ArrowFile:
        if is_remote_url(url):
            ranges = get_session(self._remote).ranges(url)
            reader_threads.close_at_exit(ranges)
            size, version = int(ranges.size), str(ranges.version)
            schema_bytes, batches = walk_messages(HeaderWindow(ranges, size), size, url)
            self._per_process[url] = ranges
            return self._file(url, url, size, version, schema_bytes, batches, None)
        path = local_path(url) or ""
        if not path:
            raise ValueError(
                f"ArrowDataset reads local files and {remote_scheme_list()} urls; "
                f"{url!r} is neither"
            )
        if not os.path.isfile(path):
            raise FileNotFoundError(2, "Arrow file not found", path)
        stat = file_change_key(path)
        schema_bytes, batches = walk_local_file(path, url)
        return self._file(url, path, stat[2], "", schema_bytes, batches, stat)

    def _file(
        self,
        url: str,
        path: str,
        size: int,
        version: str,
        schema_bytes: bytes,
        batches: list[BatchLocation],
        stat: tuple[int, ...] | None,
    ) -> _ArrowFile:
        pa = pyarrow_module()
        try:
            schema = pa.ipc.read_schema(pa.ipc.read_message(pa.py_buffer(schema_bytes)))
        except (OSError, ValueError) as e:
            raise EngineDataError(f"'{url}' is not a readable Arrow IPC file: {e}") from None
        features: dict[str, Any] = {}
        hf = (schema.metadata or {}).get(b"huggingface")
        if hf:
            try:
                features = dict(json.loads(hf).get("info", {}).get("features") or {})
            except (ValueError, AttributeError):
                features = {}
        return _ArrowFile(
            url,
            path,
            size,
            version,
            schema,
            batches,
            layout_digest(schema_bytes, batches),
            stat,
            features,
        )

    @staticmethod
    def _map(path: str, url: str) -> Any:
        """`path` mapped, or None when this process maps too many files at
        once (its record batches are then read into memory)."""
        if os.path.getsize(path) == 0:
            raise EngineDataError(f"'{url}' is not a readable Arrow IPC file: it is empty")
        return _core._map_file(path)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # Mappings, readers and locks: a process opens its own.
        state.update(_per_process={}, _mappings=OrderedDict(), _held_copies=[])
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()

    def _source_of(self, f: _ArrowFile) -> Any:
        """Where this process reads `f` from: its mapping (a local file, or
        a remote one's copy in the node cache), else a reader of byte ranges
        (``read(offset, n)``: a remote object's ranged reads, or a local
        file's when the mappings are used up)."""
        with self._lock:
            held = self._mappings.get(f.url) or self._per_process.get(f.url)
            if f.url in self._mappings:
                self._mappings.move_to_end(f.url)
        if held is not None:
            return held
        path: str | None = f.path
        if is_remote_url(f.path):
            path = None
            if self._remote.cache_dir:
                session = get_session(self._remote)
                entry = cached_copy(session, f.path, self._remote.cache_dir, self._held_copies)
                path = None if entry is None else str(entry["path"])
        if path is None:
            ranges = get_session(self._remote).ranges(f.path)
            reader_threads.close_at_exit(ranges)  # the block readers' reads end at exit
            if str(ranges.version) != f.version or int(ranges.size) != f.size:
                raise EngineReadError(
                    f"'{f.url}' changed since it was opened (size {f.size}, version "
                    f"{f.version!r}; now {int(ranges.size)}, {str(ranges.version)!r})"
                )
            with self._lock:
                return self._per_process.setdefault(f.url, ranges)
        mapping = self._map(path, f.url)
        if mapping is None:
            return LocalRanges(path)
        with self._lock:
            held = self._mappings.setdefault(f.url, mapping)
            # Each mapping takes one of the process's few slots for mapped
            # files: the least recently read are let go (record batches read
            # from one keep it until they are dropped).
            while len(self._mappings) > _MAPPINGS:
                self._mappings.popitem(last=False)
        return held

    # -- blocks -------------------------------------------------------------------------

    def read_block(self, block: int) -> Block:
        pa = pyarrow_module()
        k, batch = self._record_batches[block]
        f = self._files[k]
        name = self._block_names[block]
        while True:
            source = self._source_of(f)
            mapping = None if hasattr(source, "read") else source
            try:
                if mapping is None:
                    data = pa.py_buffer(source.read(batch.offset, batch.length))
                else:
                    data = pa.py_buffer(mapping).slice(batch.offset, batch.length)
                message = pa.ipc.read_message(data)
                record_batch = pa.ipc.read_record_batch(message, f.schema)
            except _core.ReadError as e:  # the storage failed, not the data
                raise EngineReadError(f"{name}: {e}") from e
            except (OSError, ValueError) as e:  # pyarrow's ArrowIOError, ArrowInvalid
                self._check_unchanged(f, block)
                raise EngineDataError(f"{name}: {e}") from e
            if self._check_unchanged(f, block):
                break
        # A mapped record batch holds the file's pages, not the process's
        # memory, but it keeps its mapping: it counts its bytes too.
        nbytes = int(record_batch.nbytes) if batch.compressed else batch.length
        return _RecordBatch(self, record_batch.select(self.columns), nbytes, mapping, f.url)

    def _check_unchanged(self, f: _ArrowFile, block: int) -> bool:
        """Whether local file `f` is as it was when record batch `block` was
        read: a file rewritten since it was opened raises, naming it, unless
        its message layout is still the one read at open (False: mapped
        again, read the record batch again)."""
        if f.stat is None:
            return True  # remote: its reads are checked against its version
        name = self._block_names[block]
        try:
            now = file_change_key(f.path)
        except FileNotFoundError:
            raise EngineReadError(
                f"{name}: the file was removed after the dataset opened it"
            ) from None
        if now == f.stat:
            return True
        try:
            schema_bytes, batches = walk_local_file(f.path, f.url)
        except (EngineDataError, OSError) as e:
            raise EngineDataError(
                f"{name}: the file changed after the dataset opened it (size {f.size}, now "
                f"{now[2]}) and no longer reads ({e}); open the dataset again"
            ) from None
        if layout_digest(schema_bytes, batches) != f.digest:
            raise EngineDataError(
                f"{name}: the file changed after the dataset opened it (size {f.size}, now "
                f"{now[2]}): its record batches lie elsewhere or hold other columns than "
                "read at open; open the dataset again"
            )
        with self._lock:
            self._mappings.pop(f.url, None)  # mapped again at the next read
        f.stat = now
        return False

    def encoded_column(self, array: Any, name: str) -> Encoded:
        """A binary column or the hub's image struct (its ``bytes``) as the
        engine takes it, without a copy; rows whose bytes are null but whose
        path is set get the file at that path (a copy of the column then)."""
        pa = pyarrow_module()
        paths = None
        if pa.types.is_struct(array.type):
            # flatten(): the fields with the struct's own nulls and offset applied.
            fields = dict(zip([f.name for f in array.type], array.flatten(), strict=True))
            array, paths = fields["bytes"], fields.get("path")
        if (
            paths is not None
            and array.null_count
            and (np.asarray(array.is_null()) & np.asarray(paths.is_valid())).any()
        ):
            array = self._with_referenced_files(array, paths, name)
        _, offsets_buffer, data = array.buffers()
        wide = pa.types.is_large_binary(array.type)
        offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
        offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
        present = np.asarray(array.is_valid()).astype(np.uint8) if array.null_count else None
        return (data if data is not None else pa.py_buffer(b""), offsets, present)

    def _with_referenced_files(self, array: Any, paths: Any, name: str) -> Any:
        """`array` with each null value whose path is set replaced by the
        bytes of the file there."""
        pa = pyarrow_module()
        values = array.to_pylist()
        for i, path in enumerate(paths.to_pylist()):
            if values[i] is None and path is not None:
                values[i] = self._referenced_file(str(path), name)
        return pa.array(values, type=pa.large_binary())

    def _referenced_file(self, path: str, name: str) -> bytes:
        if is_remote_url(path):
            return get_session(self._remote).read_bytes(path)
        target = local_path(path) or path
        if not os.path.isabs(target) and self._base is not None:
            target = os.path.join(self._base, target)
        try:
            with open(target, "rb") as f:
                return f.read()
        except OSError as e:
            raise EngineReadError(
                f"column {name!r}: the image at path {path!r} (its bytes are not in the file) "
                f"does not read: {e.strerror or e}"
            ) from None

    # -- identity ---------------------------------------------------------------------

    def state_identity(self) -> dict[str, Any]:
        """What a loader state of this dataset records of it, and must find
        again when loaded: the files, each one's size and a digest of its
        schema and record batch layout."""
        return {
            "type": "ArrowDataset",
            "files": list(self.urls),
            "sizes": [f.size for f in self._files],
            "layout_digests": [f.digest for f in self._files],
        }

    def reads_remote(self) -> bool:
        return any(is_remote_url(f.path) for f in self._files)

    def __repr__(self) -> str:
        return (
            f"ArrowDataset({len(self._files)} files, {len(self)} rows, "
            f"{len(self._record_batches)} record batches, columns {self.columns})"
        )
