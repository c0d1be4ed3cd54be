"""``chute doctor``: reads files as ``chute bench`` does (the loader of
their data kind, ``chute.kinds``, with the same decode options), for an
epoch or ``--limit`` samples, with an optional simulated training step,
and prints what limits the loader's speed and what to change
(``loader.diagnose()``)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

from chute.cli import bench, remote
from chute.cli.common import EXIT_OK, UsageError, expand
from chute.cli.kinds import add_kind_argument, check_options, kind_for, openable_plurals, resolved
from chute.kinds import OpenSpec


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--workers takes 'auto' or a count >= 0, not {text!r}")
    return value


def run(args: argparse.Namespace, out: TextIO) -> int:
    if not args.paths:
        raise UsageError(f"doctor needs at least one path ({openable_plurals()})")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, not {args.batch_size}")
    from chute.decoding.decoders import IMAGE_SPECS

    decode = args.decode.lower()
    if decode not in ("", "raw") and decode not in IMAGE_SPECS:
        raise UsageError(
            f"--decode {args.decode!r}: use 'raw', '' (no image decoding) or one of "
            + ", ".join(sorted(IMAGE_SPECS))
        )
    remote.configure(args)
    paths = expand(args.paths)
    kind = kind_for(paths, args.kind, "doctor")
    options = remote.options()
    spec = OpenSpec(
        paths=resolved(paths),
        batch_size=args.batch_size,
        workers=args.workers,
        decode=decode,
        image_options=bench._image_options(args, decode),
        fields=args.to_tuple.replace(",", " ").split(),
        columns=args.columns.replace(",", " ").split(),
        storage_options=dict(options.storage_options),
        cache_dir=options.cache_dir,
    )
    check_options(kind, spec)
    from chute.loader.dataloader import DataLoader
    from chute.loader.diagnose import format_report

    _, loader = kind.bench_loader(spec)
    if not isinstance(loader, DataLoader):
        raise UsageError(f"{kind.name}: its loader is not chute.DataLoader, which diagnoses")
    step = args.step_ms / 1e3
    samples = 0
    report: dict[str, Any] | None = None
    start = time.perf_counter()
    for batch in loader:
        samples += bench._batch_len(batch)
        if step:
            time.sleep(step)
        if args.limit and samples >= args.limit:
            # Now, while the iteration runs: the figures stop at this batch.
            report = loader.diagnose()
            break
    seconds = time.perf_counter() - start
    if report is None:
        report = loader.diagnose()
    if args.json:
        json.dump(
            {"kind": kind.name, "samples": samples, "seconds": seconds, **report}, out, indent=2
        )
        out.write("\n")
        return EXIT_OK
    step_text = f", a {args.step_ms:g} ms step per batch" if step else ""
    print(f"chute doctor ({kind.name}): {samples} samples in {seconds:.2f} s{step_text}", file=out)
    print(format_report(report), file=out)
    return EXIT_OK


def register(sub: Any) -> None:
    """Adds the ``doctor`` command to the subparsers `sub`."""
    p = sub.add_parser(
        "doctor",
        help=f"read {openable_plurals()} with chute and say what limits its speed",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help=f"{openable_plurals()}: files or urls")
    add_kind_argument(p)
    p.add_argument(
        "--batch-size", type=int, default=64, metavar="N", help="samples per batch (default 64)"
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        metavar="N",
        help="num_workers: native threads, or 'auto' (default)",
    )
    p.add_argument("--decode", default="", metavar="SPEC", help="as chute bench --decode")
    p.add_argument("--to-tuple", default="", metavar="KEYS", help="as chute bench --to-tuple")
    p.add_argument("--columns", default="", metavar="NAMES", help="Parquet: the columns to read")
    p.add_argument("--size", nargs="+", default=[], metavar="H W", help="decode(size=(H, W))")
    p.add_argument("--crop", choices=["center", "random", "none", "random_resized"])
    p.add_argument("--resize", type=int, default=0, metavar="N", help="decode(resize=N)")
    p.add_argument("--flip", action="store_true", help="decode(flip=True)")
    p.add_argument(
        "--normalize",
        default="",
        metavar="MEAN/STD",
        help="decode(normalize=...): 'imagenet' or lists",
    )
    p.add_argument("--dtype", choices=["uint8", "float32", "float16", "bfloat16"])
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="a training step of MS milliseconds per batch (a sleep), as your loop's would take",
    )
    p.add_argument("--limit", type=int, default=0, metavar="N", help="stop after about N samples")
    p.add_argument("--json", action="store_true", help="the whole report as JSON")
    remote.add_arguments(p)
    p.set_defaults(func=run, compare=False)
