"""``loader.diagnose()``: which stage limits a loader's throughput, the
figures that show it, and what to change.

The loop that consumes batches runs one thing at a time: its own step
(time outside the loader's ``next()``), the loader's Python on its thread
(Python stages, conversion, collation, the hand-off to a device) and waits
for batches the engine has not finished. The largest of these shares of
the wall time is the bottleneck; when it is the wait, the engine's own
figures say which stage there is short: its decode threads busy (decode, or
the image transforms inside it), worker processes busy in Python, or
threads waiting for samples the shards deliver too slowly (storage). A copy
engine busy nearly all the time copying batches to the device is the
bottleneck before any of them (the step waits on the copies on the device,
which the loop's thread does not see). docs/stats.md has a worked example
of each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from chute.common.autotune import cores_available
from chute.common.interpreter_exit import enter_loader, leave_loader, park_if_exiting

_T = TypeVar("_T")

STAGES = ("storage", "decode", "transform", "python", "collate", "transfer", "consumer")

# A copy engine busy this share of the wall time is what the step waits on.
TRANSFER_BUSY = 0.8
# Batch workers busy this share of their active time are the engine's
# bottleneck; below it they mostly waited for samples.
WORKERS_BUSY = 0.5
# Transforms taking this share of the decode threads' busy time name the
# stage "transform".
TRANSFORM_SHARE = 0.5
# Worker processes busy in Python this share of the time are the bottleneck.
WORKER_PYTHON_BUSY = 0.5


class ConsumerClock:
    """The loop's side of one iteration: the time inside the loader's
    ``next()`` and outside it (the step), and the process's CPU time."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.ended: float | None = None
        self.cpu_started = 0.0
        self.cpu_ended: float | None = None
        self.loader_seconds = 0.0
        self.batches = 0

    def timed(self, items: Iterable[_T]) -> Iterator[_T]:
        """`items`, timed: two clock reads per batch."""
        it = iter(items)
        clock = time.perf_counter
        self.started = clock()
        self.cpu_started = time.process_time()
        while True:
            asked = clock()
            enter_loader()
            try:
                item = next(it)
            except StopIteration:
                self.ended = clock()
                self.cpu_ended = time.process_time()
                self.loader_seconds += self.ended - asked
                return
            except BaseException:
                # An epoch that exit ended, in a wait of Python's, goes no
                # further than the wait did: the loop must not run on while
                # the interpreter finalizes.
                park_if_exiting()
                raise
            finally:
                leave_loader()
            self.loader_seconds += clock() - asked
            self.batches += 1
            yield item
            del item

    def figures(self) -> dict[str, float]:
        """Wall time since the first ``next()`` (to the end of the epoch once
        it ended), the loader's and the step's parts of it, the CPU time."""
        if self.started is None:
            return {"elapsed_seconds": 0.0, "consumer_seconds": 0.0, "cpu_seconds": 0.0}
        end = self.ended if self.ended is not None else time.perf_counter()
        cpu_end = self.cpu_ended if self.cpu_ended is not None else time.process_time()
        elapsed = end - self.started
        return {
            "elapsed_seconds": elapsed,
            "consumer_seconds": max(0.0, elapsed - self.loader_seconds),
            "cpu_seconds": cpu_end - self.cpu_started,
        }


@dataclass(frozen=True)
class LoaderFacts:
    """What the diagnosis needs to know of the loader besides its figures."""

    num_workers: int  # native threads, or worker processes when `processes`
    processes: int = 0  # worker processes running the Python stages (0: none)
    auto: bool = False  # num_workers="auto"
    cores: int = field(default_factory=cores_available)
    python_stages: tuple[str, ...] = ()  # the Python stages, e.g. "map(normalize)"
    collate_fn: bool = False  # a collate_fn of the user's
    remote: bool = False  # shards read from an object store or http(s)
    prefetch_bytes: int = 0  # remote bytes fetched ahead (remote only)
    shards_at_once: int = 1  # shards parsed at once
    # What the batch workers' busy time is: decoding samples, or reading
    # rows (arrays, HDF5): then busy workers are the storage stage.
    busy_stage: str = "decode"
    device: bool = False  # batches handed to a CUDA device
    pinned: bool = False


