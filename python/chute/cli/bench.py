"""``chute bench``: reads files with the loader of their data kind
(``chute.kinds``: tar shards streamed by ``WebDataset``, Parquet files read
by ``ParquetDataset``, or the kind ``--kind`` names) and, to compare, the
loader another library offers over the same data (torch's DataLoader over
webdataset), each in a fresh interpreter, and reports samples/s, MB/s, time
to the first batch and peak RSS."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, TextIO

from chute.cli import remote
from chute.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, expand
from chute.cli.kinds import (
    add_kind_argument,
    check_options,
    kind_for,
    openable_kinds,
    openable_plurals,
    resolved,
)
from chute.common.rss import PeakRss
from chute.kinds import DataKind, OpenSpec, kind_named

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


def _decode_limit(kind: DataKind, spec: OpenSpec) -> dict[str, Any]:
    """The codec alone on this machine: one thread decoding the files' own
    images from memory again and again (no reading, no Python between
    images), times the cores. No loader decoding full-size images on these
    cores goes faster."""
    from chute import _core

    assert kind.files is not None
    images = kind.files.images(spec.paths, spec.columns, DECODE_LIMIT_IMAGES)
    if not images:
        raise UsageError("--decode-limit: no JPEG, PNG or WebP image found in the files")
    per_core = float(_core.decode_loop(images, DECODE_LIMIT_SECONDS))
    cores = os.cpu_count() or 1
    return {"images": len(images), "per_core": per_core, "cores": cores, "limit": per_core * cores}


def _run_one(config: dict[str, Any]) -> dict[str, Any]:
    """Reads the files once with one loader and measures it (in this process)."""
    kind = kind_named(config["kind"])
    spec = OpenSpec.from_json(config["spec"])
    if config["loader"] == "reference":
        found = kind.reference_loader(spec)
        assert found is not None, f"{kind.name} has no reference loader"
        label, loader = found
    else:
        label, loader = kind.bench_loader(spec)
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
    # Input bytes: the whole files when read to the end, else pro rata.
    total_bytes = config["bytes"]
    if limit and samples >= limit and config["total"]:
        total_bytes = int(total_bytes * samples / config["total"])
    return {
        "loader": label,
        "workers": spec.workers,
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
        what = config["kind"] if config["loader"] == "chute" else f"{config['kind']}'s reference"
        raise RuntimeError(f"{what} run failed (exit {proc.returncode})")
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
        raise UsageError(f"bench needs at least one path ({openable_plurals()})")
    from chute.decoding.decoders import IMAGE_SPECS

    remote.configure(args)
    paths = expand(args.paths)
    kind = kind_for(paths, args.kind, "bench")
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
    options = remote.options()
    spec = OpenSpec(
        paths=resolved(paths),
        batch_size=args.batch_size,
        workers=args.workers,
        decode=decode.lower(),
        image_options=_image_options(args, decode.lower()),
        # Fields as webdataset's to_tuple takes them in one string ("jpg
        # cls"), or comma-separated ("jpg,cls"); ";" separates alternatives.
        fields=args.to_tuple.replace(",", " ").split(),
        columns=args.columns.replace(",", " ").split(),
        storage_options=dict(options.storage_options),
        cache_dir=options.cache_dir,
    )
    check_options(kind, spec)
    if args.compare:
        problem = kind.reference_problem(spec)
        if problem is not None:
            raise UsageError(problem)
    assert kind.files is not None
    targets = [remote.target(p) for p in paths]
    config: dict[str, Any] = {
        "kind": kind.name,
        "spec": spec.as_json(),
        "bytes": sum(t.size() for t in targets),
        "limit": args.limit,
        "total": kind.files.indexed_count(targets),
        "progress": not args.no_progress,
    }
    loaders = ["chute", "reference"] if args.compare else ["chute"]
    results = []
    for loader in loaders:
        try:
            results.append(_run_in_subprocess({**config, "loader": loader}))
        except RuntimeError as exc:
            print(f"chute bench: {exc}", file=sys.stderr)
            return EXIT_PROBLEMS
    limit = _decode_limit(kind, spec) if args.decode_limit else None
    if limit is not None:
        for r in results:
            r["decode_limit_per_s"] = limit["limit"]
    if args.json:
        json.dump(results, out, indent=2)
        out.write("\n")
        return EXIT_OK
    width = max(18, *(len(r["loader"]) for r in results))
    header = f"{'loader':<{width}} {'workers':>7} {'samples':>9} {'samples/s':>11} {'MB/s':>8}"
    header += f" {'first batch':>12} {'peak RSS':>10}"
    print(header, file=out)
    for r in results:
        first = "-" if r["first_batch_s"] is None else f"{r['first_batch_s']:.3f} s"
        print(
            f"{r['loader']:<{width}} {r['workers']:>7} {r['samples']:>9}"
            f" {r['samples_per_s']:>11,.0f} {r['mb_per_s']:>8.1f} {first:>12}"
            f" {r['peak_rss_mib']:>6.0f} MiB",
            file=out,
        )
    if len(results) == 2 and results[1]["samples_per_s"] > 0:
        ratio = results[0]["samples_per_s"] / results[1]["samples_per_s"]
        print(f"chute / {results[1]['loader']}: {ratio:.2f}x samples/s", file=out)
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
        help=f"read {openable_plurals()} with chute (and a reference loader), and time it",
        formatter_class=_HelpFormatter,
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help=f"{openable_plurals()}: files or urls (tar shards: also pipe: commands)",
    )
    add_kind_argument(p)
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
        help="tar shards: the to_tuple fields, space- or comma-separated ('jpg;png cls' or"
        " jpg,cls)",
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
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run the kind's reference loader ("
        + ", ".join(f"{k.name}: {k.reference_label}" for k in openable_kinds() if k.reference_label)
        + ")",
    )
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
