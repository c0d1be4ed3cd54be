"""``chute bench``: streams tar shards with chute (and, to compare, torch's
DataLoader over webdataset), or reads Parquet files with chute's
ParquetDataset, each in a fresh interpreter, and reports samples/s, MB/s,
time to the first batch and peak RSS."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, TextIO

from chute.cli import remote
from chute.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, expand
from chute.cli.kinds import kind_of
from chute.common.rss import PeakRss

# How many of the files' images, and for how long, the decode limit times.
DECODE_LIMIT_IMAGES = 200
DECODE_LIMIT_SECONDS = 2.0


class _Progress:
    """tqdm when installed, else one self-overwriting stderr line."""

    def __init__(self, label: str, total: int | None, enabled: bool) -> None:
        self.enabled = enabled
        self.count = 0
        self._bar: Any = None
        self._start = time.perf_counter()
        self._last = 0.0
        self.label = label
        self.total = total
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=label, unit="sample", unit_scale=True, file=sys.stderr)

    def update(self, n: int) -> None:
        self.count += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.perf_counter()
        if now - self._last >= 0.5:
            self._last = now
            self._show()

    def _show(self) -> None:
        # Redrawn in place on a terminal; a line per update elsewhere (a
        # log file, a pipe), where carriage returns would run them together.
        rate = self.count / max(time.perf_counter() - self._start, 1e-9)
        of = f"/{self.total}" if self.total else ""
        line = f"{self.label}: {self.count}{of} samples, {rate:,.0f}/s"
        sys.stderr.write(f"\r{line} " if sys.stderr.isatty() else f"{line}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self._show()  # the count reached, not the last tick's
            if sys.stderr.isatty():
                sys.stderr.write("\n")
            sys.stderr.flush()


def _batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        value = batch.get("__key__", next(iter(batch.values()), []))
        return len(value)
    if isinstance(batch, (tuple, list)) and batch:
        return len(batch[0])
    return len(batch)


def _known_sample_count(paths: list[str]) -> int | None:
    """From sidecar indexes, when every shard has a current one (for the bar's total)."""
    from chute.sources.tarindex import read_index

    total = 0
    for p in paths:
        try:
            total += len(read_index(p)["samples"])
        except (OSError, ValueError):
            return None
    return total


def _parquet_rows(paths: list[str]) -> int | None:
    """The rows of Parquet files, from their footers (for the bar's total)."""
    from chute.datasets.parquet import ParquetDataset

    try:
        return len(ParquetDataset(paths, remote=remote.options()))
    except (OSError, ValueError):
        return None


def _image_payloads(paths: list[str], kind: str, columns: list[str], count: int) -> list[bytes]:
    """Up to `count` encoded images that the native decoders read (JPEG, PNG,
    WebP), from the first of the local `paths` that hold them."""
    from chute import _core
    from chute.decoding.extensions import NATIVE_IMAGE_EXTENSIONS, last_extension

    def decodable(data: bytes) -> bool:
        try:
            _core.probe_image(data)
        except _core.DataError:
            return False
        return True

    found: list[bytes] = []
    for path in paths:
        if kind == "tar":
            with tarfile.open(path) as tar:
                for member in tar:
                    if len(found) == count:
                        return found
                    if member.isfile() and (
                        last_extension(member.name).lower() in NATIVE_IMAGE_EXTENSIONS
                    ):
                        f = tar.extractfile(member)
                        data = f.read() if f is not None else b""
                        if decodable(data):
                            found.append(data)
            continue
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path).read_row_group(0, columns=columns or None)
        for column in table.columns:
            for value in column.to_pylist():
                if isinstance(value, dict):  # the hub's image struct
                    value = value.get("bytes")
                if isinstance(value, bytes) and decodable(value):
                    found.append(value)
                    if len(found) == count:
                        return found
    return found


