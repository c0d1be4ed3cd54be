"""The data kinds chute reads, as one registry (``chute.kinds.registry``:
the contract of an entry). Each module below defines its kinds and
registers them when imported; adding a kind is one module and one import
here. The formats their files are told by are asked in order of priority,
then in this order."""

from chute.kinds import arrays, arrow, curriculum, hdf5, mds, mix, parquet, tar, tokens
from chute.kinds.registry import (
    DataKind,
    FileFormat,
    OpenSpec,
    PathError,
    Target,
    file_formats,
    format_of,
    kind_named,
    kinds_reading,
    register_kind,
    registered_kinds,
)

__all__ = [
    "DataKind",
    "FileFormat",
    "OpenSpec",
    "PathError",
    "Target",
    "arrays",
    "arrow",
    "curriculum",
    "file_formats",
    "format_of",
    "hdf5",
    "kind_named",
    "kinds_reading",
    "mds",
    "mix",
    "parquet",
    "register_kind",
    "registered_kinds",
    "tar",
    "tokens",
]
