"""python lightning_run.py OUT DATA DEVICES (DEVICES=2 under torchrun):
Lightning trains on chute's map-style loader (shuffle=True, a seeded
generator) and on a stream, each uninterrupted for 2 epochs, stopped after
10 steps and resumed from that mid-epoch checkpoint, and stopped after
epoch 0 and resumed from that end-of-epoch checkpoint. Each rank writes
the sample ids its training steps saw, by epoch, per run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import chute
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from shared import BATCH, arrays, chute_warnings, ids_of, inputs_of, stream, write

EPOCHS = 2


def loader(kind: str, data: Path) -> chute.DataLoader:
    if kind == "map":
        generator = torch.Generator().manual_seed(7)
        return chute.DataLoader(arrays(data), batch_size=BATCH, shuffle=True, generator=generator)
    return chute.DataLoader(stream(data), batch_size=None)


class Model(L.LightningModule):
    def __init__(self, kind: str, data: Path) -> None:
        super().__init__()
        self.kind, self.data = kind, data
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, ids_of(batch)))
        return self.layer(inputs_of(batch)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> chute.DataLoader:
        return loader(self.kind, self.data)


def fit(kind: str, data: Path, devices: int, resume: str | None = None, **options: Any) -> Any:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **options,
    )
    model = Model(kind, data)
    trainer.fit(model, ckpt_path=resume)
    return model.seen


def main() -> None:
    out, data, devices = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    record: dict[str, Any] = {}
    with chute_warnings(record):
        for kind in ("map", "stream"):
            ck = out / f"{kind}-ck"
            runs = record[kind] = {}
            runs["full"] = fit(kind, data, devices, max_epochs=EPOCHS, enable_checkpointing=False)
            every_10 = ModelCheckpoint(ck, "{step}", every_n_train_steps=10, save_top_k=-1)
            runs["mid_a"] = fit(kind, data, devices, max_steps=10, callbacks=[every_10])
            runs["mid_b"] = fit(
                kind,
                data,
                devices,
                str(ck / "step=10.ckpt"),
                max_epochs=EPOCHS,
                enable_checkpointing=False,
            )
            epoch_end = ModelCheckpoint(ck, "{epoch}", save_top_k=-1)
            runs["end_a"] = fit(kind, data, devices, max_epochs=1, callbacks=[epoch_end])
            runs["end_b"] = fit(
                kind,
                data,
                devices,
                str(ck / "epoch=0.ckpt"),
                max_epochs=EPOCHS,
                enable_checkpointing=False,
            )
    write(out, record)


if __name__ == "__main__":
    main()