def _decode_limit(paths: list[str], kind: str, columns: list[str]) -> dict[str, Any]:
    """The codec alone on this machine: one thread decoding the files' own
    images from memory again and again (no reading, no Python between
    images), times the cores. No loader decoding full-size images on these
    cores goes faster."""
    from chute import _core

    images = _image_payloads(paths, kind, columns, DECODE_LIMIT_IMAGES)
    if not images:
        raise UsageError("--decode-limit: no JPEG, PNG or WebP image found in the files")
    per_core = float(_core.decode_loop(images, DECODE_LIMIT_SECONDS))
    cores = os.cpu_count() or 1
    return {"images": len(images), "per_core": per_core, "cores": cores, "limit": per_core * cores}


class ResizeCrop:
    """What ``decode(spec, size=(h, w))`` does in chute, for the webdataset
    side of ``--compare``: each decoded image (a torch CHW or numpy HWC
    array) resized on its shorter side and cropped to (h, w) at the centre,
    antialiased bilinear, so that both loaders do the same work."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = size

    def _image(self, value: Any) -> Any:
        import numpy as np
        import torch
        import torch.nn.functional as F

        if isinstance(value, np.ndarray) and value.ndim == 3:
            return self._image(torch.from_numpy(value).permute(2, 0, 1)).permute(1, 2, 0).numpy()
        if not isinstance(value, torch.Tensor) or value.ndim != 3:
            return value
        h, w = self.size
        scale = max(h / value.shape[1], w / value.shape[2])
        rh, rw = max(h, round(value.shape[1] * scale)), max(w, round(value.shape[2] * scale))
        out = F.interpolate(value[None].float(), size=(rh, rw), mode="bilinear", antialias=True)[0]
        top, left = (rh - h) // 2, (rw - w) // 2
        out = out[:, top : top + h, left : left + w]
        return out.round().clamp(0, 255).to(value.dtype) if value.dtype == torch.uint8 else out

    def __call__(self, sample: Any) -> Any:
        if isinstance(sample, dict):
            return {k: self._image(v) for k, v in sample.items()}
        return tuple(self._image(v) for v in sample)


def _build_pipeline(module: Any, config: dict[str, Any]) -> Any:
    remote_kwargs: dict[str, Any] = {}
    if config["loader"] == "chute" and config["storage_options"]:
        remote_kwargs["storage_options"] = config["storage_options"]
    if config["loader"] == "chute" and config["cache_dir"]:
        remote_kwargs["cache_dir"] = config["cache_dir"]
    ds = module.WebDataset(config["paths"], shardshuffle=False, **remote_kwargs)
    decode = config["decode"]
    if decode != "raw":
        specs = (decode,) if decode else ()
        opts = config["image_options"]
        if module.__name__.startswith("chute"):
            ds = ds.decode(*specs, **opts)
        else:
            # --compare takes --size alone (see _image_options): webdataset's
            # decode, then the same resize and centre crop.
            ds = ds.decode(*specs)
            if "size" in opts:
                ds = ds.map(ResizeCrop(tuple(opts["size"])))
    if config["to_tuple"]:
        ds = ds.to_tuple(*config["to_tuple"])
    return ds.batched(config["batch_size"])


def _parquet_loader(config: dict[str, Any]) -> Any:
    """chute.DataLoader over a ParquetDataset of the files, in order."""
    from chute.datasets.parquet import ParquetDataset
    from chute.loader.dataloader import DataLoader

    decode = config["decode"]
    ds = ParquetDataset(
        config["paths"],
        columns=config["columns"] or None,
        decode=decode if decode not in ("", "raw") else None,
        storage_options=config["storage_options"] or None,
        cache_dir=config["cache_dir"],
        **config["image_options"],
    )
    return DataLoader(ds, batch_size=config["batch_size"], num_workers=config["workers"])


def _run_one(config: dict[str, Any]) -> dict[str, Any]:
    """Streams the shards once with one loader and measures it (in this process)."""
    import torch.utils.data

    module: Any
    loader_cls: Any
    if config.get("kind") == "parquet":
        loader, label = _parquet_loader(config), "chute (parquet)"
    elif config["loader"] == "chute":
        import chute.wds
        from chute.loader.dataloader import DataLoader

        module, loader_cls, label = chute.wds, DataLoader, "chute"
    else:
        import webdataset

        module, loader_cls, label = webdataset, torch.utils.data.DataLoader, "torch+webdataset"
    if config.get("kind") != "parquet":
        loader = loader_cls(
            _build_pipeline(module, config), batch_size=None, num_workers=config["workers"]
        )
    progress = _Progress(label, config["total"], config["progress"])
    samples = 0
    first: float | None = None
    limit = config["limit"]
    with PeakRss() as rss:
        start = time.perf_counter()
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            n = _batch_len(batch)
            samples += n
            progress.update(n)
            if limit and samples >= limit:
                break
        seconds = time.perf_counter() - start
    progress.close()
    # Input bytes: the whole shards when read to the end, else pro rata.
    total_bytes = config["bytes"]
    if limit and samples >= limit and config["total"]:
        total_bytes = int(total_bytes * samples / config["total"])
    return {
        "loader": label,
        "workers": config["workers"],
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "mb_per_s": total_bytes / 1e6 / seconds if seconds > 0 else 0.0,
        "first_batch_s": first,
        "peak_rss_mib": rss.peak / 2**20,
    }


def _run_in_subprocess(config: dict[str, Any]) -> dict[str, Any]:
    # Each loader runs in a fresh interpreter so that its peak RSS and its
    # start-up (first batch) are its own, not left over from the other.
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "bench", "--_config", json.dumps(config)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{config['loader']} run failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _image_options(args: argparse.Namespace, decode: str) -> dict[str, Any]:
    """decode()'s image options from the flags (only those given), checked."""
    from chute.decoding.image_options import image_options

    opts: dict[str, Any] = {}
    try:
        if args.size:
            opts["size"] = _size(args.size)
        if args.crop:
            opts["crop"] = args.crop
        if args.resize:
            opts["resize"] = args.resize
        if args.flip:
            opts["flip"] = True
        if args.normalize:
            if args.normalize == "imagenet":
                opts["normalize"] = _IMAGENET
            else:
                mean, std = args.normalize.split("/")
                opts["normalize"] = (
                    [float(v) for v in mean.split(",")],
                    [float(v) for v in std.split(",")],
                )
        if args.dtype:
            opts["dtype"] = args.dtype
        if opts:
            if decode in ("", "raw"):
                raise ValueError(
                    "--size, --crop, --resize, --flip, --normalize and --dtype "
                    "need an image spec: --decode torchrgb8 (for example)"
                )
            image_options(decode, **opts)
    except ValueError as exc:
        raise UsageError(f"image options: {exc}") from None
    if set(opts) - {"size"} and args.compare:
        raise UsageError(
            "--compare runs webdataset's own decode, which has none of chute's image options "
            "but --size (resized and centre-cropped after it); "
            "benchmarks/bench_transforms.py compares them with Pillow-based transforms"
        )
    # JSON carries tuples as lists; decode() takes either.
    return opts


