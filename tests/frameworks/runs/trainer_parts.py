"""What the Trainer runs (trainer_run.py under torchrun, and
test_trainer_one_process.py in one process) share: a Trainer whose
get_train_dataloader returns a chute loader, and a callback that stops it
at a step (where a checkpoint is saved)."""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback


class ChuteTrainer(Trainer):  # type: ignore[misc]
    """`make_loader()` is the training loader; None: the Trainer builds its own."""

    def __init__(self, make_loader: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.make_loader = make_loader

    def get_train_dataloader(self) -> Any:
        if self.make_loader is None:
            return super().get_train_dataloader()
        return self.make_loader()

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **_: Any) -> Any:
        if not isinstance(inputs, dict):  # the stream's (x, id) tuples
            inputs = {"x": inputs[0], "id": inputs[1]}
        return model(**inputs)["loss"]


class StopAt(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.global_step >= self.step:
            control.should_training_stop = True
