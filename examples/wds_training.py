"""Train a small classifier on webdataset-style tar shards with chute.

    python examples/wds_training.py "data/train-{000000..000099}.tar" --epochs 2

The pipeline is webdataset's, written against ``chute.wds``: reading, tar
parsing, shuffling, JPEG decoding, resizing and batching run on chute's native
threads; the loop below only receives finished ``(images, labels)`` batches.
Each sample needs a ``jpg`` (or ``png``) member and an integer ``cls`` member.
"""

from __future__ import annotations

import argparse
import os

import chute
import chute.wds as wds
import torch
from torch import nn


def make_loader(urls: str, batch_size: int, threads: int) -> chute.DataLoader:
    dataset = (
        wds.WebDataset(urls, shardshuffle=100, nodesplitter=wds.split_by_node)
        .shuffle(1000)
        .decode("torchrgb8", size=(64, 64))  # uint8 CHW tensors, resized and cropped in C++
        .to_tuple("jpg;png", "cls")
        .batched(batch_size, partial=False)
    )
    # batch_size=None: the dataset batches; num_workers are native threads here.
    return chute.DataLoader(dataset, batch_size=None, num_workers=threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("urls", help="shard path or brace pattern")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--classes", type=int, default=10)
    args = parser.parse_args()

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, args.classes),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make_loader(args.urls, args.batch_size, args.threads)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)  # reshuffles shards and the shuffle buffer
        total, seen = 0.0, 0
        for images, labels in loader:
            x = images.float().div_(255.0)
            loss = nn.functional.cross_entropy(model(x), labels % args.classes)
            optimizer.zero_grad()
            # loss.backward(), in the spelling that carries type annotations (mypy --strict)
            torch.autograd.backward(loss)
            optimizer.step()
            total += loss.item() * len(labels)
            seen += len(labels)
        print(f"epoch {epoch}: {seen} samples, mean loss {total / max(seen, 1):.4f}")


if __name__ == "__main__":
    main()
