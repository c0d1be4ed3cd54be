"""Regression on rows of HDF5 files with ``chute.H5Dataset`` and ``chute.DataLoader``.

    python examples/h5_training.py                 # writes a small demo file first
    python examples/h5_training.py runs/*.h5 --x betas --y target

Rows are read (and gzip chunks inflated) on native threads in the order of
torch's sampler; ``shuffle=True`` gives the same permutation torch would.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import chute
import h5py
import numpy as np
import torch
from torch import nn


def write_demo(path: Path, rows: int = 4096, dim: int = 32) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(256, dim), compression="gzip", shuffle=True)
        f.create_dataset("y", data=x @ w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="HDF5 files (default: a generated demo file)")
    parser.add_argument("--x", default="x", help="dataset of inputs, one row per sample")
    parser.add_argument("--y", default="y", help="dataset of scalar targets")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        files: list[str] = args.files
        if not files:
            demo = Path(tmp) / "demo.h5"
            write_demo(demo)
            files = [str(demo)]
        dataset = chute.H5Dataset(files, {"x": args.x, "y": args.y})
        loader = chute.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.threads
        )
        first: dict[str, torch.Tensor] = dataset[0]
        model = nn.Linear(first["x"].numel(), 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            total = 0.0
            batch: dict[str, torch.Tensor]
            for batch in loader:
                prediction = model(batch["x"].flatten(1).float()).squeeze(1)
                loss = nn.functional.mse_loss(prediction, batch["y"].float())
                optimizer.zero_grad()
                # loss.backward(), in the spelling that carries type annotations (mypy --strict)
                torch.autograd.backward(loss)
                optimizer.step()
                total += loss.item() * len(prediction)
            print(f"epoch {epoch}: mean squared error {total / len(dataset):.4f}")


if __name__ == "__main__":
    main()
