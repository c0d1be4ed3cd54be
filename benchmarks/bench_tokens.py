"""Language-model token data (issue 24), one function per part, chosen by --part.

Part (a), pre-tokenized: a uint16 token file (nanoGPT's ``train.bin``) cut
into contiguous windows of 2,048 + 1 tokens, batches of 32, shuffled:

- ``chute.TokenDataset(pack="windows")`` in ``chute.DataLoader`` (native
  threads, int64 ``input_ids`` and ``labels``);
- nanoGPT's loader under torch's DataLoader: ``np.memmap`` of the file made
  again for each batch, and ``torch.stack`` of ``from_numpy(window.astype(
  np.int64))`` for inputs and targets, as nanoGPT's ``get_batch`` does, over
  the same shuffled windows (a batch sampler hands it whole batches), at
  each num_workers of --memmap-workers, the best reported;
- the limit: one thread memcpy-ing the same windows' bytes (uint16, 2,049
  tokens each) from the page cache into one reused batch buffer
  (``chute._core._memcpy_windows``: no Python between windows).

Every loader runs in its own subprocess on a warm page cache, repeating
epochs for at least MIN_SECONDS; chute and memcpy run
--repeats times and its median run is reported. Figures are tokens/s of
``input_ids`` delivered, and GB/s written into batches (memcpy writes 2
bytes per token, int64 input_ids + labels 16). Targets: chute >= 80% of the memcpy limit and
ahead of the memmap loader. The load average before and after is printed
and saved: on a shared machine the figures mean little without it.

Part (b), tokenizing JSON Lines and packing, is added as ``part_b`` in
PARTS (its own data, loaders and results file), run with ``--part b``.

    python benchmarks/bench_tokens.py --part a            # 128M tokens
    python benchmarks/bench_tokens.py --part a --quick    # 16M
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, run_config, save, table  # noqa: E402

SEQ_LEN = 2048
BATCH = 32
VOCAB = 50257
MIN_SECONDS = 2.0  # each run repeats epochs until it has taken this long
# Bytes each loader writes per input token: memcpy copies the uint16
# windows (2,049 tokens for 2,048 inputs); the torch loaders write int64
# (or int32) input_ids and labels.
BYTES_PER_TOKEN = {
    "memcpy": 2 * 2049 / 2048,
    "chute": 16,
    "chute-int32": 8,
    "memmap": 16,
}  # GPT-2's, as nanoGPT's OpenWebText file holds


def token_file(tokens: int) -> str:
    """A uint16 token file of `tokens` random ids below VOCAB (made once)."""
    import numpy as np

    path = DATA / f"tokens_{tokens}.bin"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        tmp = path.with_suffix(".tmp")
        rng.integers(0, VOCAB, size=tokens, dtype=np.uint16).tofile(tmp)
        tmp.rename(path)
    return str(path)


def window_order(windows: int, seed: int) -> list[list[int]]:
    """The shuffled windows in batches: the order torch's RandomSampler draws
    from a generator seeded with `seed`, as chute's loader draws it."""
    import torch

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(windows, generator=g).tolist()
    return [order[i : i + BATCH] for i in range(0, windows, BATCH)]


