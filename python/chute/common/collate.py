"""webdataset's default collation, column by column: Python ints/floats
become a numpy array, tensors are stacked, numpy arrays become one array,
anything else stays a list. Tuples stay tuples, dicts stay dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def combine_values(
    values: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True
) -> Any:
    """One column; `combine_tensors` (tensors and numpy arrays) and
    `combine_scalars` (ints and floats) False leave those as lists."""
    first = values[0]
    if isinstance(first, (int, float)):
        return np.array(list(values)) if combine_scalars else list(values)
    if isinstance(first, (torch.Tensor, np.ndarray)) and combine_tensors:
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) != 1:
            raise ValueError(f"all shapes must be equal in collation, got {shapes}")
        if isinstance(first, torch.Tensor):
            return torch.stack(list(values))
        return np.array(list(values))
    return list(values)


def default_collate(
    samples: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True
) -> Any:
    """webdataset's ``default_collation_fn``, with its two switches."""
    flags = (combine_tensors, combine_scalars)
    first = samples[0]
    if isinstance(first, dict):
        keys = set(first.keys())
        for row in samples[1:]:
            if set(row.keys()) != keys:
                raise ValueError("keys don't match in different samples")
        return {k: combine_values([row[k] for row in samples], *flags) for k in first}
    if isinstance(first, (list, tuple)):
        return tuple(combine_values([row[i] for row in samples], *flags) for i in range(len(first)))
    return combine_values(samples, *flags)
