"""python trainer_run.py OUT DATA (two processes under torchrun): the
transformers Trainer trains on chute's loaders returned by a
get_train_dataloader override, with chute.frameworks.hf_trainer's
ChuteStateCallback. Each kind (a map-style loader with distributed=True, a
stream split across ranks with a length) runs 2 epochs uninterrupted,
stopped 10 steps into epoch 1 (a checkpoint there) and resumed from it, and
stopped after epoch 0 (16 steps) and resumed. Also: train_dataset= a
chute dataset (the Trainer builds its own loader), an override without
distributed=True, and a mid-epoch resume without the callback. Each rank
writes what its steps saw."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import chute
import torch
from chute.frameworks.hf_trainer import ChuteStateCallback
from shared import BATCH, arrays, chute_warnings, ids_of, inputs_of, stream, write
from trainer_parts import ChuteTrainer, StopAt
from transformers import TrainingArguments

EPOCH_STEPS = 16  # 500 samples a rank, in batches of 32
MID = 26  # a checkpoint 10 steps into epoch 1


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[list[int]] = []

    def forward(self, x: torch.Tensor, id: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: A002
        # The Trainer's own loader keeps the columns forward() names.
        batch = {"x": x, "id": id}
        self.seen.append(ids_of(batch))
        return {"loss": self.layer(inputs_of(batch)).pow(2).mean()}


def train(
    out: Path,
    make_loader: Any,
    *,
    stop: int = 0,
    resume: str | None = None,
    callback: bool = True,
    train_dataset: Any = None,
) -> list[list[int]]:
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        num_train_epochs=2,
        save_strategy="steps",
        save_steps=stop or 1000,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_steps=1000,
        seed=5,
    )
    callbacks = ([ChuteStateCallback()] if callback else []) + ([StopAt(stop)] if stop else [])
    model = Model()
    trainer = ChuteTrainer(
        make_loader, model=model, args=args, callbacks=callbacks, train_dataset=train_dataset
    )
    trainer.train(resume_from_checkpoint=resume)
    return model.seen


def main() -> None:
    out, data = Path(sys.argv[1]), Path(sys.argv[2])
    makers = {
        "map": lambda: chute.DataLoader(
            arrays(data), batch_size=BATCH, shuffle=True, distributed=True, seed=1
        ),
        "stream": lambda: chute.DataLoader(stream(data, length=EPOCH_STEPS), batch_size=None),
    }
    record: dict[str, Any] = {}
    with chute_warnings(record):
        for kind, make in makers.items():
            ck = out / kind
            runs = record[kind] = {}
            runs["full"] = train(out / f"{kind}-full", make)
            runs["mid_a"] = train(ck, make, stop=MID)
            runs["mid_b"] = train(ck, make, resume=str(ck / f"checkpoint-{MID}"))
            runs["end_a"] = train(ck, make, stop=EPOCH_STEPS)
            runs["end_b"] = train(ck, make, resume=str(ck / f"checkpoint-{EPOCH_STEPS}"))
    own = out / "own"
    with chute_warnings(warned := {}):
        record["trainer_built"] = {
            "seen": train(own, None, callback=False, train_dataset=arrays(data))
        }
    record["trainer_built"].update(warned)
    same = lambda: chute.DataLoader(arrays(data), batch_size=BATCH)  # noqa: E731
    with chute_warnings(warned := {}):
        record["not_distributed"] = {"seen": train(out / "same", same, stop=3)}
    record["not_distributed"].update(warned)
    skip = out / "skip"
    train(skip, makers["map"], stop=MID, callback=False)
    try:
        train(skip, makers["map"], resume=str(skip / f"checkpoint-{MID}"), callback=False)
        record["resume_without_callback"] = {}
    except ValueError as error:
        record["resume_without_callback"] = {"error": str(error)}
    write(out, record)


if __name__ == "__main__":
    main()