def _size(words: list[str]) -> tuple[int, int]:
    """--size as (height, width): ``H W``, ``H,W``, ``HxW`` or ``N`` (square)."""
    text = " ".join(words).replace(",", " ").replace("x", " ")
    try:
        parts = [int(v) for v in text.split()]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) < 1:
        raise ValueError(
            f"--size needs one or two positive numbers (H W, H,W or N), not {' '.join(words)!r}"
        )
    return (parts[0], parts[-1])


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args._config:
        from chute._core import DataError, ReadError

        try:
            print(json.dumps(_run_one(json.loads(args._config))))
        except (DataError, ReadError) as exc:
            message = str(exc)
            if "set an output size" in message:
                message += "; with chute bench: --size H W"
            print(f"chute bench: {message}", file=sys.stderr)
            return EXIT_PROBLEMS
        return EXIT_OK
    if len(args.size) > 2:
        # argparse gives --size every word up to the next option.
        raise UsageError(
            f"--size takes H W, H,W or N, not {' '.join(args.size)!r}: "
            "give the shard paths before --size"
        )
    if not args.paths:
        raise UsageError("bench needs at least one tar shard or Parquet file")
    from chute.decoding.decoders import IMAGE_SPECS

    remote.configure(args)
    paths = expand(args.paths)
    kind = kind_of(paths[0])
    for p in paths:
        if kind_of(p) != kind or kind not in ("tar", "parquet"):
            raise UsageError(
                f"{p}: bench streams tar shards or reads Parquet files, all of one kind "
                f"(the first is {kind}); this is not one"
            )
    if kind == "parquet" and args.compare:
        raise UsageError(
            "--compare runs webdataset over tar shards; benchmarks/bench_parquet.py compares "
            "Parquet with Hugging Face datasets"
        )
    if kind != "parquet" and args.columns:
        raise UsageError("--columns goes with Parquet files (tar shards take --to-tuple)")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, not {args.batch_size}")
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, not {args.workers}")
    decode = args.decode
    if decode not in ("", "raw") and decode.lower() not in IMAGE_SPECS:
        raise UsageError(
            f"--decode {decode!r}: use 'raw', '' (no image decoding) or one of "
            + ", ".join(sorted(IMAGE_SPECS))
        )
    if args.decode_limit and (
        decode.lower() not in IMAGE_SPECS or any(map(remote.is_remote, paths))
    ):
        raise UsageError(
            "--decode-limit times the codec on the files' images: it needs --decode SPEC "
            "(an image spec) and local files"
        )
    if args.compare:
        try:
            import webdataset  # noqa: F401
        except ImportError as exc:
            raise UsageError(
                "--compare needs webdataset installed (pip install webdataset)"
            ) from exc
        unread = [p for p in paths if remote.is_remote(p) and not p.startswith(("http:", "https:"))]
        if unread:
            raise UsageError(
                f"{unread[0]}: webdataset reads http(s) urls only (through curl); compare "
                "it on http(s) urls, or give both loaders pipe: urls"
            )
    # Fields as webdataset's to_tuple takes them in one string ("jpg cls"),
    # or comma-separated ("jpg,cls"); ";" separates alternatives ("jpg;png").
    to_tuple = args.to_tuple.replace(",", " ").split()
    image_opts = _image_options(args, decode.lower())
    config: dict[str, Any] = {
        "kind": kind,
        "columns": args.columns.replace(",", " ").split(),
        "image_options": image_opts,
        "paths": [p if remote.is_remote(p) else str(Path(p).resolve()) for p in paths],
        "bytes": sum(remote.size_of(p) for p in paths),
        "storage_options": dict(remote.options().storage_options),
        "cache_dir": remote.options().cache_dir,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "decode": decode.lower(),
        "to_tuple": to_tuple,
        "limit": args.limit,
        "total": _parquet_rows(paths) if kind == "parquet" else _known_sample_count(paths),
        "progress": not args.no_progress,
    }
    loaders = ["chute", "torch"] if args.compare else ["chute"]
    results = []
    for loader in loaders:
        try:
            results.append(_run_in_subprocess({**config, "loader": loader}))
        except RuntimeError as exc:
            print(f"chute bench: {exc}", file=sys.stderr)
            return EXIT_PROBLEMS
    limit = _decode_limit(paths, kind, config["columns"]) if args.decode_limit else None
    if limit is not None:
        for r in results:
            r["decode_limit_per_s"] = limit["limit"]
    if args.json:
        json.dump(results, out, indent=2)
        out.write("\n")
        return EXIT_OK
    header = f"{'loader':<18} {'workers':>7} {'samples':>9} {'samples/s':>11} {'MB/s':>8}"
    header += f" {'first batch':>12} {'peak RSS':>10}"
    print(header, file=out)
    for r in results:
        first = "-" if r["first_batch_s"] is None else f"{r['first_batch_s']:.3f} s"
        print(
            f"{r['loader']:<18} {r['workers']:>7} {r['samples']:>9} {r['samples_per_s']:>11,.0f}"
            f" {r['mb_per_s']:>8.1f} {first:>12} {r['peak_rss_mib']:>6.0f} MiB",
            file=out,
        )
    if len(results) == 2 and results[1]["samples_per_s"] > 0:
        ratio = results[0]["samples_per_s"] / results[1]["samples_per_s"]
        print(f"chute / torch+webdataset: {ratio:.2f}x samples/s", file=out)
    if limit is not None:
        print(
            f"decode limit: {limit['limit']:,.0f} images/s (the codec alone, full size, on"
            f" {limit['images']} of the files' images: {limit['per_core']:,.0f}/s on one core"
            f" x {limit['cores']} cores)",
            file=out,
        )
        print(f"chute / decode limit: {results[0]['samples_per_s'] / limit['limit']:.2f}", file=out)
    return EXIT_OK


