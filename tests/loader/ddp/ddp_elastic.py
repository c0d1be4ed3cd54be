"""Run under torchrun: saves a loader state at one world size, or resumes it
at another. Each rank writes the samples it saw; rank 0 saves the states.

    ddp_elastic.py OUT_DIR save|resume
"""

from __future__ import annotations

import json
import sys
from itertools import islice
from pathlib import Path

import chute
import numpy as np
import torch
import torch.distributed as dist

ROWS = 101


def main() -> None:
    out_dir, phase = Path(sys.argv[1]), sys.argv[2]
    urls = json.loads((out_dir / "urls.json").read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = chute.DataLoader(
        chute.ArrayDataset(y=np.arange(ROWS, dtype=np.int64)),
        batch_size=4,
        distributed=True,
        seed=7,
    )
    stream = (
        chute.WebDataset(urls, shardshuffle=True, seed=3, elastic=True)
        .shuffle(16, initial=8)
        .to_tuple("__key__")
        .batched(4)
    )
    rows.set_epoch(1)
    stream.set_epoch(1)
    take: dict[str, int | None] = {"rows": 5, "stream": 4}
    if phase == "resume":
        states = torch.load(out_dir / "states.pt", weights_only=False)
        rows.load_state_dict(states["rows"])
        stream.load_state_dict(states["stream"])
        take = {"rows": None, "stream": None}
    # The iterators stay referenced: a state describes a running iteration.
    row_batches, stream_batches = iter(rows), iter(stream)
    seen_rows = [b["y"].tolist() for b in islice(row_batches, take["rows"])]
    seen_keys = [list(b[0]) for b in islice(stream_batches, take["stream"])]
    record = {"rank": rank, "world": world, "rows": seen_rows, "stream": seen_keys}
    if phase == "save":
        states = {"rows": rows.state_dict(), "stream": stream.state_dict()}
        record["positions"] = {
            "rows": states["rows"]["elastic"],
            "stream": states["stream"]["elastic"],
        }
        if rank == 0:
            torch.save(states, out_dir / "states.pt")
    (out_dir / f"{phase}{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
