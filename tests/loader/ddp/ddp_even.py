"""Run under torchrun: issue 30's pipeline over tar shards split by node
(``shardshuffle=100, seed=0``, ``.shuffle(200).decode().to_tuple("npy",
"cls").batched(32)`` in ``chute.DataLoader(batch_size=None,
num_workers=2)``), for each ``even_batches`` mode and two epochs, and the
same with a Python stage before the batching. Each rank writes the ids of
each batch it saw and its ``samples_repeated``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import torch.distributed as dist


def unchanged(x: Any) -> Any:
    return x


def pipeline(urls: list[str], mode: str, python_stage: bool) -> Any:
    ds = (
        wds.WebDataset(
            urls, shardshuffle=100, seed=0, nodesplitter=wds.split_by_node, even_batches=mode
        )
        .shuffle(200)
        .decode()
        .to_tuple("npy", "cls")
    )
    if python_stage:
        ds = ds.map_tuple(unchanged, unchanged)
    return ds.batched(32)


def main() -> None:
    out_dir = Path(sys.argv[1])
    urls = json.loads((out_dir / "urls.json").read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode, python_stage in (("cap", False), ("repeat", False), ("off", False), ("cap", True)):
        loader = chute.DataLoader(
            pipeline(urls, mode, python_stage), batch_size=None, num_workers=2
        )
        epochs = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = [[int(c) for c in cls] for _, cls in loader]
            epochs.append({"batches": batches, "repeated": loader.stats()["samples_repeated"]})
            # Every rank yields the same count, or this collective hangs.
            dist.barrier()
        runs[f"{mode}{'+map' if python_stage else ''}"] = epochs
    (out_dir / f"rank{rank}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
