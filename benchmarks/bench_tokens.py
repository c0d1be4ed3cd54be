"""Language-model token data (issue 24), one function per part, chosen by --part.

Part (a), pre-tokenized: a uint16 token file (nanoGPT's ``train.bin``) cut
into contiguous windows of 2,048 + 1 tokens, batches of 32, shuffled:

- ``chute.TokenDataset(pack="windows")`` in ``chute.DataLoader`` (native
  threads, int64 ``input_ids`` and ``labels``); and with
  ``window_views=True`` (``input_ids`` and ``labels`` views of one
  ``[32, 2049]`` batch tensor, written once), int64, int32, and in the
  file's own dtype (``out_dtype=torch.uint16``: the same bytes memcpy
  moves); each at num_workers = the cores (native threads), and at
  num_workers=0, where each batch is made in the consumer's own next()
  (in-line, no engine thread) and, for comparison, the same on one engine
  thread as before in-line reads (``TokenDataset.reads_inline`` off in
  that run's process);
- nanoGPT's loader under torch's DataLoader: ``np.memmap`` of the file made
  again for each batch, and ``torch.stack`` of ``from_numpy(window.astype(
  np.int64))`` for inputs and targets, as nanoGPT's ``get_batch`` does, over
  the same shuffled windows (a batch sampler hands it whole batches), at
  each num_workers of --memmap-workers, the best reported;
- the limit: one thread memcpy-ing the same windows' bytes (uint16, 2,049
  tokens each) from the page cache into one reused batch buffer
  (``chute_testing.memcpy_windows``: no Python between windows).
- chute's engine call alone: the call the in-line loader makes for each
  batch (uint16 window views), in a loop over the same batches with no
  loader, sampler or tensors around it: what is left of the limit for
  everything a loader does in Python per batch.

Every loader runs in its own subprocess on a warm page cache, repeating
epochs for at least MIN_SECONDS. memcpy and the chute loaders run in
--repeats rounds, one after the other in each; each row is its median run,
and the fractions of the memcpy limit are the median round's (each round's
runs see about the same load). Figures are tokens/s of ``input_ids``
delivered, and GB/s written into batches (memcpy writes 2 bytes per token,
chute 16, with window_views 8, 4 in int32 and 2 in uint16, nanoGPT's loader 16).
Tokens per CPU-second (the loader's threads and workers included) are
reported too, and their fraction of memcpy's: on a shared machine they move
less with the load than wall time does.
Targets: chute >= 80% of the memcpy limit and ahead of the memmap loader.
The load average before and after (and at each run) is printed and saved:
on a shared machine the figures mean little without it.

Part (b), tokenize + pack from JSON Lines. The text is generated here
(seeded pseudo-words with a Zipf frequency, sentences, paragraphs) and a
byte-level BPE tokenizer is trained on part of it with ``tokenizers``' own
BpeTrainer, so nothing is downloaded. Each configuration runs in its own
process, side by side in one run, on the same shards:

- ``encode_batch``: the ``tokenizers`` library alone, on the texts already in
  memory: ``Tokenizer.encode_batch`` over batches of 1,024 documents and
  each encoding's ``ids`` (its own throughput on the same cores; reading and
  parsing the JSON are not timed); ``encode_batch_fast``, the same with the
  library's encoder without character offsets (what chute calls);
- ``chute``: ``chute.TokenDataset.from_text``: ``chute.tokenize_shards``
  from the JSON Lines files into a fresh cache (read, parse, encode, write
  ``.bin``/``.idx``), then every packed window of ``seq_len + 1`` tokens
  through ``chute.DataLoader`` in batches of 32 (native threads, one per
  core); ``chute, cached``: the same a second time (the cache verified and
  reused);
- ``datasets``: Hugging Face ``datasets``: ``load_dataset("json")`` into a
  fresh cache, ``map(tokenize, batched=True)`` with the same tokenizer, and
  packing in Python (rows concatenated with the end-of-document id, cut
  into ``seq_len + 1`` windows) in a torch IterableDataset under torch's
  DataLoader at num_workers 0, 1 and 2 (each worker packs its share of the
  rows).

Every configuration counts the tokens it produced (the texts' tokens plus
one end-of-document id per document, equal for all or the run fails); the
figures are tokens per second of wall time, start to last batch, and tokens
per CPU-second (the process's threads and its finished DataLoader workers),
which moves less with the load of a shared machine. --repeats rounds, each
in a rotated order of the configurations; each row is the median round.

Beside the ratios it prints the encoder's own bound: ``encode_batch_fast``
over the best ``datasets`` loader is the most any loader that has to run
this encoder on these cores could reach; and, for ``datasets``, the wall
and CPU time of its ``map`` (CPU above wall: the tokenizer's threads ran in
parallel). ``--baseline-tree DIR`` adds chute imported from DIR (another
checkout's ``python/``) as one more configuration: before and after in one
run.

    python benchmarks/bench_tokens.py --part a            # 128M tokens
    python benchmarks/bench_tokens.py --part a --quick    # 16M
    python benchmarks/bench_tokens.py --part b            # 8 MiB of text, 3 rounds
    python benchmarks/bench_tokens.py --part b --quick    # 2 MiB
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, run_config, save, table  # noqa: E402

SEQ_LEN = 2048
BATCH = 32
VOCAB = 50257
EOD = "<|endoftext|>"  # part (b)'s end-of-document token
MIN_SECONDS = 2.0  # each run repeats epochs until it has taken this long
# Bytes each loader writes per input token: memcpy copies the uint16
# windows (2,049 tokens for 2,048 inputs); chute int64 input_ids and
# labels, or with window_views the windows as int64 (or int32), input_ids
# and labels being views of them; nanoGPT's loader int64 inputs and targets.
BYTES_PER_TOKEN = {
    "memcpy": 2 * 2049 / 2048,
    "chute": 16,
    "chute-views": 8 * 2049 / 2048,
    "chute-views-int32": 4 * 2049 / 2048,
    "chute-views-uint16": 2 * 2049 / 2048,
    "gather": 2 * 2049 / 2048,
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
        import chute_testing

        starts = np.array([w for b in window_order(windows, 0) for w in b], dtype=np.int64)
        file = chute._core.TokenFile(path, "raw", "uint16")
        seconds, epochs = 0.0, 0
        cpu = _cpu_seconds()
        while seconds < MIN_SECONDS:
            window_bytes = (SEQ_LEN + 1) * 2
            seconds += chute_testing.memcpy_windows(file, starts * SEQ_LEN * 2, window_bytes, BATCH)
            epochs += 1
        cpu = _cpu_seconds() - cpu
        tokens = epochs * windows * SEQ_LEN
        print(json.dumps({"tokens": tokens, "seconds": seconds, "cpu": cpu, "first": None}))
        return
    if kind == "gather":
        import chute

        ds = chute.TokenDataset(
            path, SEQ_LEN, dtype="uint16", out_dtype=torch.uint16, window_views=True
        )
        # The engine's own call, as the in-line loader makes it for each
        # batch, with nothing of the loader around it.
        engine = ds._make_engine(ds._state(), 0, 1, None)
        order = [np.asarray(b, dtype=np.int64) for b in window_order(windows, 0)]
        seconds, epochs = 0.0, 0
        cpu = _cpu_seconds()
        while seconds < MIN_SECONDS:
            start = time.perf_counter()
            for idx in order:
                engine.gather(idx)
            seconds += time.perf_counter() - start
            epochs += 1
        cpu = _cpu_seconds() - cpu
        engine.close()
        tokens = epochs * sum(len(b) for b in order) * SEQ_LEN
        print(json.dumps({"tokens": tokens, "seconds": seconds, "cpu": cpu, "first": None}))
        return
    loader: Any
    if kind == "chute":
        import chute

        if config.get("threaded"):
            chute.TokenDataset.reads_inline = False
        out_dtype = getattr(torch, config.get("out_dtype", "int64"))
        ds = chute.TokenDataset(
            path,
            SEQ_LEN,
            dtype="uint16",
            out_dtype=out_dtype,
            window_views=bool(config.get("views")),
        )
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
    start, cpu = time.perf_counter(), _cpu_seconds()
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
    cpu = _cpu_seconds() - cpu
    print(json.dumps({"tokens": delivered, "seconds": seconds, "cpu": cpu, "first": first}))


def part_a(args: argparse.Namespace) -> None:
    from chute.loader.engine import default_threads

    tokens = 16_000_000 if args.quick else 128_000_000
    path = token_file(tokens)
    with open(path, "rb") as f:  # a warm page cache for every loader
        while f.read(1 << 24):
            pass
    threads = default_threads()
    script = str(Path(__file__).resolve())
    load_before = os.getloadavg()
    modes = ["chute", "chute-views", "chute-views-int32", "chute-views-uint16"]
    configs = [("memcpy", 0), ("gather", 0)]
    for mode in modes:
        configs += [(mode, threads), (mode, 0), (mode + "-threaded", 0)]
    names = {
        "memcpy": "memcpy of the same windows, 1 thread",
        "gather": "chute's engine call alone (uint16 views, no loader)",
        "chute": "chute.TokenDataset + chute.DataLoader",
        "chute-views": "the same, window_views=True",
        "chute-views-int32": "the same, window_views + out_dtype=torch.int32",
        "chute-views-uint16": "the same, window_views + out_dtype=torch.uint16",
        "memmap": "nanoGPT np.memmap + torch DataLoader",
    }

    def run(kind: str, workers: int) -> dict[str, Any]:
        threaded = kind.endswith("-threaded")
        mode = kind.removesuffix("-threaded")
        config = {
            "part": "a",
            "loader": mode.split("-")[0],
            "out_dtype": mode.rsplit("-", 1)[1] if mode.endswith(("int32", "uint16")) else "int64",
            "views": "views" in mode,
            "workers": workers,
            "threaded": threaded,
            "path": path,
        }
        report = run_config(script, config)
        how = " (in-line)" if mode.startswith("chute") and workers == 0 and not threaded else ""
        how = " (1 engine thread)" if threaded else how
        result = {
            "loader": names[mode] + how,
            "kind": kind,
            "workers": workers,
            "tokens_per_s": report["tokens"] / report["seconds"],
            "tokens_per_cpu_s": report["tokens"] / report["cpu"],
            "written_gb_per_s": report["tokens"] * BYTES_PER_TOKEN[mode] / report["seconds"] / 1e9,
            "first_batch_s": report["first"],
            "peak_rss_mib": report["peak_tree_rss"] / 2**20,
            "load_average": os.getloadavg()[0],
        }
        print(
            f"  {result['loader']:40s} workers={workers}: {result['tokens_per_s']:,.0f} tokens/s"
            f" (load {result['load_average']:.1f})",
            flush=True,
        )
        return result

    # Rounds of memcpy and the chute loaders one after the other: the
    # machine's load drifts, and each round's ratios compare runs made
    # under about the same load.
    runs: dict[str, list[dict[str, Any]]] = {f"{k}-{w}": [] for k, w in configs}
    fractions: dict[str, list[float]] = {f"{k}-{w}": [] for k, w in configs[1:]}
    # The same per CPU-second (the loader's threads included): moves less
    # with the load of a shared machine than wall time does.
    cpu_fractions: dict[str, list[float]] = {key: [] for key in fractions}
    for round_ in range(args.repeats):
        print(f"round {round_ + 1} of {args.repeats}", flush=True)
        results = {f"{kind}-{workers}": run(kind, workers) for kind, workers in configs}
        for key, result in results.items():
            runs[key].append(result)
        for key in fractions:
            fractions[key].append(
                results[key]["tokens_per_s"] / results["memcpy-0"]["tokens_per_s"]
            )
            cpu_fractions[key].append(
                results[key]["tokens_per_cpu_s"] / results["memcpy-0"]["tokens_per_cpu_s"]
            )
    for w in args.memmap_workers.split(","):
        runs[f"memmap-{w}"] = [run("memmap", int(w))]
    rows: list[dict[str, Any]] = []
    median_rows: dict[str, dict[str, Any]] = {}
    for key, results in runs.items():
        ordered = sorted(results, key=lambda r: r["tokens_per_s"])
        rows.append(ordered[len(ordered) // 2])
        median_rows[key] = ordered[len(ordered) // 2]
    runs_of = {key: [r["tokens_per_s"] for r in results] for key, results in runs.items()}
    load_after = os.getloadavg()
    memcpy = next(r for r in rows if r["kind"] == "memcpy")
    ours = {key: median_rows[key] for key in fractions}
    best = max((r for r in rows if r["kind"] == "memmap"), key=lambda r: r["tokens_per_s"])

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    summary = {
        "tokens": tokens,
        "memcpy_tokens_per_s": memcpy["tokens_per_s"],
        "tokens_per_s": {kind: r["tokens_per_s"] for kind, r in ours.items()},
        "best_memmap_tokens_per_s": best["tokens_per_s"],
        "best_memmap_workers": best["workers"],
        # The median round's fraction of that round's memcpy run.
        "fraction_of_memcpy": {kind: median(f) for kind, f in fractions.items()},
        "fractions_of_memcpy_by_round": fractions,
        "fraction_of_memcpy_per_cpu_s": {k: median(f) for k, f in cpu_fractions.items()},
        "speedup_over_memmap": {
            kind: r["tokens_per_s"] / best["tokens_per_s"] for kind, r in ours.items()
        },
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
                ("tokens_per_cpu_s", "tokens/CPU-s"),
                ("written_gb_per_s", "GB/s written"),
                ("first_batch_s", "first batch s"),
                ("peak_rss_mib", "peak RSS MiB"),
            ],
        )
    )
    print()
    for kind in fractions:
        print(
            f"{ours[kind]['loader']} workers={ours[kind]['workers']}:"
            f" {summary['fraction_of_memcpy'][kind]:.0%} of the memcpy limit"
            f" ({summary['fraction_of_memcpy_per_cpu_s'][kind]:.0%} per CPU-second)"
            f" (the median round's; target >= 80%),"
            f" {summary['speedup_over_memmap'][kind]:.1f}x nanoGPT's memmap loader at"
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


def generate_documents(total_bytes: int, seed: int = 0) -> list[str]:
    """Seeded English-like text: pseudo-words drawn with a Zipf law, in
    sentences and paragraphs, documents of 100 to 20,000 characters."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1 / np.arange(1, 27) ** 0.9
    weights /= weights.sum()
    words = [
        "".join(rng.choice(letters, size=int(rng.integers(1, 11)), p=weights))
        for _ in range(30_000)
    ]
    frequency = 1 / np.arange(1, len(words) + 1) ** 1.05
    frequency /= frequency.sum()
    documents: list[str] = []
    size = 0
    while size < total_bytes:
        n_words = int(np.clip(rng.lognormal(5.5, 1.0), 20, 3000))
        drawn = rng.choice(len(words), size=n_words, p=frequency)
        parts: list[str] = []
        sentence_start = True
        for k, w in enumerate(drawn):
            word = words[w]
            parts.append(word.capitalize() if sentence_start else word)
            sentence_start = rng.random() < 0.07
            if sentence_start:
                parts[-1] += "." if k % 9 else ".\n\n"
            elif rng.random() < 0.05:
                parts[-1] += ","
        text = " ".join(parts) + "."
        documents.append(text)
        size += len(text)
    return documents


