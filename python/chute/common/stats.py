"""The one schema of ``stats()`` (README, "Stats"): the engine's counters,
as both engines report them, plus the consumer's side. Streams and map-style
datasets report the same keys; a figure that does not apply stays 0."""

from __future__ import annotations

from typing import Any

STATS_KEYS = (
    "shards_opened",
    "samples_read",
    "samples_skipped",
    "samples_batched",
    "samples_repeated",
    "batches_submitted",
    "batches",
    "samples_yielded",
    "bytes_yielded",
    "encoded_bytes",
    "read_seconds",
    "decode_seconds",
    "shuffle_bytes",
    "shuffle_peak_bytes",
    "shuffle_peak_samples",
    "queued_batches",
    "arenas_created",
    "batch_bytes_reserved",
    "batch_bytes_in_use",
    "batch_peak_bytes_reserved",
    "batch_peak_bytes_in_use",
    "batch_bytes_pinned",
    "python_items",
    "wait_seconds",
    "cache_corrupt_refetches",
    # Where the time goes (chute.loader.diagnose reads them): the decode
    # workers' active time, its parts spent in image transforms and waiting
    # for a result slot; how full the results queue was for the consumer;
    # the Python stages' and the collation's own time, and the worker
    # processes' Python threads at work (stages, conversion, packing results
    # for the loader; not their waits for their engines); the decode threads
    # and batches in flight allowed now (num_workers="auto" moves them).
    "transform_seconds",
    "decode_active_seconds",
    "decode_blocked_seconds",
    "ready_seen",
    "consumer_waits",
    "python_seconds",
    "collate_seconds",
    "worker_busy_seconds",
    "worker_active_seconds",
    "decode_threads",
    "prefetch_batches",
)

# What an engine holds now; the "peak" keys are maxima; every other figure
# adds up over engines run one after another (the passes of an epoch, the
# epochs of a map-style dataset).
GAUGES = frozenset(
    {
        "shuffle_bytes",
        "queued_batches",
        "batch_bytes_reserved",
        "batch_bytes_in_use",
        "batch_bytes_pinned",
        "decode_threads",
        "prefetch_batches",
    }
)
ADDITIVE_STATS = frozenset(k for k in STATS_KEYS if k not in GAUGES and "peak" not in k)


def empty_stats() -> dict[str, Any]:
    """What stats() reports before any iteration (and in a process that never
    iterated, such as a DataLoader's parent when torch's workers do)."""
    return dict.fromkeys(STATS_KEYS, 0)


def is_gauge(key: str) -> bool:
    """A figure that says what an engine holds now (queued batches, bytes in
    use), neither a counter nor a peak."""
    return key not in ADDITIVE_STATS and "peak" not in key


def add_figures(total: dict[str, Any], more: dict[str, Any], gauges: str = "add") -> dict[str, Any]:
    """`total` with the figures of one more engine: counters added, peaks the
    largest; gauges added (`"add"`: engines side by side) or taken from
    `more` (`"replace"`: an engine that finished after those in `total`)."""
    out = dict(total)
    for key, value in more.items():
        if key in ADDITIVE_STATS or (is_gauge(key) and gauges == "add"):
            out[key] = out.get(key, 0) + value
        elif is_gauge(key):
            out[key] = value
        else:
            out[key] = max(out.get(key, 0), value)
    return out


def with_running(finished: dict[str, Any], running: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of the engines that finished combined with those running now:
    the gauges are the running engines' when any runs, else the last
    finished one's (the batches it delivered may still hold its memory)."""
    if not running:
        return dict(finished)
    out = {k: 0 if is_gauge(k) else v for k, v in finished.items()}
    for figures in running:
        out = add_figures(out, figures)
    return out


def figures_since(now: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """An engine's figures since `before` was taken from it (an engine kept
    from one iteration to the next counts on): counters as differences."""
    if before is None:
        return dict(now)
    return {k: v - before.get(k, 0) if k in ADDITIVE_STATS else v for k, v in now.items()}
