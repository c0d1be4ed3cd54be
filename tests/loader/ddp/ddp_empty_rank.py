"""Run under torchrun with more ranks than shards: a rank that
``split_by_node`` leaves without a shard must still take part in the
ranks' agreement on a batch count (a collective), or the others wait in it
until the process group's timeout. Each rank writes what its epoch did:
the batches it yielded, or the error it raised."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import chute
import chute.wds as wds
import torch.distributed as dist


def main() -> None:
    out_dir = Path(sys.argv[1])
    urls = json.loads((out_dir / "urls.json").read_text())
    # A short timeout: a rank that never joins the count fails the run in
    # seconds instead of the default half hour.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    ds = (
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
        .to_tuple("cls")
        .batched(8)
    )
    outcome: dict[str, object]
    try:
        batches = list(chute.DataLoader(ds, batch_size=None))
        outcome = {"batches": len(batches)}
    except ValueError as error:
        outcome = {"error": str(error).splitlines()[0]}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(outcome))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
