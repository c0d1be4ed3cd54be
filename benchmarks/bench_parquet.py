"""Parquet (the Hugging Face hub's format) against tar shards and against
Hugging Face ``datasets``, LitData and Ray Data, and over S3 against local
files.

Data: bench_transforms.py's seeded 500x375 JPEGs (quality 90) + labels, as
tar shards (webdataset's TarWriter) and as the same images in Parquet
written as the hub writes them: ``datasets.Dataset.from_dict`` with an
``Image()`` feature (a ``struct<bytes: binary, path: string>`` column) and
``to_parquet``, 4 files, row groups of 250 rows.

(a) Train job, batches of 128 float16 CHW tensors: RandomResizedCrop(224) +
RandomHorizontalFlip + ToTensor + Normalize(ImageNet), an exact shuffle:
  - chute, Parquet: ``ParquetDataset(files, ["image", "label"],
    decode="torchrgb8", size=(224, 224), crop="random_resized", flip=True,
    normalize=..., dtype=torch.float16)`` on ``chute.DataLoader(shuffle=True,
    num_workers=cores)`` (threads);
  - chute, tar: ``TarDataset`` over the shards, the same options and loader;
  - Hugging Face datasets: ``Dataset.from_parquet(files).with_transform(...)``
    (Pillow decodes; bench_transforms.py's torchvision transforms written
    with Pillow and torch), torch's DataLoader(shuffle=True), the best of
    num_workers 0, 1, 2.
  - LitData: ``index_parquet_dataset`` over the files where they lie (its
    index.json, written once, untimed), ``StreamingDataset(dir,
    item_loader=ParquetLoader(), shuffle=True, item_shuffle_window="full",
    transform=...)`` (the same Pillow transform on the image bytes) and its
    ``StreamingDataLoader``, the best of num_workers 0, 1, 2 (forkserver
    workers: LitData refuses fork with its ParquetLoader). Its shuffle is
    LitData's: the files (its chunks) in a new order each epoch, each one's
    rows fully permuted; not a global permutation.
  - Ray Data: ``read_parquet(files)``, ``random_shuffle`` (an exact global
    shuffle, a new one each epoch), ``repartition`` into blocks of a batch,
    ``map_batches`` (the same Pillow transform), ``iter_torch_batches``; Ray
    started in the run's process on every core, 1 GiB object store.
  A peer that does not install or run prints a "not measured" row.
  - the stream form, the same job as webdataset pipelines run it: shards
    (row groups / tar shards) shuffled per epoch, a buffer of 256 samples,
    ``.decode("torchrgb8", ...)``, ``.to_tuple``, ``.batched(128)`` on
    ``chute.DataLoader(batch_size=None, num_workers=cores)``:
    ``chute.ParquetStream(files, ["image", "label"])`` against
    ``chute.wds.WebDataset`` over the tar shards.
  Each runs two epochs in its own process; the second is timed.
(b) The chute Parquet runs (ParquetDataset, then ParquetStream) over
    ``s3://`` urls of a local S3 server (moto) through bench_remote.py's
    latency proxy (+20 ms per request), against the same runs over the
    local files and over the same server without the proxy ("direct"), in
    --rounds alternating rounds. Here the first epoch is timed, in which
    every row group is read once (the second is served from the row group
    cache). Beside each S3 run: the CPU seconds of the loader's process in
    that epoch and those of the process serving S3 and the proxy (on the
    same cores here). No S3 epoch is shorter than those CPU seconds
    together spread over every core without a gap: the ratio that allows
    is ``s3_over_local_cpu_bound``. ``s3_over_s3_direct`` is what the
    20 ms cost once the server's own cost is in both; moto reads the whole
    object for every ranged GET, so its cost per request grows with the
    file, not with the range.

(arrow) The same images saved by ``datasets`` (``Dataset.save_to_disk``, 4
    shards of Arrow IPC stream files), read as they lie:
  - the train job of (a): ``ArrowDataset(dir, ["image", "label"],
    decode="torchrgb8", ...)`` on ``chute.DataLoader`` against
    ``datasets.load_from_disk(dir).with_transform(...)`` (Pillow) and
    torch's DataLoader, the best of num_workers 0, 1, 2;
  - the images decoded, nothing else: ``ArrowDataset(dir, ["image",
    "label"], decode="torchrgb8")`` (uint8 CHW) against datasets' own
    ``load_from_disk(dir).with_format("torch")`` (uint8 HWC tensors, Pillow
    decoding) and torch's DataLoader, the best of num_workers 0, 1, 2;
  both shuffled, two epochs in a process of their own, the second timed;
  and ParquetDataset's train job over the Parquet files the rows came from.

Targets (issue 23): (a) Parquet >= 0.95x tar and >= 3x the best of
datasets, LitData and Ray Data;
(b) >= 90% of local.

    python benchmarks/bench_parquet.py            # 1,000 images
    python benchmarks/bench_parquet.py --quick    # 500
    python benchmarks/bench_parquet.py --images 4000
    python benchmarks/bench_parquet.py --part b   # part (b) alone
    python benchmarks/bench_parquet.py --part b --images 4000 --rounds 3
    python benchmarks/bench_parquet.py --part streams  # the two stream rows alone
    python benchmarks/bench_parquet.py --part arrow    # save_to_disk directories
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_remote import BUCKET, CREDENTIALS, serve  # noqa: E402
from bench_transforms import MEAN, STD, shards, train_transform  # noqa: E402
from common import DATA, run_config, save, table  # noqa: E402

BATCH = 128
STREAM_BUFFER = 256
FILES = 4
ROW_GROUP = 250
LATENCY = "0.02"  # the bench_remote proxy used


def parquet_files(tar_shards: list[str], n: int) -> list[str]:
    """The tar shards' images and labels as hub-style Parquet (written once)."""
    import datasets
    import webdataset

    directory = DATA / f"parquet-{n}"
    marker = directory / "done.json"
    if marker.exists():
        return list(json.loads(marker.read_text()))
    directory.mkdir(parents=True, exist_ok=True)
    samples = list(webdataset.WebDataset(tar_shards, shardshuffle=False))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    per_file = -(-len(samples) // FILES)
    paths = []
    for k in range(FILES):
        part = samples[k * per_file : (k + 1) * per_file]
        table_ = datasets.Dataset.from_dict(
            {
                "image": [{"bytes": s["jpg"], "path": f"{s['__key__']}.jpg"} for s in part],
                "label": [int(s["cls"]) for s in part],
            },
            features=features,
        )
        path = directory / f"train-{k:05d}-of-{FILES:05d}.parquet"
        table_.to_parquet(str(path), batch_size=ROW_GROUP)
        paths.append(str(path))
    marker.write_text(json.dumps(paths))
    return paths


def saved_directory(files: list[str], n: int) -> str:
    """The Parquet files' rows saved by ``datasets``' own ``save_to_disk``
    (written once): what ``load_from_disk`` and ArrowDataset read."""
    import datasets

    directory = DATA / f"arrow-{n}"
    if not (directory / "state.json").exists():
        datasets.disable_progress_bars()
        rows = datasets.Dataset.from_parquet(files, cache_dir=str(DATA / "hf-cache"))
        rows.save_to_disk(str(directory), num_shards=FILES)
    return str(directory)


# ---------------------------------------------------------------- one configuration (subprocess)


def _hf_transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {"image": [train_transform(img) for img in batch["image"]], "label": batch["label"]}


def _hub_image(cell: dict[str, Any]) -> Any:
    """A hub image cell (``{"bytes", "path"}``) opened as ``datasets``'
    ``Image()`` feature opens it for ``_hf_transform``: Pillow, loaded."""
    from PIL import Image

    image = Image.open(io.BytesIO(cell["bytes"]))
    image.load()
    return image


def _litdata_transform(row: dict[str, Any]) -> dict[str, Any]:
    return {"image": train_transform(_hub_image(row["image"])), "label": row["label"]}


def _ray_transform(batch: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    images = [train_transform(_hub_image(cell)).numpy() for cell in batch["image"]]
    return {"image": np.stack(images), "label": batch["label"]}


def _litdata_loader(files: list[str], workers: int) -> Any:
    """LitData over the Parquet files where they lie: ``index_parquet_dataset``
    writes their ``index.json`` (once, before any epoch), then
    ``StreamingDataset`` reads them with its ``ParquetLoader``."""
    from litdata import StreamingDataLoader, StreamingDataset, index_parquet_dataset
    from litdata.streaming.item_loader import ParquetLoader

    directory = Path(files[0]).parent
    assert sorted(str(p) for p in directory.glob("*.parquet")) == sorted(files)
    if not (directory / "index.json").exists():
        index_parquet_dataset(str(directory))
    ds = StreamingDataset(
        str(directory),
        item_loader=ParquetLoader(),
        shuffle=True,
        item_shuffle_window="full",
        transform=_litdata_transform,
    )
    # LitData refuses fork with its ParquetLoader (Polars' threads) and names
    # spawn or forkserver: forkserver starts workers sooner. They are not
    # persistent, so that each epoch's workers take that epoch's shuffle.
    context = "forkserver" if workers else None
    return StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=workers, shuffle=True, multiprocessing_context=context
    )


def _ray_loader(files: list[str], cores: int) -> Any:
    """Ray Data: ``read_parquet``, an exact global ``random_shuffle`` drawn
    anew each epoch, ``map_batches`` with the Pillow transform, torch batches.
    The four small files read as one block, which the shuffle keeps: split
    into blocks of a batch, the map runs on every core and streams. Ray
    starts here on ``cores`` CPUs with a 1 GiB object store; its worker
    processes find this folder's modules through PYTHONPATH."""
    import ray

    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(
        num_cpus=cores,
        include_dashboard=False,
        object_store_memory=2**30,
        log_to_driver=False,
    )
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = (
        ray.data.read_parquet(files)
        .random_shuffle(seed=ray.data.RandomSeedConfig(seed=0, reseed_after_execution=True))
        .repartition(target_num_rows_per_block=BATCH)
        .map_batches(_ray_transform, batch_size=BATCH)
    )
    return ds.iter_torch_batches(batch_size=BATCH)


def worker(config: dict[str, Any]) -> None:
    import torch

    kind, workers = config["kind"], config["workers"]
    opts: dict[str, Any] = {
        "size": (224, 224),
        "crop": "random_resized",
        "flip": True,
        "normalize": (MEAN, STD),
        "dtype": torch.float16,
    }
    generator = torch.Generator().manual_seed(0)
    loader: Any
    job = config.get("job", "train")
    if kind == "arrow":
        import chute

        ds: Any = chute.ArrowDataset(
            config["urls"],
            ["image", "label"],
            decode="torchrgb8",
            **(opts if job == "train" else {}),
        )
        loader = chute.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    elif kind == "hf-arrow":
        import datasets

        datasets.disable_progress_bars()
        saved = datasets.load_from_disk(config["urls"])
        ds = saved.with_transform(_hf_transform) if job == "train" else saved.with_format("torch")
        loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    elif kind == "parquet":
        import chute

        ds = chute.ParquetDataset(
            config["urls"],
            ["image", "label"],
            decode="torchrgb8",
            storage_options=config.get("storage_options"),
            **opts,
        )
        loader = chute.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    elif kind in ("parquet-stream", "tar-stream"):
        import chute

        if kind == "parquet-stream":
            stream: Any = chute.ParquetStream(
                config["urls"],
                ["image", "label"],
                shardshuffle=True,
                seed=0,
                storage_options=config.get("storage_options"),
            )
            fields = ("image", "label")
        else:
            stream = chute.wds.WebDataset(config["urls"], shardshuffle=True, seed=0)
            fields = ("jpg", "cls")
        stream = (
            stream.shuffle(STREAM_BUFFER)
            .decode("torchrgb8", **opts)
            .to_tuple(*fields)
            .batched(BATCH)
        )
        loader = chute.DataLoader(stream, batch_size=None, num_workers=workers)
    elif kind == "tar":
        import chute

        ds = chute.TarDataset(config["urls"], "torchrgb8", ("jpg", "cls"), **opts)
        loader = chute.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    elif kind == "litdata":
        loader = _litdata_loader(config["urls"], workers)
    elif kind == "ray":
        loader = _ray_loader(config["urls"], workers)
    else:
        import datasets

        datasets.disable_progress_bars()
        ds = datasets.Dataset.from_parquet(
            config["urls"], cache_dir=str(DATA / "hf-cache")
        ).with_transform(_hf_transform)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=generator
        )
    gc.collect()
    epochs = []
    first = None
    for _ in range(2):
        start = time.perf_counter()
        cpu = time.process_time()
        samples = 0
        for batch in loader:
            images = batch["image"] if isinstance(batch, dict) else batch[0]
            if first is None:
                first = time.perf_counter() - start
                if job == "train":
                    assert images.dtype == torch.float16
                    assert tuple(images.shape[1:]) == (3, 224, 224)
                else:
                    assert images.dtype == torch.uint8
                    assert images.shape[1] == 3 or images.shape[-1] == 3  # CHW or HWC
            samples += len(images)
        epochs.append(
            {
                "samples": samples,
                "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu,
            }
        )
    if kind == "ray":
        import ray

        ray.shutdown()
    print(json.dumps({"epochs": epochs, "first_batch_seconds": first}))


