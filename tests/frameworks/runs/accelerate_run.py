"""python accelerate_run.py OUT DATA (one process, or two under torchrun):
accelerate prepares chute's loaders with a tiny model. Each kind (a
map-style loader with distributed=True, a stream split across ranks) runs
2 epochs uninterrupted, stopped after 10 batches with
register_for_checkpointing + save_state and resumed with load_state, and
stopped after epoch 0 and resumed at epoch 1. Also: a loader that does not
partition itself (accelerate rebuilds it), the stream under
dispatch_batches=False, and skip_first_batches. Each rank writes what its
steps saw and what accelerate did with the loader."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import chute
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from shared import BATCH, arrays, chute_warnings, ids_of, inputs_of, stream, write

EPOCHS = 2


def loader(kind: str, data: Path, distributed: bool = True) -> chute.DataLoader:
    if kind == "map":
        return chute.DataLoader(
            arrays(data),
            batch_size=BATCH,
            shuffle=True,
            distributed=distributed,
            seed=1,
            num_workers=2,
        )
    return chute.DataLoader(stream(data), batch_size=None, num_workers=2)


def train(
    accelerator: Accelerator,
    chute_loader: chute.DataLoader,
    epochs: range,
    stop_after: int | None = None,
    save_to: Path | None = None,
    load_from: Path | None = None,
) -> dict[str, Any]:
    """Epochs `epochs` of training on `chute_loader`; with `stop_after`,
    save_state after that many batches and stop, else at the end."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, chute_loader)
    accelerator.register_for_checkpointing(chute_loader)
    if load_from is not None:
        accelerator.load_state(str(load_from))
    seen: list[tuple[int, list[int]]] = []
    stopped = False
    for epoch in epochs:
        prepared.set_epoch(epoch)
        for step, batch in enumerate(prepared):
            seen.append((epoch, ids_of(batch)))
            loss = model(inputs_of(batch)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if stop_after is not None and step + 1 == stop_after:
                accelerator.save_state(str(save_to))  # mid-epoch: the loader runs
                stopped = True
                break
        if stopped:
            break
    if save_to is not None and not stopped:
        accelerator.save_state(str(save_to))
    return {
        "seen": seen,
        "kept": prepared is chute_loader,
        "engine_batches": int(chute_loader.stats().get("batches", 0)),
    }


def main() -> None:
    out, data = Path(sys.argv[1]), Path(sys.argv[2])
    accelerator = Accelerator(cpu=True)
    record: dict[str, Any] = {"world_size": accelerator.num_processes}
    with chute_warnings(record):
        for kind in ("map", "stream"):
            runs = record[kind] = {}
            mid, end = out / f"{kind}-mid", out / f"{kind}-end"
            runs["full"] = train(Accelerator(cpu=True), loader(kind, data), range(EPOCHS))
            runs["mid_a"] = train(
                Accelerator(cpu=True), loader(kind, data), range(EPOCHS), 10, save_to=mid
            )
            runs["mid_b"] = train(
                Accelerator(cpu=True), loader(kind, data), range(EPOCHS), load_from=mid
            )
            runs["end_a"] = train(Accelerator(cpu=True), loader(kind, data), range(1), save_to=end)
            runs["end_b"] = train(
                Accelerator(cpu=True), loader(kind, data), range(1, EPOCHS), load_from=end
            )
        no_dispatch = Accelerator(
            cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=False)
        )
        record["stream_no_dispatch"] = train(no_dispatch, loader("stream", data), range(1))
    with chute_warnings(rebuilt := {}):
        record["map_rebuilt"] = train(
            Accelerator(cpu=True), loader("map", data, distributed=False), range(1)
        )
    record["map_rebuilt"]["warnings"] = rebuilt["warnings"]
    # Alive while skip_first_batches' loader runs; num_workers=0: that torch
    # loader reads in this process (with workers, they would report it).
    chute_loader = chute.DataLoader(arrays(data), batch_size=BATCH, shuffle=True, distributed=True)
    skipped = accelerator.skip_first_batches(chute_loader, 3)
    with chute_warnings(skip := {}):
        try:
            skip["batches"] = sum(1 for _ in skipped)
        except ValueError as error:
            skip["error"] = str(error)
    record["skip_first_batches"] = skip
    write(out, record)


if __name__ == "__main__":
    main()