class NanoGptBatches:
    """nanoGPT's get_batch over given windows: a fresh np.memmap per batch
    (nanoGPT's fix for a memory leak), inputs and targets stacked from int64
    copies of each window."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __getitem__(self, windows: list[int]) -> tuple[Any, Any]:
        import numpy as np
        import torch

        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        starts = [w * SEQ_LEN for w in windows]
        x = torch.stack([torch.from_numpy(data[i : i + SEQ_LEN].astype(np.int64)) for i in starts])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + SEQ_LEN].astype(np.int64)) for i in starts]
        )
        return x, y


def worker_a(config: dict[str, Any]) -> None:
    import numpy as np
    import torch

    path, kind, workers = config["path"], config["loader"], config["workers"]
    tokens = os.path.getsize(path) // 2
    windows = (tokens - 1) // SEQ_LEN
    gc.collect()
    if kind == "memcpy":
        import chute

        starts = np.array([w for b in window_order(windows, 0) for w in b], dtype=np.int64)
        file = chute._core.TokenFile(path, "raw", "uint16")
        seconds, epochs = 0.0, 0
        while seconds < MIN_SECONDS:
            window_bytes = (SEQ_LEN + 1) * 2
            seconds += chute._core._memcpy_windows(file, starts * SEQ_LEN * 2, window_bytes, BATCH)
            epochs += 1
        print(json.dumps({"tokens": epochs * windows * SEQ_LEN, "seconds": seconds, "first": None}))
        return
    loader: Any
    if kind == "chute":
        import chute

        out_dtype = torch.int32 if config.get("int32") else torch.int64
        ds = chute.TokenDataset(path, SEQ_LEN, dtype="uint16", out_dtype=out_dtype)
        loader = chute.DataLoader(
            ds,
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(0),
        )
    else:
        loader = torch.utils.data.DataLoader(
            NanoGptBatches(path),  # type: ignore[arg-type]
            batch_size=None,
            sampler=window_order(windows, 0),
            num_workers=workers,
        )
    start = time.perf_counter()
    first = None
    delivered = 0
    seconds = 0.0
    while seconds < MIN_SECONDS:  # whole epochs, the first one's start included
        for batch in loader:
            x = batch["input_ids"] if isinstance(batch, dict) else batch[0]
            if first is None:
                first = time.perf_counter() - start
            delivered += x.numel()
        seconds = time.perf_counter() - start
    print(json.dumps({"tokens": delivered, "seconds": seconds, "first": first}))


def part_a(args: argparse.Namespace) -> None:
    from chute.engine import default_threads

    tokens = 16_000_000 if args.quick else 128_000_000
    path = token_file(tokens)
    with open(path, "rb") as f:  # a warm page cache for every loader
        while f.read(1 << 24):
            pass
    threads = default_threads()
    script = str(Path(__file__).resolve())
    load_before = os.getloadavg()
    configs = [
        ("memcpy", 0, args.repeats),
        ("chute", threads, args.repeats),
        ("chute-int32", threads, args.repeats),
    ] + [("memmap", int(w), 1) for w in args.memmap_workers.split(",")]
    names = {
        "memcpy": "memcpy of the same windows, 1 thread",
        "chute": "chute.TokenDataset + chute.DataLoader",
        "chute-int32": "the same, out_dtype=torch.int32",
        "memmap": "nanoGPT np.memmap + torch DataLoader",
    }
    rows: list[dict[str, Any]] = []
    runs_of: dict[str, list[float]] = {}
    for kind, workers, repeats in configs:
        runs = []
        for _ in range(repeats):
            config = {
                "part": "a",
                "loader": kind.split("-")[0],
                "int32": kind == "chute-int32",
                "workers": workers,
                "path": path,
            }
            report = run_config(script, config)
            run = {
                "loader": names[kind],
                "kind": kind,
                "workers": workers,
                "tokens_per_s": report["tokens"] / report["seconds"],
                "written_gb_per_s": report["tokens"]
                * BYTES_PER_TOKEN[kind]
                / report["seconds"]
                / 1e9,
                "first_batch_s": report["first"],
                "peak_rss_mib": report["peak_tree_rss"] / 2**20,
            }
            runs.append(run)
            print(f"  {run['loader']:40s} workers={workers}: {run['tokens_per_s']:,.0f} tokens/s")
        runs_of[f"{kind}-{workers}"] = [r["tokens_per_s"] for r in runs]
        runs.sort(key=lambda r: r["tokens_per_s"])
        rows.append(runs[len(runs) // 2])
    load_after = os.getloadavg()
    memcpy = next(r for r in rows if r["kind"] == "memcpy")
    ours = next(r for r in rows if r["kind"] == "chute")
    ours32 = next(r for r in rows if r["kind"] == "chute-int32")
    best = max((r for r in rows if r["kind"] == "memmap"), key=lambda r: r["tokens_per_s"])
    summary = {
        "tokens": tokens,
        "chute_tokens_per_s": ours["tokens_per_s"],
        "chute_int32_tokens_per_s": ours32["tokens_per_s"],
        "memcpy_tokens_per_s": memcpy["tokens_per_s"],
        "best_memmap_tokens_per_s": best["tokens_per_s"],
        "best_memmap_workers": best["workers"],
        "fraction_of_memcpy": ours["tokens_per_s"] / memcpy["tokens_per_s"],
        "fraction_of_memcpy_int32": ours32["tokens_per_s"] / memcpy["tokens_per_s"],
        "speedup_over_memmap": ours["tokens_per_s"] / best["tokens_per_s"],
        "fraction_of_memcpy_bytes": ours["written_gb_per_s"] / memcpy["written_gb_per_s"],
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
    }
    print()
    print(
        table(
            rows,
            [
                ("loader", "loader"),
                ("workers", "workers"),
                ("tokens_per_s", "tokens/s"),
                ("written_gb_per_s", "GB/s written"),
                ("first_batch_s", "first batch s"),
                ("peak_rss_mib", "peak RSS MiB"),
            ],
        )
    )
    print()
    print(
        f"chute: {summary['fraction_of_memcpy']:.0%} of the memcpy limit (target >= 80%;"
        f" {summary['fraction_of_memcpy_int32']:.0%} with int32 batches),"
        f" {summary['speedup_over_memmap']:.1f}x nanoGPT's memmap loader at"
        f" num_workers={best['workers']} (target > 1x)"
    )
    print(
        "load average (1/5/15 min) before: "
        + "/".join(f"{x:.2f}" for x in load_before)
        + ", after: "
        + "/".join(f"{x:.2f}" for x in load_after)
    )
    path_saved = save(
        "tokens_a_quick" if args.quick else "tokens_a",
        {"rows": rows, "runs": runs_of, "summary": summary},
    )
    print(f"saved {path_saved}")


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {"a": part_a}
WORKERS: dict[str, Callable[[dict[str, Any]], None]] = {"a": worker_a}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=sorted(PARTS), default="a")
    parser.add_argument("--quick", action="store_true", help="an eighth of the data")
    parser.add_argument("--repeats", type=int, default=3, help="runs of chute and of memcpy")
    parser.add_argument("--memmap-workers", default="0,1,2", help="torch workers tried (a)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config = json.loads(args.worker)
        WORKERS[config["part"]](config)
        return
    PARTS[args.part](args)


if __name__ == "__main__":
    main()
