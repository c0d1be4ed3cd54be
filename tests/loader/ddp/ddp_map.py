"""Run under torchrun: each rank iterates a distributed chute.DataLoader over a
map-style ArrayDataset for two epochs and writes the indices it saw."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chute
import numpy as np
import torch.distributed as dist


def main() -> None:
    out_dir, n = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = chute.ArrayDataset(idx=np.arange(n, dtype=np.int64))
    loader = chute.DataLoader(
        ds, batch_size=8, distributed=True, shuffle=True, seed=11, num_workers=2
    )
    epochs = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        epochs[epoch] = [b["idx"].tolist() for b in loader]
    # A Curriculum takes rank and world size from torch.distributed itself.
    curriculum = chute.Curriculum(
        {"low": np.arange(n // 2), "high": np.arange(n // 2, n)},
        [{"low": 1, "high": 0}, {"low": 1, "high": 3}],
        num_samples=40,
        replacement=False,
        seed=2,
    )
    cur_loader = chute.DataLoader(ds, batch_size=8, sampler=curriculum)
    cur_epochs = {}
    for epoch in (0, 1):
        cur_loader.set_epoch(epoch)
        cur_epochs[epoch] = {
            "batches": [b["idx"].tolist() for b in cur_loader],
            "global": curriculum.global_order(epoch).tolist(),
        }
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "world": dist.get_world_size(),
                "len": len(loader),
                "epochs": epochs,
                "curriculum": cur_epochs,
            }
        )
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
