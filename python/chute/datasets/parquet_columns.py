"""What ``ParquetDataset`` makes of Parquet's columns: the Arrow types it
reads as images, bytes or tensors, the fill values of numeric columns, a
column's values as the native block sources take them, and the bytes of the
images an image column references by path."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from chute.common.errors import EngineDataError
from chute.datasets.blocks import FillValue
from chute.sources.parquet_files import pyarrow_module
from chute.sources.shards import local_path


def is_image_struct(pa: Any, type_: Any) -> bool:
    """The hub's image feature: ``struct<bytes: binary, path: string>``."""
    if not pa.types.is_struct(type_):
        return False
    names = [type_.field(i).name for i in range(type_.num_fields)]
    return "bytes" in names and is_binary(pa, type_.field("bytes").type)


def is_binary(pa: Any, type_: Any) -> bool:
    return bool(pa.types.is_binary(type_) or pa.types.is_large_binary(type_))


def is_numeric(pa: Any, type_: Any) -> bool:
    return bool(
        pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
    )


def column_kind(type_: Any) -> str:
    """What ParquetDataset makes of a column of Arrow type `type_`: "image"
    (the hub's struct, decodable), "binary" (decodable when named), "tensor"
    (numeric) or "list" (pyarrow's values)."""
    pa = pyarrow_module()
    if is_image_struct(pa, type_):
        return "image"
    if is_binary(pa, type_):
        return "binary"
    return "tensor" if is_numeric(pa, type_) else "list"


def value_buffers(column: Any) -> tuple[Any, np.ndarray, Any]:
    """A binary or string column (or the hub's image struct: its ``bytes``)
    as the native block sources take it, without copying the values: (data
    buffer, int64 offsets of each row's value, uint8 present per row or None)."""
    pa = pyarrow_module()
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if is_image_struct(pa, array.type):
        array = array.flatten()[array.type.get_field_index("bytes")]
    _, offsets_buffer, data = array.buffers()
    wide = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    present = None
    if array.null_count:
        present = np.asarray(array.is_valid()).astype(np.uint8)
    return (data if data is not None else pa.py_buffer(b""), offsets, present)


def image_bytes(column: Any, name: str, block_name: str, image_base: str) -> Any:
    """The ``bytes`` of image column `name` of row group `block_name`,
    with each row that has none but a ``path`` (a reference) given the
    bytes of the file at the path, relative to `image_base`; a row with
    neither stays null."""
    pa = pyarrow_module()
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    fields = array.flatten()  # the struct's own nulls carried into each field
    values = fields[array.type.get_field_index("bytes")]
    if "path" not in [array.type.field(i).name for i in range(array.type.num_fields)]:
        return values
    paths = fields[array.type.get_field_index("path")]
    references = np.flatnonzero(np.asarray(values.is_null()) & np.asarray(paths.is_valid()))
    if not len(references):
        return values
    filled = values.to_pylist()
    for row in references.tolist():
        filled[row] = _referenced_image(str(paths[row].as_py()), name, block_name, row, image_base)
    return pa.array(filled, type=values.type)


def _referenced_image(path: str, name: str, block_name: str, row: int, image_base: str) -> bytes:
    where = f"{block_name}, row {row}: column {name!r} holds no image bytes but a path, {path!r}"
    local = local_path(path)
    if local is None:
        raise EngineDataError(
            f"{where}, which is not a local file: only local image references are read "
            "(embed the images, as datasets' embed_table_storage or push_to_hub do)"
        )
    full = os.path.join(image_base, local)
    try:
        with open(full, "rb") as image:
            return image.read()
    except OSError as e:
        relative = "" if os.path.isabs(local) else f" (read from image_base: '{full}')"
        raise EngineDataError(f"{where}, which does not read{relative}: {e.strerror or e}") from e


def fill_scalar(pa: Any, name: str, type_: Any, value: FillValue) -> Any:
    """`value` as a scalar of `type_`, which must hold it (a bool for a bool
    column, an integer in range for an integer column, a number for a float
    column)."""
    flag = isinstance(value, bool | np.bool_)
    if pa.types.is_boolean(type_):
        fits = flag
    elif pa.types.is_integer(type_):
        fits = isinstance(value, int | np.integer) and not flag
    else:
        fits = isinstance(value, int | float | np.integer | np.floating) and not flag
    if fits:
        try:
            scalar = pa.scalar(value, type_)
        except (OverflowError, ValueError, TypeError):  # ArrowInvalid is a ValueError
            scalar = None
        if scalar is not None and (pa.types.is_floating(type_) or scalar.as_py() == value):
            return scalar
    raise ValueError(f"fill_null: {value!r} is not a value of column {name!r} ({type_})")
