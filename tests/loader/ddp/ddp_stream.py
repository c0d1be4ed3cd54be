"""Run under torchrun: each rank streams tar shards split by node (an uneven
shard count) and writes the sample keys of each batch it saw."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chute
import chute.wds
import torch.distributed as dist


def main() -> None:
    out_dir = Path(sys.argv[1])
    urls = json.loads((out_dir / "urls.json").read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = (
        chute.WebDataset(urls, shardshuffle=False, nodesplitter=chute.wds.split_by_node)
        .to_tuple("__key__")
        .batched(4)
    )
    loader = chute.DataLoader(dataset, batch_size=None, num_workers=1)
    batches = [list(keys) for (keys,) in loader]
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "batches": batches}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
