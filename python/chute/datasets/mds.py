"""``MDSDataset``: Mosaic streaming's MDS shards as a map-style dataset,
image columns decoded and transformed natively.

An MDS directory holds ``index.json`` (format version 2: per shard its
column names, encodings and fixed sizes, its sample count, its file and
size, and the compressed file and size when compressed) beside the shard
files ``shard.NNNNN.mds`` (or ``shard.NNNNN.mds.zstd``, ``.gz``, ``.br``,
``.snappy``, ``.bz2``). A shard is: its sample count (uint32), the sample
offsets (uint32, one more than the samples), its settings as JSON, then the
samples; a sample is the sizes of its variable-size columns (uint32 each),
then every column's bytes, columns in the index's order.

Each shard is a block (``chute.datasets.blocks``): read whole (and
decompressed) on a small thread pool ahead of the batches, checked against
the index (size, sample count, settings, every sample's extent; the first
time a process reads it, also one of the hashes the index lists for its
file, where hashlib or xxhash computes one), kept within ``cache_bytes``.
``jpeg`` and ``png`` columns (and ``bytes`` columns named in ``decode``:
WebP too) are handed to the native decoders and transforms; numeric
columns and fixed-shape ``ndarray`` columns become tensors, every other
column a list. Columns encoded with ``pkl`` are pickles: they are refused
unless ``allow_unsafe_types=True`` (unpickling runs whatever code the
pickle names).

Named for the format rather than after streaming's ``StreamingDataset``: it
is random access by sample id (torch's map-style protocol, chute's
samplers, DDP and resume), not streaming's iterable with its own shuffle.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import torch

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
)
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources import reader_threads
from chute.sources.remote_urls import dataset_remote_options
from chute.sources.shards import local_path, remote_scheme_list

# Fixed-size scalar encodings and their dtypes.
_SCALARS = {
    "int": "int64",
    **{
        name: name
        for name in (
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "int8",
            "int16",
            "int32",
            "int64",
            "float16",
            "float32",
            "float64",
        )
    },
}
# ndarray's value dtypes by the byte a dynamic-dtype array starts with.
_NDARRAY_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
# A dynamic-shape ndarray's shape dtype, by the low two bits of its first shape byte.
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
# The raw pixels of a "pil" column: numpy's view of Pillow's modes (others are refused).
_PIL_MODES = {
    "1": None,
    "L": ("uint8", 1),
    "P": ("uint8", 1),
    "RGB": ("uint8", 3),
    "RGBA": ("uint8", 4),
    "CMYK": ("uint8", 4),
    "YCbCr": ("uint8", 3),
    "LA": ("uint8", 2),
    "I;16": ("<u2", 1),
    "I": ("<i4", 1),
    "F": ("<f4", 1),
}
_LISTS = {"list[jpeg]", "list[png]", "list[pil]", "jpeg_array", "jpegarray"}
_TEXT = {"str", "json", "str_decimal"}
_UNSAFE = {"pkl"}


def _decompressor(algorithm: str) -> Callable[[Any, int], Any]:
    """The function that decompresses a shard of `algorithm` (the index's
    ``compression``, its level dropped) to `n` bytes (cramjam, ``pip install
    'chute[mds]'``)."""
    try:
        import cramjam
    except ImportError:
        raise ImportError(
            "chute reads compressed MDS shards with cramjam: pip install 'chute[mds]'"
        ) from None
    table: dict[str, Callable[[Any, int], Any]] = {
        "zstd": lambda data, n: cramjam.zstd.decompress(data, output_len=n),
        "gz": lambda data, n: cramjam.gzip.decompress(data, output_len=n),
        "br": lambda data, n: cramjam.brotli.decompress(data, output_len=n),
        "snappy": lambda data, n: cramjam.snappy.decompress_raw(data, output_len=n),
        "bz2": lambda data, n: cramjam.bzip2.decompress(data, output_len=n),
    }
    found = table.get(algorithm)
    if found is None:
        raise ValueError(
            f"MDS shards compressed with {algorithm!r} are not read (zstd, gz, br, snappy, bz2 are)"
        )
    return found


@dataclass(frozen=True)
class _Shard:
    """One shard as the index describes it."""

    directory: str  # the dataset directory (with its split) the shard is in
    raw: str  # file name of the uncompressed shard
    raw_bytes: int
    zip: str | None  # file name of the compressed shard, if compressed
    zip_bytes: int
    compression: str | None  # the algorithm, its level dropped
    samples: int
    names: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]
    # {algorithm: hex digest} of each file, as the writer's ``hashes=`` listed them.
    raw_hashes: Mapping[str, str] = field(default_factory=dict)
    zip_hashes: Mapping[str, str] = field(default_factory=dict)


# The algorithms tried first when a file lists several: the fastest.
_HASH_PREFERENCE = ("xxh3_64", "xxh3_128", "xxh128", "xxh64", "xxh32", "blake2b", "sha1", "md5")


def _hash_function(algorithm: str) -> Callable[[bytes], Any] | None:
    """hashlib's or xxhash's constructor named `algorithm` as streaming's
    writer names them (None where neither computes it here)."""
    if algorithm.startswith("xxh"):
        try:
            import xxhash
        except ImportError:
            return None
        return (
            getattr(xxhash, algorithm, None) if algorithm in xxhash.algorithms_available else None
        )
    if algorithm in hashlib.algorithms_available and not algorithm.startswith("shake_"):
        return getattr(hashlib, algorithm, None)
    return None


def _chosen_hash(hashes: Mapping[str, str]) -> tuple[str, Callable[[bytes], Any]] | None:
    """The algorithm (and its function) a file of `hashes` is verified with:
    the first computable in `_HASH_PREFERENCE`, else in name order."""
    ranked = sorted(
        hashes,
        key=lambda a: (
            _HASH_PREFERENCE.index(a) if a in _HASH_PREFERENCE else len(_HASH_PREFERENCE),
            a,
        ),
    )
    for algorithm in ranked:
        function = _hash_function(algorithm)
        if function is not None:
            return algorithm, function
    return None


def _file_hashes(info: Mapping[str, Any]) -> dict[str, str]:
    listed = info.get("hashes") or {}
    return {str(a): str(v).lower() for a, v in dict(listed).items()}


def _join(directory: str, name: str) -> str:
    return (
        f"{directory.rstrip('/')}/{name}"
        if is_remote_url(directory)
        else os.path.join(directory, name)
    )


def _column_kind(encoding: str, allow_unsafe: bool, name: str, where: str) -> ColumnKind:
    """What MDSDataset makes of a column of `encoding` (docs/arrow_mds.md)."""
    if encoding in ("jpeg", "png"):
        return ColumnKind("encoded", encoding, image=True)
    if encoding == "bytes":
        return ColumnKind("encoded", encoding)
    if encoding in _SCALARS:
        return ColumnKind("tensor", encoding, dtype=np.dtype(_SCALARS[encoding]))
    if encoding == "str_int":
        return ColumnKind("tensor", encoding, dtype=np.dtype("int64"))
    if encoding == "str_float":
        return ColumnKind("tensor", encoding, dtype=np.dtype("float64"))
    if encoding.startswith("ndarray"):
        dtype, shape = _ndarray_settings(encoding)
        if dtype is not None and shape is not None:
            return ColumnKind("tensor", encoding, dtype=np.dtype(dtype), shape=shape)
        return ColumnKind("list", encoding)
    if encoding in _UNSAFE:
        if not allow_unsafe:
            raise ValueError(
                f"column {name!r} of {where} is encoded as {encoding!r} (a pickle): reading it "
                "runs whatever code the pickle names; MDSDataset(allow_unsafe_types=True) reads "
                "it, or leave it out of columns="
            )
        return ColumnKind("list", encoding)
    if encoding in _TEXT or encoding in _LISTS or encoding == "pil":
        return ColumnKind("list", encoding)
    raise ValueError(
        f"column {name!r} of {where} has encoding {encoding!r}, which MDSDataset does not read"
    )


def _ndarray_settings(encoding: str) -> tuple[str | None, tuple[int, ...] | None]:
    """An ``ndarray[:dtype[:shape]]`` encoding's fixed dtype and shape (None where dynamic)."""
    parts = encoding.split(":")[1:]
    dtype = parts[0] if parts and parts[0] else None
    if dtype is not None and dtype not in _NDARRAY_DTYPES.values():
        raise ValueError(f"encoding {encoding!r}: dtype {dtype!r} is not one MDS writes")
    shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 and parts[1] else None
    return dtype, shape