def diagnose(figures: dict[str, Any], facts: LoaderFacts) -> dict[str, Any]:
    """The report of `figures` (a loader's ``stats()``) for a loader that
    `facts` describes: ``bottleneck`` (one of `STAGES`), ``prescription``,
    ``summary`` (one line) and ``evidence``."""
    wall = float(figures.get("elapsed_seconds", 0.0))
    if wall <= 0 or not figures.get("batches"):
        return {
            "bottleneck": None,
            "prescription": "iterate the loader first: nothing has been measured yet",
            "summary": "no batch yet",
            "evidence": {},
        }
    evidence = _evidence(figures, facts, wall)
    stage = _bottleneck(evidence, facts)
    prescription = _prescription(stage, evidence, facts)
    return {
        "bottleneck": stage,
        "prescription": prescription,
        "summary": f"{stage}-bound: {prescription}",
        "evidence": evidence,
    }


def _evidence(figures: dict[str, Any], facts: LoaderFacts, wall: float) -> dict[str, Any]:
    def f(key: str) -> float:
        return float(figures.get(key, 0) or 0)

    consumer = f("consumer_seconds")
    wait = f("wait_seconds")
    collate = f("collate_seconds")
    transfer_host = f("transfer_host_seconds")
    loader = max(0.0, wall - consumer)
    # The loader's Python on the loop's thread: everything in its next() but
    # the waits for the engine, the collation and the hand-off.
    python_here = max(0.0, loader - wait - collate - transfer_host)
    batches = int(f("batches"))
    decode = f("decode_seconds")
    transform = min(decode, f("transform_seconds"))
    active = f("decode_active_seconds")
    blocked = f("decode_blocked_seconds")
    threads = int(f("decode_threads")) or facts.num_workers
    workers_busy = f("worker_busy_seconds") if facts.processes else 0.0
    # Against the workers' time since their tasks started, not the wall:
    # starting the processes (seconds on shared cores) is no stage's time.
    workers_active = f("worker_active_seconds") or facts.processes * wall
    storage_bytes = f("encoded_bytes") or f("source_bytes_read")
    prefetch = int(f("prefetch_batches"))
    return {
        "elapsed_seconds": wall,
        "batches": batches,
        "samples_per_second": f("samples_yielded") / wall,
        "loop": {
            "step_seconds": consumer,
            "wait_seconds": wait,
            "python_seconds": python_here,
            "collate_seconds": collate,
            "transfer_seconds": transfer_host,
            "shares": {
                "consumer": consumer / wall,
                "wait": wait / wall,
                "python": python_here / wall,
                "collate": collate / wall,
                "transfer": transfer_host / wall,
            },
        },
        # Busy seconds of each stage, against the wall time (a stage of
        # several threads can pass 1.0).
        "stages": {
            "storage": _busy(f("read_seconds"), wall),
            "decode": _busy(decode - transform, wall),
            "transform": _busy(transform, wall),
            "python": _busy(python_here + workers_busy, wall),
            "collate": _busy(collate, wall),
            "transfer": _busy(f("transfer_seconds") or transfer_host, wall),
            "consumer": _busy(consumer, wall),
        },
        "engine": {
            # The batch workers' active time: busy, waiting for a slot in the
            # results (held back by the consumer), or waiting for samples.
            "active_seconds": active,
            "busy": decode / active if active > 0 else None,
            "blocked": blocked / active if active > 0 else None,
            # Nothing to decode: starved by storage, or (streams) batches not
            # formed because the consumer held the queue full.
            "idle": max(0.0, active - decode - blocked) / active if active > 0 else None,
            "busy_inline": decode / wall if active == 0 else None,
        },
        "queue": {
            # Batches ready when the loop asked for one (itself included).
            "mean_ready": f("ready_seen") / batches if batches else 0.0,
            "capacity": prefetch,
            "waited_for": f("consumer_waits") / batches if batches else 0.0,
        },
        "storage": {
            "mb_per_second": storage_bytes / 1e6 / wall,
            "shards_at_once": facts.shards_at_once,
            "remote": facts.remote,
        },
        "workers": {
            "processes": facts.processes,
            # Their Python threads at work (stages, conversion, packing).
            "python_busy": workers_busy / workers_active if facts.processes else None,
        },
        "transfer": {
            "copy_busy": f("transfer_seconds") / wall,
            "gb_per_second": f("transfer_bytes") / 1e9 / f("transfer_seconds")
            if f("transfer_seconds") > 0
            else None,
            "pinned": facts.pinned,
        },
        "threads": {"decode": threads, "auto": facts.auto, "bound": facts.num_workers},
        "cores": {"available": facts.cores, "busy": f("cpu_seconds") / wall},
    }


