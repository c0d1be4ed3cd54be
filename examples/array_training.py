"""Embedding lookups from in-memory and memory-mapped arrays with ``chute.ArrayDataset``.

    python examples/array_training.py

``ArrayDataset`` reads the caller's arrays in place (a ``.npy`` path is
memory-mapped, never loaded whole) and native threads gather each batch's
rows straight into the batch tensors, as torch's ``TensorDataset`` +
``DataLoader`` would give them, without worker processes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import chute
import numpy as np
import torch
from torch import nn


def main() -> None:
    rng = np.random.default_rng(0)
    rows, dim = 20_000, 16
    with tempfile.TemporaryDirectory() as tmp:
        features = Path(tmp) / "features.npy"
        np.save(features, rng.standard_normal((rows, dim)).astype(np.float32))
        dataset = chute.ArrayDataset(
            features=features,  # memory-mapped
            label=torch.from_numpy(rng.integers(0, 4, rows)),  # CPU tensor, read in place
        )
        loader = chute.DataLoader(
            dataset, batch_size=512, shuffle=True, drop_last=True, num_workers=2
        )
        model = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for epoch in range(2):
            correct = 0
            batch: dict[str, torch.Tensor]
            for batch in loader:
                logits = model(batch["features"])
                loss = nn.functional.cross_entropy(logits, batch["label"])
                optimizer.zero_grad()
                # loss.backward(), in the spelling that carries type annotations (mypy --strict)
                torch.autograd.backward(loss)
                optimizer.step()
                correct += int((logits.argmax(1) == batch["label"]).sum())
            print(f"epoch {epoch}: {len(loader)} batches, train accuracy {correct / rows:.3f}")


if __name__ == "__main__":
    main()
