"""``ChuteStateCallback``: a transformers ``Trainer`` resumes a
``chute.DataLoader`` from its own state.

The Trainer resumes a mid-epoch checkpoint by handing its loader to
accelerate's ``skip_first_batches``, which rebuilds it as a torch loader
that reads (and drops) the batches already trained on: chute's engine, its
state and the sampler's ``set_epoch`` are then bypassed. With this callback
the Trainer skips nothing (``ignore_data_skip``): each rank's loader state
is saved beside every checkpoint (``chute_loader_rank{r}.pt``) and loaded
when training resumes from it, so the resumed epoch continues at the next
unseen batch, in the uninterrupted run's order. At an epoch boundary no
state is loaded: the epoch the Trainer tells the loader (``set_epoch``)
decides its order, as in the uninterrupted run.

Use it with a ``get_train_dataloader`` override that returns the
``chute.DataLoader`` (``distributed=True``, or a stream split across ranks,
under several processes), which the Trainer uses as is.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from chute.loader.dataloader import DataLoader

STATE_FILE = "chute_loader_rank{rank}.pt"


def _rank() -> int:
    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


class ChuteStateCallback(TrainerCallback):
    """Saves the training ``chute.DataLoader``'s state with each checkpoint
    and resumes it from the checkpoint training resumes from.

    `resume_from`: the checkpoint folder ``trainer.train(resume_from_checkpoint=...)``
    is given, when it is not ``{output_dir}/checkpoint-{step}`` (where the
    Trainer writes them)."""

    def __init__(self, resume_from: str | os.PathLike[str] | None = None) -> None:
        self.resume_from = None if resume_from is None else os.fspath(resume_from)

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        # The loader's state replaces the Trainer's skipping of trained batches.
        args.ignore_data_skip = True

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        train_dataloader: Any = None,
        **_: Any,
    ) -> None:
        loader = _chute_loader(train_dataloader)
        if not args.ignore_data_skip:
            raise ValueError(
                "ChuteStateCallback resumes the loader from its state: the Trainer must not "
                "skip batches as well (TrainingArguments(ignore_data_skip=True))"
            )
        if state.global_step == 0:
            return
        try:
            batches = len(loader)
        except TypeError:
            raise ValueError(
                "ChuteStateCallback needs the loader's len() to tell the Trainer's epochs "
                "apart: give the stream a length (.with_length(n), or sidecar indexes and "
                ".with_length())"
            ) from None
        accumulation = max(1, int(args.gradient_accumulation_steps))
        steps_per_epoch = max(1, -(-batches // accumulation))
        if state.global_step % steps_per_epoch == 0:
            return  # an epoch boundary: set_epoch decides the next epoch's order
        folder = self.resume_from or os.path.join(
            str(args.output_dir), f"checkpoint-{state.global_step}"
        )
        path = os.path.join(folder, STATE_FILE.format(rank=_rank()))
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"resuming at step {state.global_step}, mid-epoch, but {path} (the loader's "
                "state, which ChuteStateCallback saves with each checkpoint) is missing: "
                "pass ChuteStateCallback(resume_from=<the checkpoint folder>)"
            )
        loader.load_state_dict(torch.load(path, weights_only=True))

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        train_dataloader: Any = None,
        **_: Any,
    ) -> None:
        loader = _chute_loader(train_dataloader)
        folder = os.path.join(str(args.output_dir), f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        torch.save(loader.state_dict(), os.path.join(folder, STATE_FILE.format(rank=_rank())))


def _chute_loader(loader: Any) -> DataLoader[Any]:
    if not isinstance(loader, DataLoader):
        raise TypeError(
            "ChuteStateCallback saves and loads a chute.DataLoader's state, but the Trainer "
            f"trains on a {type(loader).__name__} (a loader it built over train_dataset): "
            "override Trainer.get_train_dataloader to return the chute.DataLoader"
        )
    return loader