def _busy(seconds: float, wall: float) -> dict[str, float]:
    return {"seconds": seconds, "of_wall": seconds / wall}


def _bottleneck(evidence: dict[str, Any], facts: LoaderFacts) -> str:
    if evidence["transfer"]["copy_busy"] >= TRANSFER_BUSY:
        return "transfer"
    shares: dict[str, float] = evidence["loop"]["shares"]
    top = max(shares, key=lambda k: shares[k])
    if top != "wait":
        return top
    # The loop waited for the engine most: which of its stages is short.
    python_busy = evidence["workers"]["python_busy"]
    if python_busy is not None and python_busy >= WORKER_PYTHON_BUSY:
        return "python"
    engine = evidence["engine"]
    busy = engine["busy"] if engine["busy"] is not None else 1.0  # inline: the wait is the work
    if busy < WORKERS_BUSY:
        return "storage"
    transform = evidence["stages"]["transform"]["seconds"]
    decode = evidence["stages"]["decode"]["seconds"]
    if facts.busy_stage == "decode" and transform >= TRANSFORM_SHARE * (transform + decode):
        return "transform"
    return facts.busy_stage


def _more_threads(evidence: dict[str, Any], facts: LoaderFacts) -> int:
    """Threads that would keep the loop from waiting, if the work scales
    with them, up to the cores."""
    threads = int(evidence["threads"]["decode"]) or 1
    wait = float(evidence["loop"]["shares"]["wait"])
    wanted = math.ceil(threads / max(0.1, 1.0 - wait))
    return min(facts.cores, max(threads + 1, wanted))