class _ShardBlock(Block):
    """One shard in memory: where each sample's columns lie in it."""

    def __init__(self, data: Any, shard: _Shard, name: str) -> None:
        self._data = np.frombuffer(data, dtype=np.uint8)
        self._shard = shard
        self._name = name
        self.rows, starts, sizes = _layout(self._data, shard, name)
        self._column = {c: k for k, c in enumerate(shard.names)}
        self._starts = starts  # [rows, columns] int64: where each value begins
        self._sizes = sizes  # [rows, columns] int64: its bytes
        self.nbytes = int(self._data.nbytes)
        self._copies: dict[str, Encoded] = {}

    def check(self) -> None:
        """Nothing to check: the shard was read into memory, and checked then."""

    def _extent(self, column: str, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = self._column[column]
        return self._starts[positions, k], self._sizes[positions, k]

    def encoded(self, column: str) -> Encoded:
        held = self._copies.get(column)
        if held is None:
            starts, sizes = self._extent(column, np.arange(self.rows))
            view = memoryview(self._data.data)
            data = b"".join(
                [view[s : s + n] for s, n in zip(starts.tolist(), sizes.tolist(), strict=True)]
            )
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            held = self._copies[column] = (data, offsets, None)
            self.nbytes += len(data) + offsets.nbytes
        return held

    def tensor(self, column: str, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        k = self._column[column]
        encoding = self._shard.encodings[k]
        starts, sizes = self._extent(column, positions)
        if encoding in ("str_int", "str_float"):
            parse = int if encoding == "str_int" else float
            values = [
                parse(self._bytes(s, n).decode("utf-8"))
                for s, n in zip(starts.tolist(), sizes.tolist(), strict=True)
            ]
            return np.array(values, dtype=np.int64 if encoding == "str_int" else np.float64), None
        if encoding in _SCALARS:
            dtype = np.dtype(_SCALARS[encoding])
            shape: tuple[int, ...] = ()
        else:
            fixed_dtype, fixed_shape = _ndarray_settings(encoding)
            assert fixed_dtype is not None and fixed_shape is not None
            dtype, shape = np.dtype(fixed_dtype), fixed_shape
        itemsize = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if (sizes != itemsize).any():
            raise EngineDataError(
                f"{self._name}: column {column!r} holds a value of another size than its "
                f"encoding {encoding!r}"
            )
        index = starts[:, None] + np.arange(itemsize)
        raw = self._data[index].reshape(-1)
        return raw.view(dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(
            len(positions), *shape
        ), None

    def values(self, column: str, positions: np.ndarray) -> list[Any]:
        k = self._column[column]
        encoding = self._shard.encodings[k]
        starts, sizes = self._extent(column, positions)
        return [
            _decode_value(encoding, self._bytes(s, n), column, self._name)
            for s, n in zip(starts.tolist(), sizes.tolist(), strict=True)
        ]

    def _bytes(self, start: int, size: int) -> bytes:
        return self._data[start : start + size].tobytes()


def _layout(data: np.ndarray, shard: _Shard, name: str) -> tuple[int, np.ndarray, np.ndarray]:
    """A shard's sample count and where each sample's columns begin and how
    many bytes each holds ([samples, columns] each), checked against the
    index's description of it."""

    def bad(why: str) -> EngineDataError:
        return EngineDataError(f"{name}: {why}; it does not match index.json (rewritten since?)")

    size = int(data.size)
    if size != shard.raw_bytes:
        raise bad(f"{size} bytes where the index says {shard.raw_bytes}")
    if size < 4:
        raise bad("shorter than its header")
    n = int(data[:4].view("<u4")[0])
    if n != shard.samples:
        raise bad(f"{n} samples where the index says {shard.samples}")
    head = 4 + 4 * (n + 1)
    if head > size:
        raise bad("shorter than its sample offsets")
    offsets = data[4:head].view("<u4").astype(np.int64)
    try:
        settings = json.loads(data[head : offsets[0]].tobytes())
    except ValueError:
        raise bad("its settings are not JSON") from None
    if list(settings.get("column_names", [])) != list(shard.names) or list(
        settings.get("column_encodings", [])
    ) != list(shard.encodings):
        raise bad("its columns are not those the index names")
    if (np.diff(offsets) < 0).any() or int(offsets[-1]) != size:
        raise bad("its sample offsets do not lie in order within it")
    variable = [k for k, s in enumerate(shard.sizes) if s is None]
    begin = offsets[:-1]
    end = offsets[1:]
    ncols = len(shard.names)
    sizes = np.empty((n, ncols), dtype=np.int64)
    head_bytes = 4 * len(variable)
    if n and ((end - begin) < head_bytes).any():
        raise bad("a sample is shorter than its sizes")
    if variable:
        index = (begin[:, None] + 4 * np.arange(len(variable)))[:, :, None] + np.arange(4)
        sizes[:, variable] = data[index].reshape(n, len(variable), 4).copy().view("<u4")[:, :, 0]
    for k, s in enumerate(shard.sizes):
        if s is not None:
            sizes[:, k] = s
    starts = (
        begin[:, None]
        + head_bytes
        + np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(sizes, axis=1)[:, :-1]], axis=1)
    )
    if n and ncols:
        filled = starts[:, -1] + sizes[:, -1]
        if (filled != end).any():
            first = int(np.flatnonzero(filled != end)[0])
            raise bad(f"sample {first}'s columns do not fill it")
    return n, starts, sizes


def _decode_value(encoding: str, data: bytes, column: str, where: str) -> Any:
    """One value of a list column, as streaming's own reader gives it (but
    images: encoded bytes, or pixel arrays for ``pil``)."""
    if encoding == "bytes" or encoding in ("jpeg", "png"):
        return data
    if encoding == "str":
        return data.decode("utf-8")
    if encoding == "json":
        return json.loads(data.decode("utf-8"))
    if encoding == "str_decimal":
        return Decimal(data.decode("utf-8"))
    if encoding == "pkl":
        return pickle.loads(data)  # the user opted in (allow_unsafe_types=True)
    if encoding.startswith("ndarray"):
        return torch.from_numpy(_ndarray(encoding, data))
    if encoding == "pil":
        return torch.from_numpy(_pil_pixels(data, column, where))
    if encoding in ("jpeg_array", "jpegarray"):
        count = int(np.frombuffer(data[:4], "<u4")[0])
        sizes = np.frombuffer(data[4 : 4 + 4 * count], "<u4").astype(np.int64)
        return _split(data, 4 + 4 * count, sizes)
    if encoding in _LISTS:
        count = int(np.frombuffer(data[4:8], "<u4")[0])  # the first four bytes are reserved
        sizes = np.frombuffer(data[8 : 8 + 4 * count], "<u4").astype(np.int64)
        parts = _split(data, 8 + 4 * count, sizes)
        if encoding == "list[pil]":
            return [torch.from_numpy(_pil_pixels(p, column, where)) for p in parts]
        return parts
    raise AssertionError(encoding)


def _split(data: bytes, at: int, sizes: np.ndarray) -> list[bytes]:
    out = []
    for n in sizes.tolist():
        out.append(data[at : at + n])
        at += n
    return out


def _ndarray(encoding: str, data: bytes) -> np.ndarray:
    """One ``ndarray`` value (its dtype and shape from the encoding, or from
    the value's own leading bytes where the encoding leaves them open)."""
    dtype, shape = _ndarray_settings(encoding)
    at = 0
    if dtype is None:
        dtype = _NDARRAY_DTYPES[data[0]]
        at = 1
    if shape is None:
        byte = data[at]
        ndim, shape_dtype = byte >> 2, _SHAPE_DTYPES[byte & 3]
        width = np.dtype(shape_dtype).itemsize
        shape = tuple(
            int(d) for d in np.frombuffer(data[at + 1 : at + 1 + ndim * width], shape_dtype)
        )
        at += 1 + ndim * width
    return np.frombuffer(data[at:], dtype=dtype).reshape(shape).copy()


def _pil_pixels(data: bytes, column: str, where: str) -> np.ndarray:
    """A ``pil`` value (width, height, mode, then Pillow's raw bytes) as
    pixels ``[height, width(, channels)]``."""
    width, height, mode_size = (int(v) for v in np.frombuffer(data[:12], "<u4"))
    mode = data[12 : 12 + mode_size].decode("utf-8")
    layout = _PIL_MODES.get(mode)
    if layout is None:
        raise EngineDataError(
            f"{where}: column {column!r} holds a Pillow image of mode {mode!r}, which is not "
            "read as pixels"
        )
    dtype, channels = layout
    pixels = np.frombuffer(data[12 + mode_size :], dtype=dtype)
    shape = (height, width) if channels == 1 else (height, width, channels)
    return pixels.reshape(shape).astype(np.dtype(dtype).newbyteorder("="), copy=True)


class MDSDataset(BlockDataset):
    """Map-style samples of Mosaic streaming MDS directories, concatenated
    in the order given.

    Args:
        dirs: an MDS directory (holding ``index.json``), or a list of them;
            local paths or remote urls (``s3://``, ``gs://``, ``az://``,
            ``http(s)://``, ``hf://``; ``pip install 'chute[remote]'``).
        columns: the columns to read, in output order (default: every column
            of the first shard). Every shard must have them, with the same
            encodings.
        decode: an image spec (``"torchrgb8"``, ``"rgb8"``, ...) for every
            ``jpeg`` and ``png`` column among `columns`, or ``{column:
            spec}`` naming ``jpeg``, ``png`` or ``bytes`` columns (WebP in
            ``bytes`` decodes so); None decodes nothing (the encoded bytes
            come back).
        split: the subdirectory of each of `dirs` to read (streaming's ``split``).
        allow_unsafe_types: read ``pkl`` columns (pickles: see the module doc).
        handler, cache_bytes, readahead, num_threads, seed, storage_options,
        cache_dir, cache_limit_bytes, remote, **decode_options: as for
            ``ParquetDataset``; a shard is what a row group is there.

    A batch is a dict ``{column: value}``: decoded images, numeric columns
    (``int`` and the sized scalars, ``str_int``, ``str_float``) and
    fixed-shape ``ndarray`` columns as tensors of ``[batch, ...]``; every
    other column a list (``str``, ``json``, ``bytes``, undecoded images as
    bytes, dynamic ``ndarray`` and ``pil`` values as tensors, ``list[...]``
    as lists). ``ds[i]`` is the dict of one sample.
    """

    dataset_name = "MDSDataset"

    def __init__(
        self,
        dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        decode: DecodeSpec = None,
        *,
        split: str | None = None,
        allow_unsafe_types: bool = False,
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
        self._remote = dataset_remote_options(remote, storage_options, cache_dir, cache_limit_bytes)
        items = [dirs] if isinstance(dirs, str | os.PathLike) else list(dirs)
        self.dirs = [os.fspath(d) for d in items]
        if not self.dirs:
            raise ValueError("MDSDataset: no directories given")
        self.split = split
        self._shards: list[_Shard] = []
        # The shards process `_verified_pid` has read and checked against their hashes.
        self._verified_shards: set[int] = set()
        self._verified_pid = os.getpid()
        self._index_digests: list[str] = []
        for d in self.dirs:
            directory = _join(d, split) if split else d
            shards, digest = self._read_index(directory)
            self._shards.extend(shards)
            self._index_digests.append(digest)
        if not self._shards:
            raise ValueError(f"MDSDataset: {self.dirs} hold no shards")
        first = self._shards[0]
        where = f"'{_join(first.directory, 'index.json')}'"
        chosen = list(first.names) if columns is None else [str(c) for c in columns]
        kinds: dict[str, ColumnKind] = {}
        for shard in self._shards:
            shard_where = f"shard '{_join(shard.directory, shard.raw)}'"
            for name in chosen:
                if name not in shard.names:
                    raise ValueError(
                        f"{shard_where} has no column {name!r} (its columns: "
                        f"{', '.join(shard.names)})"
                    )
                encoding = shard.encodings[shard.names.index(name)]
                expected = first.encodings[first.names.index(name)]
                if encoding != expected:
                    raise ValueError(
                        f"column {name!r} is {encoding!r} in {shard_where} but {expected!r} in "
                        f"shard '{_join(first.directory, first.raw)}'"
                    )
                kinds.setdefault(name, _column_kind(encoding, allow_unsafe_types, name, where))
        self.allow_unsafe_types = allow_unsafe_types
        self._init_blocks(
            columns=chosen,
            kinds=kinds,
            block_rows=[s.samples for s in self._shards],
            block_names=[f"shard '{_join(s.directory, s.zip or s.raw)}'" for s in self._shards],
            block_urls=[_join(s.directory, s.zip or s.raw) for s in self._shards],
            where=where,
            decode=decode,
            fill_null=None,
            handler=handler,
            cache_bytes=cache_bytes,
            readahead=readahead,
            num_threads=num_threads,
            seed=seed,
            decode_options=decode_options,
        )

    # -- opening ------------------------------------------------------------------------

    def _read_index(self, directory: str) -> tuple[list[_Shard], str]:
        url = _join(directory, "index.json")
        data = self._read_file(url, "MDS index")
        try:
            index = json.loads(data)
        except ValueError as e:
            raise EngineDataError(f"'{url}' is not JSON: {e}") from None
        if not isinstance(index, dict) or index.get("version") != 2:
            raise EngineDataError(
                f"'{url}' is not an MDS index of version 2 (streaming's): version "
                f"{index.get('version') if isinstance(index, dict) else None!r}"
            )
        shards = []
        for k, entry in enumerate(index.get("shards", [])):
            try:
                if entry["format"] != "mds":
                    raise EngineDataError(
                        f"'{url}': shard {k} is of format {entry['format']!r}; MDSDataset reads "
                        "mds shards (streaming's JSON and CSV shards are not read)"
                    )
                zip_data = entry.get("zip_data")
                compression = entry.get("compression")
                shards.append(
                    _Shard(
                        directory=directory,
                        raw=str(entry["raw_data"]["basename"]),
                        raw_bytes=int(entry["raw_data"]["bytes"]),
                        zip=str(zip_data["basename"]) if zip_data else None,
                        zip_bytes=int(zip_data["bytes"]) if zip_data else 0,
                        compression=str(compression).split(":")[0] if compression else None,
                        samples=int(entry["samples"]),
                        names=tuple(str(n) for n in entry["column_names"]),
                        encodings=tuple(str(e) for e in entry["column_encodings"]),
                        sizes=tuple(None if s is None else int(s) for s in entry["column_sizes"]),
                        raw_hashes=_file_hashes(entry["raw_data"]),
                        zip_hashes=_file_hashes(zip_data) if zip_data else {},
                    )
                )
            except (KeyError, TypeError, ValueError) as e:
                if isinstance(e, EngineDataError):
                    raise
                raise EngineDataError(
                    f"'{url}': shard {k} is not described as MDS describes shards ({e!r})"
                ) from None
            if shards[-1].compression:
                _decompressor(shards[-1].compression)  # an unknown algorithm fails at open
        return shards, hashlib.sha256(data).hexdigest()[:16]

    def _read_file(self, url: str, what: str) -> bytes:
        if is_remote_url(url):
            try:
                with get_session(self._remote).open(url) as f:
                    reader_threads.close_at_exit(f)  # a block reader's read ends at exit
                    return f.read()
            except _core.ReadError as e:
                raise EngineReadError(f"cannot read the {what}: {e}") from e
        path = local_path(url)
        if path is None:
            raise ValueError(
                f"MDSDataset reads local directories and {remote_scheme_list()} urls; {url!r} "
                "is neither"
            )
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(2, f"{what} not found", path) from None

    # -- blocks -------------------------------------------------------------------------

    def read_block(self, block: int) -> Block:
        shard = self._shards[block]
        name = self._block_names[block]
        raw_url = _join(shard.directory, shard.raw)
        raw_path = None if is_remote_url(raw_url) else local_path(raw_url)
        try:
            if shard.zip is None or (
                raw_path is not None
                and os.path.isfile(raw_path)
                and os.path.getsize(raw_path) == shard.raw_bytes
            ):
                # The uncompressed file, where streaming left one beside the compressed.
                data: Any = self._read_file(raw_url, "MDS shard")
                self._verify(block, data, shard.raw_hashes, raw_url)
            else:
                zip_url = _join(shard.directory, shard.zip)
                packed = self._read_file(zip_url, "MDS shard")
                if len(packed) != shard.zip_bytes:
                    raise EngineDataError(
                        f"{name}: {len(packed)} bytes where the index says {shard.zip_bytes}; it "
                        "does not match index.json (rewritten since?)"
                    )
                self._verify(block, packed, shard.zip_hashes, zip_url)
                assert shard.compression is not None
                try:
                    data = _decompressor(shard.compression)(packed, shard.raw_bytes)
                except Exception as e:  # cramjam's DecompressionError
                    raise EngineDataError(
                        f"{name}: does not decompress as {shard.compression}: {e}"
                    ) from None
        except _core.ReadError as e:
            raise EngineReadError(f"{name}: {e}") from e
        except FileNotFoundError as e:
            raise EngineReadError(f"{name}: {e.strerror}") from None
        return _ShardBlock(data, shard, name)

    def _verify(self, block: int, data: bytes, hashes: Mapping[str, str], url: str) -> None:
        """Checks the file of shard `block` read as `data` against the hash
        its index lists, the first time this process reads the shard."""
        if self._verified_pid != os.getpid():  # a copy in a worker process (forked or not)
            self._verified_shards, self._verified_pid = set(), os.getpid()
        if block in self._verified_shards:
            return
        chosen = _chosen_hash(hashes)
        if chosen is not None:
            algorithm, function = chosen
            found = str(function(data).hexdigest()).lower()
            if found != hashes[algorithm]:
                raise EngineDataError(
                    f"shard '{url}': its {algorithm} hash is {found} where the index says "
                    f"{hashes[algorithm]}; it does not match index.json (changed since written?)"
                )
        self._verified_shards.add(block)

    # -- identity ---------------------------------------------------------------------

    def state_identity(self) -> dict[str, Any]:
        """What a loader state of this dataset records of it, and must find
        again when loaded: the directories and a digest of each index."""
        return {
            "type": "MDSDataset",
            "dirs": list(self.dirs),
            "split": self.split,
            "index_digests": list(self._index_digests),
        }

    def reads_remote(self) -> bool:
        return any(is_remote_url(d) for d in self.dirs)

    def __repr__(self) -> str:
        return (
            f"MDSDataset({len(self.dirs)} directories, {len(self)} samples, "
            f"{len(self._shards)} shards, columns {self.columns})"
        )