# ---------------------------------------------------------------- the parent


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="500 images instead of 1,000")
    parser.add_argument(
        "--images",
        type=int,
        help="images written (default 1,000): more row groups, so "
        "the first batch's wait on every row group weighs less in part (b)'s one epoch",
    )
    parser.add_argument(
        "--part",
        choices=("a", "streams", "b", "arrow"),
        help="run part (a), its stream rows, part (b) or the Arrow part only (default: all)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="part (b): rounds of local / S3 +20 ms / S3 direct, alternating (median reported)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.serve:
        serve(json.loads(args.serve))
        return
    n = args.images or (500 if args.quick else 1000)
    tar = shards(n)
    files = parquet_files(tar, n)
    script = str(Path(__file__).resolve())
    cores = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []

    def measure(label: str, config: dict[str, Any], timed_epoch: int) -> dict[str, Any]:
        report = run_config(script, config)
        epoch = report["epochs"][timed_epoch]
        row = {
            "config": label,
            "workers": config["workers"],
            "timed_epoch": timed_epoch + 1,
            "samples": epoch["samples"],
            "samples_per_s": epoch["samples"] / epoch["seconds"],
            "cpu_s": epoch["cpu_seconds"],
            "first_batch_s": report["first_batch_seconds"],
            "peak_rss_mib": report["peak_tree_rss"] / 2**20,
            "load_average": os.getloadavg()[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    def measure_peer(module: str, label: str, config: dict[str, Any]) -> dict[str, Any]:
        """`measure`, or a row saying why the peer loader was not measured."""
        reason = None
        if importlib.util.find_spec(module) is None:
            reason = f"{module} is not installed"
        else:
            try:
                return measure(label, config, 1)
            except RuntimeError as error:
                reason = str(error).strip().splitlines()[-1]
        row = {"config": f"{label}: not measured: {reason}", "workers": config["workers"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    summary: dict[str, Any] = {"images": n}
    if args.part in (None, "a"):
        chute_parquet = measure(
            "chute, Parquet", {"kind": "parquet", "urls": files, "workers": cores}, 1
        )
        chute_tar = measure(
            "chute, tar (TarDataset)", {"kind": "tar", "urls": tar, "workers": cores}, 1
        )
        hf = [
            measure("datasets + torch DataLoader", {"kind": "hf", "urls": files, "workers": w}, 1)
            for w in (0, 1, 2)
        ]
        best_hf = max(hf, key=lambda r: r["samples_per_s"])
        peers = [best_hf]
        litdata_rows = [
            measure_peer(
                "litdata",
                "LitData (ParquetLoader) + StreamingDataLoader",
                {"kind": "litdata", "urls": files, "workers": w},
            )
            for w in (0, 1, 2)
        ]
        peers += [max(litdata_rows, key=lambda r: r.get("samples_per_s", 0.0))]
        peers.append(
            measure_peer(
                "ray",
                "Ray Data (read_parquet, random_shuffle, map_batches)",
                {"kind": "ray", "urls": files, "workers": cores},
            )
        )
        best_peer = max(peers, key=lambda r: r.get("samples_per_s", 0.0))
        summary.update(
            parquet_over_tar=chute_parquet["samples_per_s"] / chute_tar["samples_per_s"],
            parquet_over_best_datasets=chute_parquet["samples_per_s"] / best_hf["samples_per_s"],
            best_datasets_workers=best_hf["workers"],
            parquet_over_best_peer=chute_parquet["samples_per_s"] / best_peer["samples_per_s"],
            best_peer=f"{best_peer['config']}, {best_peer['workers']} workers",
            peer_versions=peer_versions(),
        )
    if args.part in (None, "streams"):
        parquet_stream = measure(
            "chute, Parquet stream (ParquetStream)",
            {"kind": "parquet-stream", "urls": files, "workers": cores},
            1,
        )
        tar_stream = measure(
            "chute, tar stream (WebDataset)",
            {"kind": "tar-stream", "urls": tar, "workers": cores},
            1,
        )
        summary["parquet_stream_over_tar_stream"] = (
            parquet_stream["samples_per_s"] / tar_stream["samples_per_s"]
        )
    if args.part in (None, "b"):
        summary.update(part_b(script, files, cores, measure, args.rounds))
    if args.part in (None, "arrow"):
        saved = saved_directory(files, n)
        for job, what in (("train", "train job"), ("decode", "images decoded")):
            ours = measure(
                f"chute, ArrowDataset (save_to_disk), {what}",
                {"kind": "arrow", "urls": saved, "workers": cores, "job": job},
                1,
            )
            peer = "with_transform (Pillow)" if job == "train" else 'with_format("torch")'
            theirs = [
                measure(
                    f"datasets load_from_disk + {peer} + torch DataLoader, {what}",
                    {"kind": "hf-arrow", "urls": saved, "workers": w, "job": job},
                    1,
                )
                for w in (0, 1, 2)
            ]
            best = max(theirs, key=lambda r: r["samples_per_s"])
            summary[f"arrow_over_best_datasets_{job}"] = (
                ours["samples_per_s"] / best["samples_per_s"]
            )
            summary[f"best_datasets_workers_arrow_{job}"] = best["workers"]
            if job == "train":
                parquet = measure(
                    "chute, ParquetDataset (the same rows), train job",
                    {"kind": "parquet", "urls": files, "workers": cores},
                    1,
                )
                summary["arrow_over_parquet_train"] = (
                    ours["samples_per_s"] / parquet["samples_per_s"]
                )
    summary["targets"] = {
        "parquet_over_tar": 0.95,
        "parquet_stream_over_tar_stream": 0.95,
        "parquet_over_best_datasets": 3.0,
        "parquet_over_best_peer": 3.0,
        "s3_over_local": 0.9,
        "stream_s3_over_local": 0.9,
    }
    print()
    print(
        table(
            rows,
            [
                ("config", "configuration"),
                ("workers", "workers"),
                ("timed_epoch", "epoch"),
                ("samples_per_s", "samples/s"),
                ("first_batch_s", "first batch s"),
                ("cpu_s", "loader CPU s"),
                ("server_cpu_s", "server CPU s"),
                ("peak_rss_mib", "peak RSS MiB"),
                ("load_average", "load"),
            ],
        )
    )
    print()
    print(json.dumps(summary, indent=2))
    load = os.getloadavg()
    name = "parquet" if args.images is None else f"parquet_{n}"
    if args.part is not None:
        name += f"_part_{args.part}"
    path = save(
        name,
        {"quick": args.quick, "load_average_at_end": list(load), "rows": rows, "summary": summary},
    )
    print(f"saved {path} (load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")


def peer_versions() -> dict[str, str | None]:
    """The installed versions of the loaders part (a) compares against."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("datasets", "litdata", "ray", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def part_b(
    script: str, files: list[str], cores: int, measure: Any, rounds: int
) -> dict[str, float]:
    """(b) Parquet over S3 behind the +20 ms proxy, against local files and
    against the same S3 server without the proxy, in `rounds` alternating
    rounds (each ratio is the median round's)."""
    servers = subprocess.Popen(
        [sys.executable, script, "--serve", json.dumps({"parquet": files})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    urls = [f"s3://{BUCKET}/parquet/{Path(p).name}" for p in files]
    ratios: dict[str, list[float]] = {}
    try:
        assert servers.stdout is not None
        endpoints = json.loads(servers.stdout.readline())
        where = {
            "local": (files, None),
            "s3 +20 ms": (urls, {"endpoint": endpoints["proxies"][LATENCY], **CREDENTIALS}),
            "s3 direct": (urls, {"endpoint": endpoints["endpoint"], **CREDENTIALS}),
        }
        for round_ in range(rounds):
            for kind, name in (("parquet", "ParquetDataset"), ("parquet-stream", "ParquetStream")):
                rate: dict[str, dict[str, Any]] = {}
                for place, (place_urls, storage) in where.items():
                    serving = cpu_seconds(servers.pid)
                    config = {"kind": kind, "urls": place_urls, "workers": cores}
                    if storage is not None:
                        config["storage_options"] = storage
                    label = f"chute, {name}, {place} (epoch 1, round {round_ + 1})"
                    row = measure(label, config, 0)
                    if storage is not None:
                        # The server's CPU from the loader's start: its footer reads included.
                        row["server_cpu_s"] = cpu_seconds(servers.pid) - serving
                    rate[place] = row
                prefix = "" if kind == "parquet" else "stream_"
                local = rate["local"]["samples_per_s"]
                s3 = rate["s3 +20 ms"]
                ratios.setdefault(f"{prefix}s3_over_local", []).append(s3["samples_per_s"] / local)
                ratios.setdefault(f"{prefix}s3_direct_over_local", []).append(
                    rate["s3 direct"]["samples_per_s"] / local
                )
                ratios.setdefault(f"{prefix}s3_over_s3_direct", []).append(
                    s3["samples_per_s"] / rate["s3 direct"]["samples_per_s"]
                )
                # The S3 epoch's CPU work (the loader's and the server's) spread
                # over every core without a gap: no S3 epoch on these cores is shorter.
                fastest = (s3["cpu_s"] + s3["server_cpu_s"]) / cores
                local_seconds = rate["local"]["samples"] / local
                ratios.setdefault(f"{prefix}s3_over_local_cpu_bound", []).append(
                    min(1.0, local_seconds / fastest)
                )
    finally:
        assert servers.stdin is not None
        servers.stdin.close()
        servers.wait(timeout=60)
    out: dict[str, Any] = {name: sorted(v)[len(v) // 2] for name, v in ratios.items()}
    out["rounds"] = {name: [round(x, 3) for x in v] for name, v in ratios.items()}
    return out


if __name__ == "__main__":
    main()