def _contention(busy_cores: float, threads: int, busy: float | None) -> str:
    """A note when this process got much less CPU than its busy threads ask:
    other processes hold the cores, and more threads may not help."""
    if busy is None or busy_cores >= 0.6 * threads * busy:
        return ""
    return (
        f" (this process got {busy_cores:.1f} cores' time for {threads} busy "
        f"thread{'s' if threads != 1 else ''}: other processes share the cores)"
    )


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _prescription(stage: str, evidence: dict[str, Any], facts: LoaderFacts) -> str:
    loop = evidence["loop"]
    threads = int(evidence["threads"]["decode"])
    cores = facts.cores
    busy_cores = evidence["cores"]["busy"]
    per_batch_ms = 1e3 / max(1, evidence["batches"])
    auto = " (num_workers='auto' is at its bound)" if facts.auto else ""
    if stage == "consumer":
        queue = evidence["queue"]
        tail = (
            f"; num_workers='auto' runs {threads} of {facts.num_workers} threads for it"
            if facts.auto
            else ""
        )
        return (
            f"the loop spent {_pct(loop['shares']['consumer'])} of the time in its own step and "
            f"{_pct(loop['shares']['wait'])} waiting for batches ({queue['mean_ready']:.1f} "
            f"ready on average when it asked): nothing to gain here{tail}"
        )
    if stage == "transfer":
        copy = evidence["transfer"]
        rate = copy["gb_per_second"]
        at = f" at {rate:.2g} GB/s" if rate else ""
        pin = "" if facts.pinned else "pin_memory=True (pageable copies are slower), and "
        return (
            f"host-to-device copies kept the copy engine busy {_pct(copy['copy_busy'])}{at}: "
            f"{pin}hand over fewer bytes: decode(dtype='uint8') and normalise on the device"
        )
    if stage == "collate":
        ms = loop["collate_seconds"] * per_batch_ms
        return (
            f"collation takes {ms:.2f} ms per batch on the loop's thread "
            f"({_pct(loop['shares']['collate'])} of the time): leave collate_fn out where "
            "torch's default collation does (the engine then batches the native fields)"
            if facts.collate_fn
            else f"collation takes {ms:.2f} ms per batch on the loop's thread: put "
            ".batched() before any Python stage, where the engine batches"
        )
    if stage == "python":
        return _python_prescription(evidence, facts, per_batch_ms)
    if stage == "storage":
        return _storage_prescription(evidence, facts)
    more = _more_threads(evidence, facts)
    engine = evidence["engine"]
    busy = engine["busy"] if engine["busy"] is not None else None
    if stage == "transform":
        stages = evidence["stages"]
        share = stages["transform"]["seconds"] / max(
            1e-12, stages["transform"]["seconds"] + stages["decode"]["seconds"]
        )
        what = (
            f"resizing, cropping and writing the output take {_pct(share)} of the decode "
            f"threads' busy time"
        )
        if threads < cores and not facts.processes:
            return (
                f"{what}, with {threads} of {cores} cores' threads: num_workers={more}"
                f"{_contention(busy_cores, threads, busy)}"
            )
        return (
            f"{what} on all {cores} cores{auto}: write uint8 (decode(dtype='uint8')) and "
            "normalise on the device, or decode to a smaller size"
        )
    # decode (or reading rows, busy_stage "storage" handled above as storage)
    busy_text = f"{_pct(busy)} busy" if busy is not None else "on the loop's thread"
    contended = _contention(busy_cores, threads, busy)
    if facts.processes:
        return (
            f"the engines of the {facts.processes} worker processes decode {busy_text}: raise "
            "worker_threads (native threads per worker process) or num_workers, up to the "
            f"{cores} cores"
        )
    if threads < cores:
        return (
            f"{threads} decode thread{'s' if threads != 1 else ''} {busy_text}, "
            f"{busy_cores:.1f} of {cores} cores busy: num_workers={more}{contended}"
        )
    return (
        f"{threads} decode threads {busy_text} on all {cores} cores{auto}: decode less per "
        "sample (decode(size=...) decodes JPEGs at a reduced scale when the output is at "
        "most half the image, crop='random_resized' reads only the crop's rows) or use more "
        "cores"
    )


# Python work with an equivalent in the engine's decode options, by a word
# of the function's name.
_NATIVE_EQUIVALENTS = (
    ("normal", "decode(normalize=...)"),
    ("resize", "decode(size=..., resize=...)"),
    ("crop", "decode(size=..., crop=...)"),
    ("flip", "decode(flip=True)"),
    ("float", "decode(dtype=...)"),
    ("half", "decode(dtype=torch.float16)"),
)


def _native_move(stages: tuple[str, ...]) -> str:
    """How to move `stages` into the engine, where their names say."""
    for stage in stages:
        name = stage.lower()
        for word, option in _NATIVE_EQUIVALENTS:
            if word in name:
                return f"move .{stage} to {option}"
    return (
        "move image work to the engine's decode(size=..., crop=..., flip=..., "
        "normalize=..., dtype=...)"
    )


