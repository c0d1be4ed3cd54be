"""Refusing a chute loader that accelerate's ``skip_first_batches`` rebuilt:
the transformers Trainer resuming mid-epoch from a checkpoint, without
``chute.frameworks.hf_trainer.ChuteStateCallback``.

The Trainer skips the batches a checkpoint's epoch already trained on by
handing its loader to ``skip_first_batches``, which builds a torch loader
over the same dataset that reads those batches again and drops them. Over
a ``chute.DataLoader`` that loader iterates chute's batch sampler (or the
stream) without the epoch: the Trainer's ``set_epoch`` reaches neither, so
a shuffled epoch 1 or later replays epoch 0's order, and chute's own state
is never used. Nothing in the run says so; the dataset is the one place
that sees the rebuilt loader (on the stack of its read, under the
Trainer's loop), so it refuses it there, naming the callback that makes
the resume exact.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from torch.utils.data.dataloader import _BaseDataLoaderIter

_ACCELERATE = "accelerate.data_loader"
_TRAINER = "transformers.trainer"
_LOADER_MODULES = (_ACCELERATE, "torch.utils.data.dataloader")
# Frames between the dataset's read and the Trainer's loop that made it.
_DEPTH = 24


def refuse_skipping_rebuild(dataset: Any, owners: list[Any]) -> None:
    """Raises ValueError when the read of `dataset` in progress comes from
    a loader ``skip_first_batches`` rebuilt out of one of `owners` (the
    chute loaders over it), iterated by the Trainer. (Called by accelerate's own
    ``skip_first_batches`` on a loader the caller told its epoch, the
    rebuilt loader reads that epoch's order: it is left to run.)"""
    if not owners or _ACCELERATE not in sys.modules:
        return
    frame: FrameType | None = sys._getframe(2)
    rebuilt = False
    for _ in range(_DEPTH):
        if frame is None:
            return
        module = frame.f_globals.get("__name__")
        if not rebuilt:
            # Only the loaders' own frames can hold them (and f_locals copies).
            if module in _LOADER_MODULES:
                rebuilt = _rebuilds(frame.f_locals.get("self"), dataset, owners)
        elif module == _TRAINER:
            raise ValueError(_message(type(dataset).__name__))
        frame = frame.f_back


def _rebuilds(caller: Any, dataset: Any, owners: list[Any]) -> bool:
    """Whether `caller` (a frame's ``self``) is accelerate's skipping loader
    over `dataset`, or a torch loader iterator batching from accelerate's
    skipping sampler over one of `owners`' batch samplers."""
    kind = type(caller)
    if kind.__module__ == _ACCELERATE and kind.__name__ == "SkipDataLoader":
        return getattr(caller, "dataset", None) is dataset
    if isinstance(caller, _BaseDataLoaderIter):
        skipper = getattr(caller, "_index_sampler", None)
        wrapped = getattr(skipper, "batch_sampler", None)
        if type(skipper).__module__ == _ACCELERATE and type(skipper).__name__ == "SkipBatchSampler":
            return any(wrapped is o.batch_sampler or wrapped is o.sampler for o in owners)
    return False


def _message(name: str) -> str:
    return (
        f"{name} is read by the loader accelerate's skip_first_batches rebuilt from its "
        "chute.DataLoader (the transformers Trainer resuming mid-epoch from a checkpoint): it "
        "reads the batches already trained on again to drop them, in an order the Trainer's "
        "set_epoch never reaches (a shuffled epoch after the first replays the first's), and "
        "chute's loader state is not used, so the resumed run would not train on what the "
        "uninterrupted run does. Add chute.frameworks.hf_trainer.ChuteStateCallback() to the "
        "Trainer's callbacks: it saves the loader's state with each checkpoint and resumes "
        "from it (docs/frameworks.md)"
    )
