"""torch's ``default_collate`` (a tensor per column, stacked), which chute's
worker processes hand their batches to: tensors and numpy arrays that are
consecutive rows of one block of memory, as the rows of an arena's group
are, become one view of that block instead of a copy. (webdataset's
collation, another meaning of "default", is `chute.common.collate`.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def collate_tensors(
    batch: Sequence[torch.Tensor],
    *,
    collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] | None = None,
) -> torch.Tensor:
    """torch's default collation of tensors (a stack), as a view when they
    are consecutive rows of one block of memory (as the rows of a group in
    an arena are): the same values without a copy."""
    view = _rows_view(batch)
    if view is not None:
        return view
    from torch.utils.data._utils.collate import collate_tensor_fn

    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)  # type: ignore[no-any-return]


def _rows_view(batch: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """`batch` stacked as a view of its first tensor's storage, when its
    tensors are alike, contiguous, lie back to back in that order and all
    within that storage; else None. A few attribute reads per tensor: this
    runs for every batch of the loader's process."""
    first = batch[0]
    if type(first) is not torch.Tensor or first.requires_grad or not first.is_contiguous():
        return None
    n = first.numel()
    if not n:
        return None
    step = n * first.element_size()
    start = first.data_ptr()
    storage = first.untyped_storage()
    if start + len(batch) * step > storage.data_ptr() + storage.nbytes():
        return None
    dtype, shape = first.dtype, first.shape
    address = start
    for t in batch:
        if (
            type(t) is not torch.Tensor
            or t.data_ptr() != address
            or t.dtype != dtype
            or t.shape != shape
            or t.requires_grad
            or not t.is_contiguous()
        ):
            return None
        address += step
    return first.as_strided((len(batch), *shape), (n, *first.stride()), first.storage_offset())


def collate_arrays(
    batch: Sequence[np.ndarray],
    *,
    collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] | None = None,
) -> Any:
    """torch's default collation of numpy arrays (a tensor of them
    stacked), as a view when they are consecutive rows of one array (as the
    rows of a group in an arena are)."""
    view = _array_rows_view(batch)
    if view is not None:
        return torch.from_numpy(view)
    from torch.utils.data._utils.collate import collate_numpy_array_fn

    return collate_numpy_array_fn(batch, collate_fn_map=collate_fn_map)


def _array_rows_view(batch: Sequence[np.ndarray]) -> np.ndarray | None:
    """`batch` stacked as a view, when its arrays are alike, C-contiguous,
    of a kind torch takes, views of one array and lie back to back in that
    order within it; else None."""
    first = batch[0]
    owner = first.base
    dtype = first.dtype
    if (
        type(first) is not np.ndarray
        or type(owner) is not np.ndarray
        or dtype.kind not in "biufc"
        or not dtype.isnative
        or not first.flags.c_contiguous
        or not first.nbytes
    ):
        return None
    step = first.nbytes
    start = first.__array_interface__["data"][0]
    owner_start = owner.__array_interface__["data"][0]
    if start < owner_start or start + len(batch) * step > owner_start + owner.nbytes:
        return None
    shape = first.shape
    address = start
    for a in batch:
        if (
            type(a) is not np.ndarray
            or a.base is not owner
            or a.__array_interface__["data"][0] != address
            or a.dtype != dtype
            or a.shape != shape
            or not a.flags.c_contiguous
        ):
            return None
        address += step
    return np.lib.stride_tricks.as_strided(
        first, (len(batch), *shape), (step, *first.strides), writeable=True
    )


def torch_collate(batch: list[Any]) -> Any:
    """torch's ``default_collate``, with tensors and numpy arrays collated
    by `collate_tensors` and `collate_arrays`."""
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    return collate(
        batch,
        collate_fn_map={
            **default_collate_fn_map,
            torch.Tensor: collate_tensors,
            np.ndarray: collate_arrays,
        },
    )
