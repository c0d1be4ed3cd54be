"""The ``chute`` command line: ``inspect``, ``index`` and ``bench``.

Exit codes: 0 success; 1 the command ran but found problems (a corrupt shard,
an incomplete sample, a file it could not index or stream); 2 bad usage (an
unknown option, a path that does not exist or is neither a tar shard nor an
HDF5 file), as argparse reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from chute.rss import PeakRss

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

# Extensions whose first payloads `inspect` decodes to show what is inside.
_IMAGE_EXTS = frozenset({"jpg", "jpeg", "png"})
_INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})


class UsageError(Exception):
    """A bad path or argument: reported as ``chute: error: ...`` with exit 2."""


# ---------------------------------------------------------------- paths


def _kind_of(path: str) -> str:
    """'tar' or 'hdf5' by content (extensions lie), else UsageError."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory (pass the shard or HDF5 files in it)")
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    # ustar magic at 257 ("ustar\0" POSIX, "ustar  " GNU); also accept an empty
    # archive (all-zero first block), which tar writes for zero members.
    if len(head) == 512 and (head[257:262] == b"ustar" or head == bytes(512)):
        return "tar"
    if path.endswith((".h5", ".hdf5", ".hdf")):
        # HDF5 may start at a 512-byte multiple (user block); let h5py decide.
        import h5py

        if h5py.is_hdf5(path):
            return "hdf5"
    raise UsageError(f"{path}: neither a tar shard nor an HDF5 file")


def _expand(paths: Sequence[str]) -> list[str]:
    from chute.shards import expand_urls

    out = expand_urls(list(paths))
    if not out:
        raise UsageError("no paths given")
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- inspect


@dataclass
class _ExtensionStats:
    members: int = 0
    bytes: int = 0


@dataclass
class TarReport:
    path: str
    size: int
    samples: int = 0
    members: int = 0
    skipped_members: list[str] = field(default_factory=list)
    first_key: str | None = None
    last_key: str | None = None
    extensions: dict[str, _ExtensionStats] = field(default_factory=dict)
    first_samples: list[dict[str, Any]] = field(default_factory=list)
    # problems make the exit status 1; notes are worth knowing but legitimate
    # (e.g. some samples carry a png where others carry a jpg).
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": "tar",
            "size": self.size,
            "samples": self.samples,
            "members": self.members,
            "skipped_members": self.skipped_members,
            "first_key": self.first_key,
            "last_key": self.last_key,
            "extensions": {
                k: {"members": v.members, "bytes": v.bytes} for k, v in self.extensions.items()
            },
            "first_samples": self.first_samples,
            "problems": self.problems,
            "notes": self.notes,
        }


def _describe_payload(extension: str, data: bytes, where: str) -> dict[str, Any]:
    from chute import _core

    last = extension.rsplit(".", 1)[-1]
    info: dict[str, Any] = {"bytes": len(data)}
    if last == "npy":
        array = _core.decode_npy(data, where)
        info.update(type="npy", dtype=str(array.dtype), shape=list(array.shape))
    elif last in _IMAGE_EXTS:
        fmt, width, height = _core.probe_image(data, where)
        info.update(type="image", format=fmt, width=width, height=height)
    elif last in _INT_EXTS:
        info.update(type="int", value=_core.parse_int_label(data, where))
    elif last in ("txt", "text", "json", "jsn"):
        text = data.decode("utf-8")
        if last in ("json", "jsn"):
            json.loads(text)
        info.update(type=last, chars=len(text))
    return info