def make_data(directory: Path, total_bytes: int, shards: int) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    documents = generate_documents(total_bytes)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=16_384,
        special_tokens=[EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents[: max(1, len(documents) // 8)], trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    files = []
    per_shard = -(-len(documents) // shards)
    for s in range(shards):
        path = directory / f"part-{s:03d}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i, text in enumerate(documents[s * per_shard : (s + 1) * per_shard]):
                f.write(json.dumps({"id": f"{s}-{i}", "text": text}) + "\n")
        files.append(str(path))
    return {
        "files": files,
        "tokenizer": str(directory / "tokenizer.json"),
        "documents": len(documents),
        "text_bytes": sum(len(t.encode()) for t in documents),
    }


def _cpu_seconds() -> float:
    """CPU time of this process's threads and of its finished children
    (DataLoader workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _read_texts(files: list[str]) -> list[str]:
    texts = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return texts


def run_encode_batch(cfg: dict) -> dict:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(cfg["tokenizer"])
    encode = tokenizer.encode_batch_fast if cfg["fast"] else tokenizer.encode_batch
    texts = _read_texts(cfg["files"])
    start, cpu = time.perf_counter(), _cpu_seconds()
    tokens = 0
    for i in range(0, len(texts), 1024):
        for encoding in encode(texts[i : i + 1024]):
            tokens += len(encoding.ids)
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens + len(texts)}


def run_chute(cfg: dict) -> dict:
    import chute
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(cfg["tokenizer"])
    eod = tokenizer.token_to_id(EOD)
    cache = cfg["cache"]
    if not cfg["cached"]:
        shutil.rmtree(cache, ignore_errors=True)
    start, cpu = time.perf_counter(), _cpu_seconds()
    dataset = chute.TokenDataset.from_text(
        cfg["files"], tokenizer, SEQ_LEN, cache_dir=cache, eod_id=eod
    )
    tokenized = time.perf_counter() - start
    windows = batches = 0
    for batch in chute.DataLoader(dataset, batch_size=BATCH, num_workers=os.cpu_count()):
        windows += batch["input_ids"].shape[0]
        batches += 1
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokenize_seconds": tokenized,
        "tokens": dataset.token_stats()["tokens"],
        "windows": windows,
        "batches": batches,
    }


def run_datasets(cfg: dict) -> dict:
    import datasets
    import torch
    from tokenizers import Tokenizer
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    datasets.disable_progress_bars()
    tokenizer = Tokenizer.from_file(cfg["tokenizer"])
    eod = tokenizer.token_to_id(EOD)

    def tokenize(batch: dict) -> dict:
        return {"input_ids": [e.ids for e in tokenizer.encode_batch(batch["text"])]}

    class Packed(IterableDataset):
        def __init__(self, rows) -> None:
            self.rows = rows

        def __iter__(self):
            info = get_worker_info()
            worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
            n = len(self.rows)
            share = self.rows.select(range(n * worker // workers, n * (worker + 1) // workers))
            buffer: list[int] = []
            for batch in share.iter(batch_size=1000):
                for ids in batch["input_ids"]:
                    buffer.extend(ids)
                    buffer.append(eod)
                while len(buffer) >= SEQ_LEN + 1:
                    yield torch.tensor(buffer[: SEQ_LEN + 1])
                    del buffer[: SEQ_LEN + 1]

    cache = tempfile.mkdtemp(prefix="bench-tokens-datasets-")
    try:
        start, cpu = time.perf_counter(), _cpu_seconds()
        raw = datasets.load_dataset("json", data_files=cfg["files"], split="train", cache_dir=cache)
        loaded, map_cpu = time.perf_counter(), _cpu_seconds()
        tokenized = raw.map(tokenize, batched=True, remove_columns=raw.column_names)
        tokenize_seconds = time.perf_counter() - start
        # map's own wall and CPU time: CPU above wall shows the tokenizer's
        # threads ran in parallel (the map runs in this process, before the
        # DataLoader forks its workers).
        map_seconds, map_cpu = time.perf_counter() - loaded, _cpu_seconds() - map_cpu
        loader = DataLoader(Packed(tokenized), batch_size=BATCH, num_workers=cfg["workers"])
        windows = batches = 0
        for batch in loader:
            windows += batch.shape[0]
            batches += 1
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        tokens = sum(len(ids) + 1 for ids in tokenized["input_ids"])
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokenize_seconds": tokenize_seconds,
        "map_seconds": map_seconds,
        "map_cpu_seconds": map_cpu,
        "tokens": tokens,
        "windows": windows,
        "batches": batches,
    }


def worker_b(config: dict[str, Any]) -> None:
    if config.get("tree"):
        sys.path.insert(0, config["tree"])  # --baseline-tree: chute from another checkout
    run = {"encode_batch": run_encode_batch, "chute": run_chute, "datasets": run_datasets}
    print(json.dumps(run[config["kind"]](config)))


def label(cfg: dict) -> str:
    if cfg["kind"] == "datasets":
        return f"datasets map + Python packing, DataLoader num_workers={cfg['workers']}"
    if cfg["kind"] == "chute":
        tree = f" ({cfg['tree']})" if cfg.get("tree") else ""
        cached = ", cached" if cfg["cached"] else ""
        return f"chute TokenDataset.from_text + DataLoader{cached}{tree}"
    name = "encode_batch_fast" if cfg["fast"] else "encode_batch"
    return f"tokenizers {name} (texts in memory)"


def _run_b(cfg: dict, base: dict) -> dict:
    cfg = {**base, **cfg, "part": "b"}
    result = run_config(str(Path(__file__).resolve()), cfg)
    result["label"] = label(cfg)
    result["config"] = {
        k: v for k, v in cfg.items() if k not in base and k not in ("cache", "part")
    }
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    result["tokens_per_cpu_s"] = result["tokens"] / result["cpu_seconds"]
    result["peak_rss_mib"] = result.pop("peak_tree_rss") / 2**20
    result.pop("peak_tree_pss", None)
    result["load_average"] = os.getloadavg()[0]
    print(
        f"  {result['label']:<62} {result['tokens_per_s']:>12,.0f} tokens/s"
        f" {result['tokens_per_cpu_s']:>12,.0f} per CPU-s  {result['seconds']:>7.2f} s"
        f"  (load {result['load_average']:.1f})",
        flush=True,
    )
    return result


def part_b(args: argparse.Namespace) -> None:
    total_bytes = (2 if args.quick else 8) << 20
    work = Path(tempfile.mkdtemp(prefix="bench-tokens-"))
    try:
        load_before = os.getloadavg()
        data = make_data(work, total_bytes, shards=8)
        base = {"files": data["files"], "tokenizer": data["tokenizer"]}
        cache = str(work / "cache")
        # The fresh chute run and the cached one after it stay together.
        groups = [
            [{"kind": "encode_batch", "fast": False}],
            [{"kind": "encode_batch", "fast": True}],
            [
                {"kind": "chute", "cached": False, "cache": cache},
                {"kind": "chute", "cached": True, "cache": cache},
            ],
        ] + [[{"kind": "datasets", "workers": w}] for w in (0, 1, 2)]
        if args.baseline_tree:
            tree_cache = str(work / "cache-baseline")
            groups.append(
                [
                    {
                        "kind": "chute",
                        "cached": False,
                        "cache": tree_cache,
                        "tree": args.baseline_tree,
                    }
                ]
            )
        results = []
        # Rounds in rotated orders: the machine's load drifts, and no
        # configuration should always run at the same point of it.
        for round_ in range(args.repeats):
            print(f"round {round_ + 1} of {args.repeats}", flush=True)
            shift = round_ % len(groups)
            for group in groups[shift:] + groups[:shift]:
                for cfg in group:
                    results.append({**_run_b(cfg, base), "round": round_})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts = {r["tokens"] for r in results}
    if len(counts) != 1:
        raise RuntimeError(f"the configurations produced different token counts: {counts}")

    # Each configuration's row is its median run (by tokens/s); tokens per
    # CPU-second, the median of its own, moves less with the machine's load.
    rows: list[dict[str, Any]] = []
    for name in dict.fromkeys(r["label"] for r in results):
        runs = sorted((r for r in results if r["label"] == name), key=lambda r: r["tokens_per_s"])
        per_cpu = sorted(r["tokens_per_cpu_s"] for r in runs)
        rows.append({**runs[len(runs) // 2], "median_tokens_per_cpu_s": per_cpu[len(runs) // 2]})

    def speed(pred: Callable[[dict[str, Any]], bool], key: str) -> float:
        return max(r[key] for r in rows if pred(r))

    def is_encode(r: dict[str, Any], fast: bool) -> bool:
        return r["config"]["kind"] == "encode_batch" and r["config"]["fast"] == fast

    def is_chute(r: dict[str, Any]) -> bool:
        return (
            r["config"]["kind"] == "chute"
            and not r["config"]["cached"]
            and not r["config"].get("tree")
        )

    def is_baseline_tree(r: dict[str, Any]) -> bool:
        return r["config"]["kind"] == "chute" and bool(r["config"].get("tree"))

    summary: dict[str, Any] = {
        "documents": data["documents"],
        "text_bytes": data["text_bytes"],
        "tokens": counts.pop(),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
    }
    for key, unit in (("tokens_per_s", "wall"), ("median_tokens_per_cpu_s", "cpu")):
        ours = speed(is_chute, key)
        fast = speed(lambda r: is_encode(r, True), key)
        best_datasets = speed(lambda r: r["config"]["kind"] == "datasets", key)
        summary[unit] = {
            "chute_over_encode_batch": ours / speed(lambda r: is_encode(r, False), key),
            "chute_over_encode_batch_fast": ours / fast,
            "chute_over_best_datasets": ours / best_datasets,
            # A loader that must run this encoder is at best as fast as the
            # encoder alone: its speed-up over datasets is bounded by this.
            "encode_batch_fast_over_best_datasets": fast / best_datasets,
        }
        if args.baseline_tree:
            theirs = speed(is_baseline_tree, key)
            summary[unit]["baseline_tree"] = {
                "tree": args.baseline_tree,
                "chute_over_encode_batch_fast": theirs / fast,
                "chute_over_best_datasets": theirs / best_datasets,
            }
    datasets_rows = [r for r in rows if r["config"]["kind"] == "datasets"]
    summary["datasets_map"] = {
        str(r["config"]["workers"]): {
            "seconds": r["seconds"],
            "map_seconds": r["map_seconds"],
            "map_cpu_seconds": r["map_cpu_seconds"],
        }
        for r in datasets_rows
    }
    print()
    print(
        table(
            rows,
            [
                ("label", "loader"),
                ("tokens_per_s", "tokens/s"),
                ("median_tokens_per_cpu_s", "tokens/CPU-s"),
                ("seconds", "s"),
                ("peak_rss_mib", "peak RSS MiB"),
            ],
        )
    )
    print()
    for unit, what in (("wall", "tokens/s"), ("cpu", "tokens per CPU-second")):
        ratios = summary[unit]
        print(
            f"{what}: chute {ratios['chute_over_encode_batch']:.2f}x encode_batch (target >= 0.9),"
            f" {ratios['chute_over_encode_batch_fast']:.2f}x encode_batch_fast,"
            f" {ratios['chute_over_best_datasets']:.2f}x the best datasets loader (target >= 3);"
            f" the encoder alone (encode_batch_fast) is"
            f" {ratios['encode_batch_fast_over_best_datasets']:.2f}x that loader"
        )
        if "baseline_tree" in ratios:
            before = ratios["baseline_tree"]
            print(
                f"{what}: chute from {before['tree']}:"
                f" {before['chute_over_encode_batch_fast']:.2f}x encode_batch_fast,"
                f" {before['chute_over_best_datasets']:.2f}x the best datasets loader"
            )
    for workers, m in summary["datasets_map"].items():
        print(
            f"datasets, num_workers={workers}: map {m['map_seconds']:.2f} s of"
            f" {m['seconds']:.2f} s, {m['map_cpu_seconds'] / m['map_seconds']:.2f} CPUs busy in it"
        )
    print(
        "load average (1/5/15 min) before: "
        + "/".join(f"{x:.2f}" for x in summary["load_average_before"])
        + ", after: "
        + "/".join(f"{x:.2f}" for x in summary["load_average_after"])
    )
    path_saved = save(
        "tokens_b_quick" if args.quick else "tokens_b",
        {"rows": rows, "runs": results, "summary": summary},
    )
    print(f"saved {path_saved}")


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {"a": part_a, "b": part_b}
WORKERS: dict[str, Callable[[dict[str, Any]], None]] = {"a": worker_a, "b": worker_b}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=sorted(PARTS), default="a")
    parser.add_argument(
        "--quick", action="store_true", help="an eighth (a) or a quarter (b) of the data"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of chute and of memcpy (a), rounds (b)"
    )
    parser.add_argument("--memmap-workers", default="0,1,2", help="torch workers tried (a)")
    parser.add_argument(
        "--baseline-tree",
        help="(b) also run chute imported from this directory (another checkout's python/),"
        " side by side: before/after figures from one run",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config = json.loads(args.worker)
        WORKERS[config["part"]](config)
        return
    PARTS[args.part](args)


if __name__ == "__main__":
    main()