def _python_prescription(evidence: dict[str, Any], facts: LoaderFacts, per_batch_ms: float) -> str:
    stages = ", ".join(facts.python_stages) or "chute's conversion of each batch"
    move = _native_move(facts.python_stages)
    if facts.processes:
        share = evidence["workers"]["python_busy"] or 0.0
        busy = f"{facts.processes} worker processes busy {_pct(share)} in Python ({stages})"
        if facts.processes < facts.cores:
            more = min(facts.cores, 2 * facts.processes)
            return f"{busy}: num_workers={more}, or {move}"
        return f"{busy} on {facts.cores} cores: {move}"
    ms = evidence["loop"]["python_seconds"] * per_batch_ms
    where = f"Python ({stages}) takes {ms:.2f} ms per batch on the loop's thread"
    if facts.python_stages and facts.cores > 1:
        return f"{where}: num_workers={facts.cores} runs it in worker processes, or {move}"
    if facts.python_stages:
        return f"{where}: {move}"
    return f"{where}: larger batches spread it over more samples"


def _rate(mb_per_second: float) -> str:
    if mb_per_second >= 100:
        return f"{mb_per_second:.0f} MB/s"
    if mb_per_second >= 1:
        return f"{mb_per_second:.1f} MB/s"
    return f"{mb_per_second:.2g} MB/s"


def _storage_prescription(evidence: dict[str, Any], facts: LoaderFacts) -> str:
    storage = evidence["storage"]
    engine = evidence["engine"]
    rate = _rate(storage["mb_per_second"])
    if facts.busy_stage == "storage" and engine["busy"] is not None:
        threads = int(evidence["threads"]["decode"])
        more = _more_threads(evidence, facts)
        if threads < facts.cores:
            return (
                f"reading rows at {rate} with {threads} threads "
                f"{_pct(engine['busy'])} busy: num_workers={more}"
            )
        return f"reading rows at {rate} on all {facts.cores} cores: faster storage"
    waiting = engine["idle"]
    idle = f", the decode threads idle {_pct(waiting)} of their time" if waiting else ""
    shards = facts.shards_at_once
    at = f"at {rate} with {shards} shard{'s' if shards != 1 else ''} read at once{idle}"
    if facts.remote:
        return (
            f"{at}: raise prefetch_bytes (now {facts.prefetch_bytes // 2**20} MiB) or the "
            "requests in flight (chute.remote.RemoteOptions)"
        )
    return (
        f"{at}: read more shards at once (WebDataset(streams=N), or num_workers of 4 or "
        "more, which parses up to 4 shards ahead) or faster storage"
    )


def format_report(report: dict[str, Any]) -> str:
    """The report as a few lines of text (``chute doctor``, the docs)."""
    lines = [f"bottleneck: {report['bottleneck']}", f"  {report['prescription']}"]
    evidence = report.get("evidence") or {}
    if not evidence:
        return "\n".join(lines)
    loop = evidence["loop"]["shares"]
    lines.append(
        f"wall {evidence['elapsed_seconds']:.2f} s, {evidence['batches']} batches, "
        f"{evidence['samples_per_second']:,.0f} samples/s; the loop: "
        + ", ".join(f"{k} {_pct(v)}" for k, v in loop.items() if v >= 0.005)
    )
    busy = ", ".join(
        f"{k} {v['seconds']:.2f} s ({v['of_wall']:.2f})"
        for k, v in evidence["stages"].items()
        if v["seconds"] > 0
    )
    lines.append(f"busy (x wall): {busy}")
    engine = evidence["engine"]
    if engine["busy"] is not None:
        lines.append(
            f"batch workers: busy {_pct(engine['busy'])}, held back by the consumer "
            f"{_pct(engine['blocked'])}, idle {_pct(engine['idle'])}"
        )
    queue = evidence["queue"]
    threads = evidence["threads"]
    cores = evidence["cores"]
    lines.append(
        f"queue: {queue['mean_ready']:.1f} batches ready on average (at most "
        f"{queue['capacity']} in flight now), {_pct(queue['waited_for'])} waited for; "
        f"threads {threads['decode']}"
        + (f" (auto, up to {threads['bound']})" if threads["auto"] else "")
        + f"; cores {cores['busy']:.1f} busy of {cores['available']}"
    )
    storage = evidence["storage"]
    if storage["mb_per_second"] > 0:
        lines.append(
            f"storage: {_rate(storage['mb_per_second'])} of sample payload, "
            f"{storage['shards_at_once']} shard(s) at once"
        )
    return "\n".join(lines)