class _HelpFormatter(argparse.HelpFormatter):
    """Shows --size as taking one or two numbers: argparse's own form for
    nargs="+" ("H W [H W ...]") reads as any number of pairs."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.dest == "size":
            return "H [W]"
        return super()._format_args(action, default_metavar)


def register(sub: Any) -> None:
    """Adds the ``bench`` command to the subparsers `sub`."""
    p = sub.add_parser(
        "bench",
        help="stream tar shards with chute (and torch), or read Parquet files, and time it",
        formatter_class=_HelpFormatter,
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="tar shards (files, pipe: commands or urls) or Parquet files (files or urls)",
    )
    p.add_argument(
        "--batch-size", type=int, default=64, metavar="N", help="samples per batch (default 64)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="chute: native threads; torch: worker processes",
    )
    p.add_argument(
        "--decode",
        default="",
        metavar="SPEC",
        help="webdataset image spec (e.g. torchrgb8, rgb8), '' for no image"
        " decoding, 'raw' for no decode stage at all",
    )
    p.add_argument(
        "--to-tuple",
        default="",
        metavar="KEYS",
        help="fields, space- or comma-separated ('jpg;png cls' or jpg,cls)",
    )
    p.add_argument(
        "--columns",
        default="",
        metavar="NAMES",
        help="Parquet: the columns to read, space- or comma-separated (default: all); "
        "--decode SPEC decodes the image columns among them",
    )
    p.add_argument(
        "--size",
        nargs="+",
        default=[],
        metavar="H W",
        help="decode(size=(H, W)) (also H,W, or H alone for a square): resize (shorter side) and"
        " crop decoded images to H x W, so that images of different sizes batch",
    )
    p.add_argument(
        "--crop",
        choices=["center", "random", "none", "random_resized"],
        help="decode(crop=...) with --size",
    )
    p.add_argument(
        "--resize", type=int, default=0, metavar="N", help="decode(resize=N): Resize(N) first"
    )
    p.add_argument("--flip", action="store_true", help="decode(flip=True)")
    p.add_argument(
        "--normalize",
        default="",
        metavar="MEAN/STD",
        help="decode(normalize=...): 'imagenet' or comma lists, e.g. 0.5,0.5,0.5/0.2,0.2,0.2",
    )
    p.add_argument(
        "--dtype",
        choices=["uint8", "float32", "float16", "bfloat16"],
        help="decode(dtype=...)",
    )
    p.add_argument("--compare", action="store_true", help="also run torch DataLoader + webdataset")
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        metavar="N",
        help="stop each loader after about N samples (default: read the shards to the end)",
    )
    p.add_argument(
        "--decode-limit",
        action="store_true",
        help="also time the image codec alone on the files' images (one thread from memory, "
        "times the cores): the rate no loader decoding them at full size can pass",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    remote.add_arguments(p)
    p.add_argument("--_config", help=argparse.SUPPRESS)
    p.set_defaults(func=run)
