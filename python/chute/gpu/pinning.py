"""Page-locked batch memory without a copy.

With ``pin_memory=True`` and CUDA available, the engine registers each batch
arena with ``cudaHostRegister`` once, when the arena is created, and
unregisters it right before it is freed. Every batch tensor then reports
``is_pinned()`` and copies to the GPU with ``non_blocking=True``, with no
pin-memory thread and no second copy (torch's DataLoader copies every batch
into fresh pinned memory instead).

The engine is not linked against CUDA: this module finds the two functions in
the CUDA runtime library that torch has loaded and hands their addresses to
the engine. Without CUDA, ``pin_memory=True`` is accepted and does nothing,
as in torch.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch


def _loaded_cudart_paths() -> list[str]:
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if "libcudart" in path and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


@functools.lru_cache(maxsize=1)
def pin_hooks() -> tuple[int, int] | None:
    """Addresses of (cudaHostRegister, cudaHostUnregister), or None when
    batches cannot be pinned here (no CUDA device, or no runtime found)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.init()  # type: ignore[no-untyped-call]  # loads the CUDA runtime into the process
    for path in _loaded_cudart_paths():
        try:
            lib = ctypes.CDLL(path)
            register = ctypes.cast(lib.cudaHostRegister, ctypes.c_void_p).value
            unregister = ctypes.cast(lib.cudaHostUnregister, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
        if register and unregister:
            return register, unregister
    return None


@functools.lru_cache(maxsize=1)
def cuda_runtime() -> Any:
    """torch's binding of the CUDA runtime (``torch.cuda.cudart()``), through
    which the loader registers worker processes' shared-memory arenas
    page-locked; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def pin_rest(batch: Any) -> Any:
    """`batch` with each tensor that is not page-locked yet copied into
    page-locked memory (those over registered arenas are kept as they are)."""
    from chute.gpu.device import move_tensors

    return move_tensors(batch, lambda t: t if t.is_pinned() else t.pin_memory())