def inspect_tar(path: str, first: int = 3) -> TarReport:
    from chute import _core
    from chute.tarindex import split_member_name

    report = TarReport(path=path, size=os.path.getsize(path))
    try:
        members = _core.list_tar_payloads(path)
    except (_core.DataError, _core.ReadError) as exc:
        report.problems.append(f"unreadable: {exc}")
        # Keep what came before the damage: the engine stops at the same place.
        return report
    keys_seen: dict[str, int] = {}
    sample_exts: list[frozenset[str]] = []
    current_key: str | None = None
    current: list[tuple[str, int, int]] = []

    def finish() -> None:
        if current_key is None:
            return
        sample_exts.append(frozenset(e for e, _, _ in current))
        if len(report.first_samples) < first:
            report.first_samples.append(_peek_sample(path, current_key, current, report))

    for name, header_offset, data_offset, size in members:
        split = split_member_name(name)
        report.members += 1
        if split is None:
            report.skipped_members.append(name)
            continue
        key, ext = split
        if key != current_key:
            finish()
            current_key, current = key, []
            report.samples += 1
            if key in keys_seen:
                report.problems.append(
                    f"key {key!r} appears again at offset {header_offset} (first sample"
                    f" #{keys_seen[key]}): its members are not adjacent, so readers see"
                    " two samples"
                )
            else:
                keys_seen[key] = report.samples - 1
            report.first_key = report.first_key or key
            report.last_key = key
        if any(e == ext for e, _, _ in current):
            report.problems.append(
                f"sample {key!r}: member {name!r} at offset {header_offset} repeats"
                f" extension {ext!r} (readers raise on it)"
            )
        current.append((ext, int(data_offset), int(size)))
        stats = report.extensions.setdefault(ext, _ExtensionStats())
        stats.members += 1
        stats.bytes += int(size)
        if size == 0:
            report.notes.append(f"sample {key!r}: member {name!r} is empty")
    finish()
    if report.samples == 0:
        report.problems.append("no samples (no member has a key.extension name)")
    # Fields only some samples have: fine for dict samples, but a to_tuple
    # over them fails on the samples that lack one.
    for ext, stats in sorted(report.extensions.items()):
        if 0 < stats.members < report.samples:
            example = next((i for i, exts in enumerate(sample_exts) if ext not in exts), None)
            report.notes.append(
                f"{ext!r} is in {stats.members} of {report.samples} samples"
                f" (first without it: sample #{example})"
            )
    return report