def loop_figures(
    figures: dict[str, Any], clock: ConsumerClock | None, collation: Any, transfer: Any
) -> dict[str, Any]:
    """A loader's ``stats()``: the engine's `figures` with the loop's side
    (`clock`), the time of the user's collate_fn (a ``TimedCall``, or None)
    and of the hand-off to a device (a ``TransferFigures``, or None)."""
    out = dict(figures)
    out.update(
        clock.figures()
        if clock is not None
        else {"elapsed_seconds": 0.0, "consumer_seconds": 0.0, "cpu_seconds": 0.0}
    )
    if collation is not None:
        out["collate_seconds"] = out.get("collate_seconds", 0.0) + collation.seconds
    out.update(
        transfer.as_stats()
        if transfer is not None
        else {"transfer_host_seconds": 0.0, "transfer_seconds": 0.0, "transfer_bytes": 0}
    )
    return out


def loader_facts(loader: Any) -> LoaderFacts:
    """What `loader` (a ``chute.DataLoader``) is, for the diagnosis."""
    from chute.sources.remote_urls import any_remote

    dataset = loader.dataset
    native = loader._native
    processes = loader.num_workers if native is not None and loader._python_work(native) else 0
    urls = list(getattr(dataset, "urls", None) or [])
    remote = any_remote(urls)
    options = getattr(dataset, "remote", None)
    threads = loader.threads
    parse_ahead = max(min(threads, 4), 3) if remote else min(threads, 4)
    return LoaderFacts(
        num_workers=int(loader.num_workers),
        processes=int(processes),
        auto=bool(loader._auto_threads),
        python_stages=tuple(python_stage_names(dataset, loader._running)),
        collate_fn=loader._user_collate_fn is not None,
        remote=remote,
        prefetch_bytes=int(getattr(options, "prefetch_bytes", 0) or 0),
        shards_at_once=parse_ahead * max(1, int(getattr(dataset, "streams", 1) or 1)),
        busy_stage=str(getattr(dataset, "busy_stage", "decode")),
        device=loader._handoff_device is not None,
        pinned=bool(loader.pin_memory or loader._handoff_device is not None),
    )


def python_stage_names(dataset: Any, running: Any = None) -> list[str]:
    """The stages of `dataset` that run in Python, as ``kind(function)``:
    those the running iteration compiled (`running`, a stream's), else
    compiled anew."""
    compiled = getattr(getattr(running, "run", None), "compiled", None)
    if compiled is None:
        compiled = getattr(dataset, "_compiled", None)
    if compiled is None:
        compile_pipeline = getattr(dataset, "compile_pipeline", None)
        if not callable(compile_pipeline):
            return []
        try:
            compiled = compile_pipeline(
                lambda: dataset.first_sample_extensions(dataset.urls), seed=0, shuffle_seed=0
            )
        except Exception:  # noqa: BLE001 - the iteration reports it; the names are a nicety
            return []
    return [_stage_name(stage) for stage in getattr(compiled, "python_stages", [])]


def _stage_name(stage: Any) -> str:
    for attribute in ("f", "predicate", "function", "collation_fn"):
        fn = getattr(stage, attribute, None)
        name = getattr(fn, "__name__", None)
        if callable(fn) and name:
            return f"{stage.kind}({name})"
    return str(getattr(stage, "kind", type(stage).__name__))
