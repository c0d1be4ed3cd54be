"""Token streams for language models (issue 24's benchmarks), one part per flag.

(b) ``--part b``: tokenize + pack from JSON Lines. The text is generated here
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
one end-of-document id per document) and the figure is tokens per second of
wall time, start to last batch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
SEQ_LEN = 2048
BATCH = 32
EOD = "<|endoftext|>"


def generate_documents(total_bytes: int, seed: int = 0) -> list[str]:
    """Seeded English-like text: pseudo-words drawn with a Zipf law, in
    sentences and paragraphs, documents of 100 to 20,000 characters."""
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
        tokenized = raw.map(tokenize, batched=True, remove_columns=raw.column_names)
        tokenize_seconds = time.perf_counter() - start
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
        "tokens": tokens,
        "windows": windows,
        "batches": batches,
    }


def run_config(cfg: dict) -> dict:
    return {"encode_batch": run_encode_batch, "chute": run_chute, "datasets": run_datasets}[
        cfg["kind"]
    ](cfg)


def label(cfg: dict) -> str:
    if cfg["kind"] == "datasets":
        return f"datasets map + Python packing, DataLoader num_workers={cfg['workers']}"
    if cfg["kind"] == "chute":
        return "chute TokenDataset.from_text + DataLoader" + (", cached" if cfg["cached"] else "")
    name = "encode_batch_fast" if cfg["fast"] else "encode_batch"
    return f"tokenizers {name} (texts in memory)"


def _run(cfg: dict, base: dict) -> dict:
    cfg = {**base, **cfg}
    proc = subprocess.run(
        [sys.executable, __file__, "--run", json.dumps(cfg)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{label(cfg)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["label"] = label(cfg)
    result["config"] = {k: v for k, v in cfg.items() if k not in base and k != "cache"}
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    result["tokens_per_cpu_s"] = result["tokens"] / result["cpu_seconds"]
    result["load_average"] = os.getloadavg()[0]
    print(
        f"{result['label']:<62} {result['tokens_per_s']:>12,.0f} tokens/s"
        f" {result['tokens_per_cpu_s']:>12,.0f} per CPU-s  {result['seconds']:>7.2f} s"
        f"  (load {result['load_average']:.1f})",
        flush=True,
    )
    return result


def part_b(args: argparse.Namespace) -> dict:
    total_bytes = (2 if args.quick else 8) << 20
    work = Path(tempfile.mkdtemp(prefix="bench-tokens-"))
    try:
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
        results = []
        # Rounds in rotated orders: the machine's load drifts, and each
        # configuration's figure is its best round.
        for round_ in range(args.rounds):
            print(f"-- round {round_ + 1} of {args.rounds}", flush=True)
            shift = round_ % len(groups)
            for group in groups[shift:] + groups[:shift]:
                for cfg in group:
                    results.append({**_run(cfg, base), "round": round_})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts = {r["tokens"] for r in results}
    if len(counts) != 1:
        raise RuntimeError(f"the configurations produced different token counts: {counts}")

    best: dict[str, dict] = {}
    for r in results:
        if r["label"] not in best or r["tokens_per_s"] > best[r["label"]]["tokens_per_s"]:
            best[r["label"]] = r

    cpu_best: dict[str, float] = {}
    for r in results:
        cpu_best[r["label"]] = max(cpu_best.get(r["label"], 0.0), r["tokens_per_cpu_s"])

    def speed(pred, per_cpu: bool) -> float:
        return max(
            cpu_best[r["label"]] if per_cpu else r["tokens_per_s"] for r in best.values() if pred(r)
        )

    summary: dict = {
        "documents": data["documents"],
        "text_bytes": data["text_bytes"],
        "tokens": counts.pop(),
        "best_tokens_per_s": {k: round(v["tokens_per_s"]) for k, v in best.items()},
        "best_tokens_per_cpu_s": {k: round(v) for k, v in cpu_best.items()},
    }

    def is_encode(r: dict, fast: bool) -> bool:
        return r["config"]["kind"] == "encode_batch" and r["config"]["fast"] == fast

    for per_cpu, unit in ((False, "wall"), (True, "cpu")):
        encode = speed(lambda r: is_encode(r, False), per_cpu)
        fast = speed(lambda r: is_encode(r, True), per_cpu)
        ours = speed(lambda r: r["label"] == label({"kind": "chute", "cached": False}), per_cpu)
        theirs = speed(lambda r: r["config"]["kind"] == "datasets", per_cpu)
        summary[unit] = {
            "chute_over_encode_batch": round(ours / encode, 2),
            "chute_over_encode_batch_fast": round(ours / fast, 2),
            "chute_over_best_datasets": round(ours / theirs, 2),
        }
    print("\nbest of each:")
    for name, r in best.items():
        print(
            f"{name:<62} {r['tokens_per_s']:>12,.0f} tokens/s"
            f" {cpu_best[name]:>12,.0f} per CPU-s  (load {r['load_average']:.1f})"
        )
    for unit, what in (("wall", "tokens/s"), ("cpu", "tokens per CPU-second")):
        ratios = summary[unit]
        print(
            f"{what}: chute {ratios['chute_over_encode_batch']}x encode_batch (target >= 0.9), "
            f"{ratios['chute_over_encode_batch_fast']}x encode_batch_fast, "
            f"{ratios['chute_over_best_datasets']}x the best datasets loader (target >= 3)"
        )
    return {"part": "b", "quick": args.quick, "summary": summary, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["b"], default="b")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results-dir", default=str(RESULTS))
    ap.add_argument("--run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run_config(json.loads(args.run))))
        return
    report = {"b": part_b}[args.part](args)
    report.update(cpus=os.cpu_count(), date=time.strftime("%Y-%m-%d %H:%M:%S"))
    name = f"tokens_{args.part}" + ("_quick" if args.quick else "")
    out = Path(args.results_dir) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