def _peek_sample(
    path: str, key: str, members: list[tuple[str, int, int]], report: TarReport
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        for ext, offset, size in members:
            where = f"{path}: sample {key!r} member {ext!r}"
            data = os.pread(fd, size, offset)
            try:
                fields[ext] = _describe_payload(ext, data, where)
            except Exception as exc:  # any decoder error is a finding, not a crash
                fields[ext] = {"bytes": size, "error": str(exc)}
                report.problems.append(f"sample {key!r} member {ext!r} does not decode: {exc}")
    finally:
        os.close(fd)
    return {"key": key, "fields": fields}


def inspect_hdf5(path: str) -> dict[str, Any]:
    import h5py

    from chute.h5layout import describe_dataset as _describe_dataset

    st = os.stat(path)
    datasets: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        return {
            "path": path,
            "kind": "hdf5",
            "size": st.st_size,
            "datasets": [],
            "problems": [f"unreadable: {exc}"],
        }
    with f:

        def visit(name: str, obj: Any) -> None:
            if not isinstance(obj, h5py.Dataset):
                return
            dcpl = obj.id.get_create_plist()
            filters = []
            for i in range(dcpl.get_nfilters()):
                _, _, _, fname = dcpl.get_filter(i)
                filters.append(
                    fname.decode(errors="replace") if isinstance(fname, bytes) else str(fname)
                )
            layout = {
                h5py.h5d.CONTIGUOUS: "contiguous",
                h5py.h5d.CHUNKED: "chunked",
                h5py.h5d.COMPACT: "compact",
            }.get(dcpl.get_layout(), "virtual" if obj.is_virtual else "other")
            entry: dict[str, Any] = {
                "name": obj.name,
                "layout": layout,
                "dtype": str(obj.dtype),
                "shape": [int(x) for x in obj.shape],
                "chunks": None if obj.chunks is None else [int(c) for c in obj.chunks],
                "filters": filters,
            }
            if obj.ndim == 0:
                entry["read"] = "no: a scalar, not rows"
            elif obj.dtype.kind not in "biufc" or obj.dtype.fields is not None:
                entry["read"] = f"no: non-numeric dtype {obj.dtype}"
            else:
                try:
                    _, reason = _describe_dataset(obj, path, st)
                except Exception as exc:
                    reason = f"cannot describe it: {exc}"
                    problems.append(f"{obj.name}: {exc}")
                entry["read"] = "native" if reason is None else f"slow path: {reason}"
            datasets.append(entry)

        f.visititems(visit)
    if not datasets:
        problems.append("no datasets")
    row_counts = {d["shape"][0] for d in datasets if d["shape"]}
    return {
        "path": path,
        "kind": "hdf5",
        "size": st.st_size,
        "datasets": datasets,
        "row_counts": sorted(row_counts),
        "problems": problems,
    }


def _print_tar(r: TarReport, out: TextIO) -> None:
    print(f"{r.path}: tar shard, {_size(r.size)}", file=out)
    print(f"  samples: {r.samples}   members: {r.members}", file=out)
    if r.first_key is not None:
        print(f"  keys: {r.first_key} ... {r.last_key}", file=out)
    if r.skipped_members:
        shown = ", ".join(repr(n) for n in r.skipped_members[:3])
        more = f" (+{len(r.skipped_members) - 3} more)" if len(r.skipped_members) > 3 else ""
        print(f"  skipped members (no key.extension name): {shown}{more}", file=out)
    if r.extensions:
        print("  extensions:", file=out)
        width = max(len(e) for e in r.extensions)
        for ext, s in sorted(r.extensions.items()):
            print(
                f"    {ext:<{width}}  {s.members:>8} members  {_size(s.bytes):>10}"
                f"  (mean {_size(s.bytes / max(1, s.members))})",
                file=out,
            )
    for sample in r.first_samples:
        parts = []
        for ext, info in sample["fields"].items():
            kind = info.get("type")
            if "error" in info:
                parts.append(f"{ext}: ERROR")
            elif kind == "npy":
                parts.append(f"{ext}: {info['dtype']} {tuple(info['shape'])}")
            elif kind == "image":
                parts.append(f"{ext}: {info['format']} {info['width']}x{info['height']}")
            elif kind == "int":
                parts.append(f"{ext}: int {info['value']}")
            else:
                parts.append(f"{ext}: {info['bytes']} bytes")
        print(f"  sample {sample['key']}: " + ", ".join(parts), file=out)
    for note in r.notes[:10]:
        print(f"  note: {note}", file=out)
    if len(r.notes) > 10:
        print(f"  ... {len(r.notes) - 10} more notes", file=out)
    _print_problems(r.problems, out)


def _print_hdf5(r: dict[str, Any], out: TextIO) -> None:
    print(f"{r['path']}: HDF5 file, {_size(r['size'])}", file=out)
    for d in r["datasets"]:
        chunks = d["layout"] if d["chunks"] is None else f"chunks {tuple(d['chunks'])}"
        filters = "+".join(d["filters"]) or "no filters"
        print(
            f"  {d['name']}: {d['dtype']} {tuple(d['shape'])}, {chunks}, {filters} -> {d['read']}",
            file=out,
        )
    if len(r.get("row_counts", [])) > 1:
        print(f"  note: datasets have different row counts {r['row_counts']}", file=out)
    _print_problems(r["problems"], out)


def _print_problems(problems: list[str], out: TextIO) -> None:
    if not problems:
        print("  problems: none", file=out)
        return
    print(f"  problems ({len(problems)}):", file=out)
    for p in problems[:20]:
        print(f"    - {p}", file=out)
    if len(problems) > 20:
        print(f"    ... {len(problems) - 20} more", file=out)


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    paths = _expand(args.paths)
    kinds = [(p, _kind_of(p)) for p in paths]  # all usage errors before any output
    reports: list[dict[str, Any]] = []
    status = EXIT_OK
    for path, kind in kinds:
        if kind == "tar":
            tar = inspect_tar(path, first=args.first)
            reports.append(tar.as_json())
            if not args.json:
                _print_tar(tar, out)
        else:
            h5 = inspect_hdf5(path)
            reports.append(h5)
            if not args.json:
                _print_hdf5(h5, out)
        if reports[-1]["problems"]:
            status = EXIT_PROBLEMS
    if args.json:
        json.dump(reports, out, indent=2)
        out.write("\n")
    return status


# ---------------------------------------------------------------- index


def cmd_index(args: argparse.Namespace, out: TextIO) -> int:
    from chute import _core
    from chute.tarindex import index_path, write_index

    paths = _expand(args.shards)
    for p in paths:
        if _kind_of(p) != "tar":
            raise UsageError(f"{p}: not a tar shard (index works on tar shards)")
    status = EXIT_OK
    for p in paths:
        target = index_path(p)
        if (
            target.exists()
            and not args.force
            and target.stat().st_mtime_ns >= os.stat(p).st_mtime_ns
        ):
            print(f"{target}: up to date", file=out)
            continue
        try:
            written = write_index(p)
        except (_core.DataError, _core.ReadError, ValueError) as exc:
            print(f"chute index: {p}: {exc}", file=sys.stderr)
            status = EXIT_PROBLEMS
            continue
        doc = json.loads(written.read_text(encoding="utf-8"))
        print(f"{written}: {len(doc['samples'])} samples", file=out)
    return status


# ---------------------------------------------------------------- bench


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
            rate = self.count / max(now - self._start, 1e-9)
            of = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\r{self.label}: {self.count}{of} samples, {rate:,.0f}/s ")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
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
    from chute.tarindex import read_index

    total = 0
    for p in paths:
        try:
            total += len(read_index(p)["samples"])
        except (OSError, ValueError):
            return None
    return total


def _build_pipeline(module: Any, config: dict[str, Any]) -> Any:
    ds = module.WebDataset(config["paths"], shardshuffle=False)
    decode = config["decode"]
    if decode != "raw":
        ds = ds.decode(decode) if decode else ds.decode()
    if config["to_tuple"]:
        ds = ds.to_tuple(*config["to_tuple"])
    return ds.batched(config["batch_size"])


def _run_one(config: dict[str, Any]) -> dict[str, Any]:
    """Streams the shards once with one loader and measures it (in this process)."""
    import torch.utils.data

    module: Any
    loader_cls: Any
    if config["loader"] == "chute":
        import chute
        import chute.wds

        module, loader_cls, label = chute.wds, chute.DataLoader, "chute"
    else:
        import webdataset

        module, loader_cls, label = webdataset, torch.utils.data.DataLoader, "torch+webdataset"
    loader: Any = loader_cls(
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
    total_bytes = sum(os.path.getsize(p) for p in config["paths"])
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


def cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    if args._config:
        print(json.dumps(_run_one(json.loads(args._config))))
        return EXIT_OK
    if not args.paths:
        raise UsageError("bench needs at least one tar shard")
    from chute.decoders import IMAGE_SPECS

    paths = _expand(args.paths)
    for p in paths:
        if _kind_of(p) != "tar":
            raise UsageError(f"{p}: bench streams tar shards; this is not one")
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
    if args.compare:
        try:
            import webdataset  # noqa: F401
        except ImportError as exc:
            raise UsageError(
                "--compare needs webdataset installed (pip install webdataset)"
            ) from exc
    to_tuple = args.to_tuple.split() if args.to_tuple else []
    config: dict[str, Any] = {
        "paths": [str(Path(p).resolve()) for p in paths],
        "batch_size": args.batch_size,
        "workers": args.workers,
        "decode": decode.lower(),
        "to_tuple": to_tuple,
        "limit": args.limit,
        "total": _known_sample_count(paths),
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
    return EXIT_OK


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chute",
        description="Inspect, index and benchmark tar shards and HDF5 files.",
        epilog="Exit status: 0 ok, 1 problems found, 2 bad usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="what is inside tar shards or HDF5 files")
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="tar shards (brace patterns ok) or HDF5 files"
    )
    p.add_argument("--first", type=int, default=3, help="samples to decode and show per shard")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("index", help="write a sidecar index (<shard>.idx.json) per tar shard")
    p.add_argument("shards", nargs="+", metavar="SHARD")
    p.add_argument("--force", action="store_true", help="rewrite indexes that look current")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("bench", help="stream tar shards with chute (and torch) and time it")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--batch-size", type=int, default=64)
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
        "--to-tuple", default="", metavar="KEYS", help="space-separated fields, e.g. 'jpg cls'"
    )
    p.add_argument("--compare", action="store_true", help="also run torch DataLoader + webdataset")
    p.add_argument("--limit", type=int, default=0, help="stop after about this many samples")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--_config", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace, TextIO], int] = args.func
    try:
        return func(args, sys.stdout)
    except UsageError as exc:
        parser.exit(EXIT_USAGE, f"chute {args.command}: error: {exc}\n")
    except KeyboardInterrupt:
        return 130
