"""webdataset's default collation, column by column: Python ints/floats
become a numpy array, tensors are stacked, numpy arrays become one array,
anything else stays a list. Tuples stay tuples, dicts stay dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def combine_values(values: Sequence[Any]) -> Any:
    first = values[0]
    if isinstance(first, (int, float)):
        return np.array(list(values))
    if isinstance(first, torch.Tensor):
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) != 1:
            raise ValueError(f"all shapes must be equal in collation, got {shapes}")
        return torch.stack(list(values))
    if isinstance(first, np.ndarray):
        shapes = {v.shape for v in values}
        if len(shapes) != 1:
            raise ValueError(f"all shapes must be equal in collation, got {shapes}")
        return np.array(list(values))
    return list(values)


def default_collate(samples: Sequence[Any]) -> Any:
    first = samples[0]
    if isinstance(first, dict):
        keys = set(first.keys())
        for row in samples[1:]:
            if set(row.keys()) != keys:
                raise ValueError("keys don't match in different samples")
        return {k: combine_values([row[k] for row in samples]) for k in first}
    if isinstance(first, (list, tuple)):
        return tuple(combine_values([row[i] for row in samples]) for i in range(len(first)))
    return combine_values(samples)
