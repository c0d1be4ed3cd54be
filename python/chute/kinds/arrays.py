"""Arrays in memory or ``.npy`` files, read by ``ArrayDataset``."""

from __future__ import annotations

from chute.kinds.registry import DataKind, register_kind


class ArrayDatasetKind(DataKind):
    name = "ArrayDataset"
    summary = "rows of arrays (numpy, torch, mapped .npy files) given by field name, map-style"


register_kind(ArrayDatasetKind())
