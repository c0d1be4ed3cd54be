"""Peak memory against the settings: the README's formula, checked.

    python benchmarks/bench_memory_bound.py            # ~1.6 GiB of shards per large case
    python benchmarks/bench_memory_bound.py --quick    # smaller data, for a smoke run

Each case runs in a fresh subprocess that imports torch and chute, notes its
RSS, then iterates one epoch while a thread samples the RSS every 5 ms; the
growth (peak minus that baseline) is what the loader holds. Cases:

- tiny: 64 float32 (.npy) + class samples, decoded, batched(256), threads 2,
  prefetch 4 (the engine's fixed costs dominate);
- large: 20 MiB samples, no .batched, threads 1, prefetch 1 (samples are
  handed out one by one), and webdataset 1.0.2 over the same shards;
- large-threads: the same with threads 2, prefetch 4;
- large-batched: the same shards, batched(4);
- shuffle: 1 MiB samples through shuffle(1000) with shuffle_max_bytes
  32 MiB, batched(16) (samples are copied out of the shards to wait).

The prediction is the README's formula ("Memory"), from the settings and the
samples' sizes. Results go to benchmarks/results/memory_bound.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_config, save, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "memory_bound"
MiB = 1 << 20

# The engine's constants that the formula uses (csrc/engine/stream_engine.cc,
# stream_plan.h, memory/byte_buffer_pool.h, python/chute/stream/native.py).
CHUNK_BYTES = 4 * MiB
MAX_INFLIGHT_BYTES = 1 << 30
UNBATCHED_BATCH_BYTES = 8 * MiB
UNBATCHED_ROWS = 64
POOL_BYTES = 64 * MiB
FIXED_BYTES = 64 * MiB  # threads, allocator arenas, per-shard read buffers


def predicted_peak(
    *,
    sample_bytes: int,
    decoded_bytes: int,
    raw_bytes: int,
    batch_size: int | None,
    prefetch: int,
    threads: int,
    streams: int = 1,
    parse_ahead: int = 1,
    shuffle_max_bytes: int = 0,
    copied: bool,
) -> dict[str, int]:
    """The README's peak-memory formula, term by term (bytes).

    sample_bytes: a sample's encoded bytes (its payloads); decoded_bytes: its
    row once decoded (a raw field counts its payload); raw_bytes: the part of
    the row that Python copies again into bytes objects; copied: samples are
    copied out of the shards (a shuffle, or shards that are not local files)
    rather than read in place."""
    rows = batch_size or max(1, min(UNBATCHED_ROWS, -(-UNBATCHED_BATCH_BYTES // sample_bytes)))
    encoded = rows * sample_bytes
    decoded = rows * decoded_bytes
    in_flight = min(prefetch, max(1, MAX_INFLIGHT_BYTES // (encoded + decoded)))
    chunk = max(CHUNK_BYTES, sample_bytes)
    terms = {
        # Finished batches keep their rows; those being decoded, their samples too.
        "batches_in_flight": in_flight * decoded + min(in_flight, threads) * encoded,
        "consumers_batch": decoded + rows * raw_bytes,
        "batch_being_formed": encoded if copied else 0,
        "shuffle": streams * shuffle_max_bytes,
        "parse_ahead": streams * (5 * parse_ahead + 4) * chunk if copied else 0,
        "buffer_pool": POOL_BYTES if copied else 0,
        "fixed": FIXED_BYTES,
    }
    terms["total"] = sum(terms.values())
    return terms


# -- data ----------------------------------------------------------------------------------


def make_shards(name: str, count: int, per_shard: int, sample: Any) -> list[str]:
    import webdataset

    directory = DATA / name
    shards = sorted(str(p) for p in directory.glob("*.tar"))
    if shards:
        return shards
    directory.mkdir(parents=True, exist_ok=True)
    for s in range(0, count, per_shard):
        tmp = directory / f"shard-{s // per_shard:05d}.tar.tmp"
        with webdataset.TarWriter(str(tmp)) as sink:
            for i in range(s, min(count, s + per_shard)):
                sink.write({"__key__": f"k{i:07d}", **sample(i)})
        tmp.rename(tmp.with_suffix(""))
    return sorted(str(p) for p in directory.glob("*.tar"))


def make_data(quick: bool) -> dict[str, list[str]]:
    import numpy as np

    rng = np.random.default_rng(0)
    big = 20 if quick else 80
    mid = 400 if quick else 1600
    return {
        "tiny": make_shards(
            "tiny",
            50_000,
            5_000,
            lambda i: {"npy": rng.standard_normal(64).astype(np.float32), "cls": str(i % 10)},
        ),
        "large": make_shards(
            f"large_{big}",
            big,
            10,
            lambda i: {"bin": rng.integers(0, 256, 20 * MiB, dtype=np.uint8).tobytes(), "cls": "1"},
        ),
        "mid": make_shards(
            f"mid_{mid}",
            mid,
            200,
            lambda i: {"bin": rng.integers(0, 256, MiB, dtype=np.uint8).tobytes(), "cls": "1"},
        ),
    }


# -- worker side ----------------------------------------------------------------------------


def worker(cfg: dict[str, Any]) -> None:
    import torch  # noqa: F401  (part of the baseline, as in training code)

    if cfg["impl"] == "chute":
        import chute  # noqa: F401
    else:
        import webdataset  # noqa: F401
    from common import current_rss

    baseline = current_rss()
    import common

    with common.rss.PeakRss(os.getpid(), interval=0.005) as peak:
        items = run_pipeline(cfg)
    print(json.dumps({"baseline": baseline, "peak": peak.peak, "items": items}))


def run_pipeline(cfg: dict[str, Any]) -> int:
    kind = cfg["case"]
    if cfg["impl"] == "chute":
        import chute

        ds: Any = chute.WebDataset(
            cfg["shards"],
            shardshuffle=False,
            threads=cfg["threads"],
            prefetch=cfg["prefetch"],
            shuffle_max_bytes=cfg.get("shuffle_max_bytes", 1 << 30),
        )
    else:
        import webdataset

        ds = webdataset.WebDataset(cfg["shards"], shardshuffle=False)
    if kind == "tiny":
        ds = ds.decode().to_tuple("npy", "cls").batched(256)
    else:
        if kind == "shuffle":
            ds = ds.shuffle(1000)
        ds = ds.to_tuple("bin", "cls")
        if cfg.get("batch"):
            ds = ds.batched(cfg["batch"])
    n = 0
    for item in ds:
        n += 1
        del item
    return n


# -- driver ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    data = make_data(args.quick)
    # (case, impl, shards, settings, formula inputs)
    raw = 20 * MiB
    cases: list[tuple[str, str, list[str], dict[str, Any], dict[str, Any] | None]] = [
        (
            "tiny",
            "chute",
            data["tiny"],
            {"threads": 2, "prefetch": 4},
            {
                "sample_bytes": 512,
                "decoded_bytes": 264,
                "raw_bytes": 0,
                "batch_size": 256,
                "prefetch": 4,
                "threads": 2,
                "copied": False,
            },
        ),
        (
            "large",
            "chute",
            data["large"],
            {"threads": 1, "prefetch": 1},
            {
                "sample_bytes": raw,
                "decoded_bytes": raw,
                "raw_bytes": raw,
                "batch_size": None,
                "prefetch": 1,
                "threads": 1,
                "copied": False,
            },
        ),
        ("large", "webdataset", data["large"], {}, None),
        (
            "large-threads",
            "chute",
            data["large"],
            {"threads": 2, "prefetch": 4},
            {
                "sample_bytes": raw,
                "decoded_bytes": raw,
                "raw_bytes": raw,
                "batch_size": None,
                "prefetch": 4,
                "threads": 2,
                "copied": False,
            },
        ),
        (
            "large-batched",
            "chute",
            data["large"],
            {"threads": 1, "prefetch": 1, "batch": 4},
            {
                "sample_bytes": raw,
                "decoded_bytes": raw,
                "raw_bytes": raw,
                "batch_size": 4,
                "prefetch": 1,
                "threads": 1,
                "copied": False,
            },
        ),
        (
            "shuffle",
            "chute",
            data["mid"],
            {"threads": 1, "prefetch": 1, "batch": 16, "shuffle_max_bytes": 32 * MiB},
            {
                "sample_bytes": MiB,
                "decoded_bytes": MiB,
                "raw_bytes": MiB,
                "batch_size": 16,
                "prefetch": 1,
                "threads": 1,
                "shuffle_max_bytes": 32 * MiB,
                "copied": True,
            },
        ),
    ]
    rows = []
    for case, impl, shards, settings, formula in cases:
        config = {"case": case, "impl": impl, "shards": shards, **settings}
        report = run_config(__file__, config)
        growth = report["peak"] - report["baseline"]
        row: dict[str, Any] = {
            "case": case,
            "impl": impl,
            "settings": settings,
            "items": report["items"],
            "data_mib": sum(os.path.getsize(s) for s in shards) / MiB,
            "growth_mib": growth / MiB,
        }
        if formula is not None:
            terms = predicted_peak(**formula)
            row["formula_mib"] = terms["total"] / MiB
            row["formula_terms_mib"] = {k: v / MiB for k, v in terms.items()}
            row["within_formula"] = growth <= terms["total"]
        rows.append(row)
        print(f"{case:14} {impl:10} growth {growth / MiB:8.1f} MiB", file=sys.stderr)
    print(
        table(
            rows,
            [
                ("case", "case"),
                ("impl", "loader"),
                ("data_mib", "data MiB"),
                ("growth_mib", "RSS growth MiB"),
                ("formula_mib", "formula MiB"),
                ("within_formula", "within"),
            ],
        )
    )
    path = save(
        "memory_bound" + ("_quick" if args.quick else ""), {"quick": args.quick, "rows": rows}
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
