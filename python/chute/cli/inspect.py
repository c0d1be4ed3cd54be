"""``chute inspect``: what is inside tar shards, HDF5, Parquet and token
files, and what is wrong with them."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from chute.cli import remote
from chute.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, expand, human_size
from chute.cli.kinds import kind_of
from chute.common.errors import engine_errors, translate
from chute.decoding.extensions import (
    INT_EXTENSIONS,
    JSON_EXTENSIONS,
    NATIVE_IMAGE_EXTENSIONS,
    NPY_EXTENSION,
    TEXT_EXTENSIONS,
    last_extension,
)


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
    index: str | None = None  # the sidecar index the counts come from; None: a scan

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": "tar",
            "size": self.size,
            "counted_from": "scan" if self.index is None else "index",
            "index": self.index,
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

    last = last_extension(extension)
    info: dict[str, Any] = {"bytes": len(data)}
    if last == NPY_EXTENSION:
        array = _core.decode_npy(data, where)
        info.update(type="npy", dtype=str(array.dtype), shape=list(array.shape))
    elif last in NATIVE_IMAGE_EXTENSIONS:
        fmt, width, height = _core.probe_image(data, where)
        info.update(type="image", format=fmt, width=width, height=height)
    elif last in INT_EXTENSIONS:
        info.update(type="int", value=_core.parse_int_label(data, where))
    elif last in TEXT_EXTENSIONS or last in JSON_EXTENSIONS:
        text = data.decode("utf-8")
        if last in JSON_EXTENSIONS:
            json.loads(text)
        info.update(type=last, chars=len(text))
    return info


def inspect_tar(path: str, first: int = 3, scan: bool = False) -> TarReport:
    """What is in the tar shard `path`: counted from its sidecar index when
    that is current (unless `scan`), else from the shard itself."""
    from chute import _core
    from chute.sources.tarindex import TarIndexError, index_path, read_index

    report = TarReport(path=path, size=remote.size_of(path))
    # (name, key, extension, header offset, payload offset, size) of each member.
    members: list[tuple[str, str | None, str, int, int | None, int]] = []
    damaged = False
    index_file = index_path(path)
    if not scan and not remote.is_remote(path) and index_file.exists():
        try:
            document = read_index(path)
        except (TarIndexError, OSError) as exc:
            report.notes.append(f"index not used: {exc}")
        else:
            report.index = str(index_file)
            for s in document["samples"]:
                for ext, offset, size, header in s["members"]:
                    members.append((f"{s['key']}.{ext}", s["key"], ext, header, offset, size))
    if report.index is None:
        try:
            with engine_errors():
                listed = _core.list_tar_payloads(path, source=remote.source_for(path))
        except (_core.DataError, _core.ReadError) as exc:
            report.problems.append(f"unreadable: {exc}")
            # Report what comes before the damage: readers deliver those samples.
            listed = [] if remote.is_remote(path) else _members_before_damage(path)
            if listed:
                report.notes.append(
                    f"the {len(listed)} members before the damage are reported; the last"
                    " sample may be missing members that lay past it"
                )
            damaged = True
        # The reader's own key and extension of each member (None: skipped).
        for name, header_offset, data_offset, size, key, ext in listed:
            members.append((name, key, ext or "", header_offset, data_offset, size))
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

    for name, key, ext, header_offset, data_offset, size in members:
        report.members += 1
        if key is None:
            report.skipped_members.append(name)
            continue
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
                f" extension {ext!r} (readers raise on it, or leave it out under a handler that"
                " goes on)"
            )
        if data_offset is None:
            report.notes.append(f"sample {key!r}: member {name!r} is a sparse file")
        current.append((ext, -1 if data_offset is None else int(data_offset), int(size)))
        stats = report.extensions.setdefault(ext, _ExtensionStats())
        stats.members += 1
        stats.bytes += int(size)
        if size == 0:
            report.notes.append(f"sample {key!r}: member {name!r} is empty")
    finish()
    if damaged:
        # What readers get of it, as the engine delivers samples: under the
        # default handler (webdataset's too) the samples before the error, not
        # one the damage may have cut short; under a handler that goes on,
        # that one too, as read.
        with contextlib.suppress(_core.DataError, _core.ReadError):
            counts = _core.count_tar_samples(path)
            report.problems.append(
                f"readers get {counts['samples']} samples before the error; under a handler"
                f" that goes on, {counts['samples_skipping']} delivered and"
                f" {counts['samples_lost']} lost"
            )
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


def _members_before_damage(
    path: str,
) -> list[tuple[str, int, int | None, int, str | None, str | None]]:
    """``list_tar_payloads`` entries of the members read before the damage
    whose payload lies wholly in the file."""
    from chute import _core

    size = os.path.getsize(path)
    listed = _core.list_tar_payloads(path, until_error=True)
    return [m for m in listed if m[2] is None or m[2] + m[3] <= size]


def _peek_sample(
    path: str, key: str, members: list[tuple[str, int, int]], report: TarReport
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    with remote.reader(path) as read:
        for ext, offset, size in members:
            if offset < 0:  # a sparse file: not one range to read
                fields[ext] = {"bytes": size, "type": "sparse"}
                continue
            where = f"{path}: sample {key!r} member {ext!r}"
            data = read(offset, size)
            try:
                fields[ext] = _describe_payload(ext, data, where)
            except Exception as exc:  # any decoder error is a finding, not a crash
                message = str(translate(exc))
                fields[ext] = {"bytes": size, "error": message}
                report.problems.append(f"sample {key!r} member {ext!r} does not decode: {message}")
    return {"key": key, "fields": fields}


def inspect_hdf5(path: str) -> dict[str, Any]:
    import h5py

    from chute.sources.h5layout import describe_dataset

    st = remote.h5_stat(path)
    datasets: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        f = h5py.File(remote.h5_target(path), "r")
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
                    _, reason = describe_dataset(obj, path, st)
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


def inspect_parquet(path: str, first: int) -> dict[str, Any]:
    """A Parquet file's rows, row groups and columns (each one's type, what
    ParquetDataset makes of it and its stored bytes), and the image columns'
    first `first` images probed (format and size)."""
    from chute import _core
    from chute.datasets.parquet import ParquetDataset, column_kind

    report: dict[str, Any] = {"path": path, "kind": "parquet", "problems": []}
    try:
        ds = ParquetDataset(path, remote=remote.options())
    except Exception as exc:  # an unreadable footer is a finding, not a crash
        report.update(size=remote.size_of(path), problems=[str(translate(exc))])
        return report
    f = ds._files[0]
    metadata = f.metadata
    group_rows = f.group_rows
    stored: dict[str, int] = {}
    for g in range(metadata.num_row_groups):
        row_group = metadata.row_group(g)
        for j in range(row_group.num_columns):
            chunk = row_group.column(j)
            top = chunk.path_in_schema.split(".")[0]
            stored[top] = stored.get(top, 0) + int(chunk.total_compressed_size)
    columns = [
        {
            "name": name,
            "type": str(ds._types[name]),
            "read_as": column_kind(ds._types[name]),
            "stored_bytes": stored.get(name, 0),
        }
        for name in ds.columns
    ]
    report.update(
        size=f.size,
        rows=len(ds),
        row_groups=len(group_rows),
        row_group_rows=[min(group_rows, default=0), max(group_rows, default=0)],
        created_by=metadata.created_by,
        columns=columns,
        first_images=[],
    )
    images = [str(c["name"]) for c in columns if c["read_as"] == "image"]
    if images and len(ds):
        plain = ParquetDataset(path, images, remote=remote.options())
        for row in range(min(first, len(ds))):
            try:
                values = plain[row]
            except Exception as exc:
                report["problems"].append(f"row {row}: {translate(exc)}")
                break
            for name in images:
                data = (values[name] or {}).get("bytes")
                where = f"{path}: row {row}, column {name!r}"
                if data is None:
                    report["first_images"].append({"row": row, "column": name, "null": True})
                    continue
                try:
                    fmt, width, height = _core.probe_image(data, where)
                except Exception as exc:
                    message = str(translate(exc))
                    report["problems"].append(f"row {row}, column {name!r}: {message}")
                    continue
                report["first_images"].append(
                    {"row": row, "column": name, "format": fmt, "width": width, "height": height}
                )
    return report


def _print_parquet(r: dict[str, Any], out: TextIO) -> None:
    print(f"{r['path']}: Parquet file, {human_size(r['size'])}", file=out)
    if "rows" in r:
        low, high = r["row_group_rows"]
        print(
            f"  rows: {r['rows']}   row groups: {r['row_groups']} ({low}..{high} rows each)",
            file=out,
        )
        for c in r["columns"]:
            print(
                f"    {c['name']}: {c['type']} -> {c['read_as']}, {human_size(c['stored_bytes'])}",
                file=out,
            )
        for image in r["first_images"]:
            what = (
                "null"
                if image.get("null")
                else (f"{image['format']} {image['width']}x{image['height']}")
            )
            print(f"  row {image['row']} {image['column']}: {what}", file=out)
    _print_problems(r["problems"], out)


def _print_tar(r: TarReport, out: TextIO) -> None:
    print(f"{r.path}: tar shard, {human_size(r.size)}", file=out)
    print(f"  samples: {r.samples}   members: {r.members}", file=out)
    if r.index is not None:
        print(f"  counted from its index {r.index} (current; --scan reads the shard)", file=out)
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
                f"    {ext:<{width}}  {s.members:>8} members  {human_size(s.bytes):>10}"
                f"  (mean {human_size(s.bytes / max(1, s.members))})",
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
    print(f"{r['path']}: HDF5 file, {human_size(r['size'])}", file=out)
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


TOKEN_SUFFIXES = (".bin", ".idx", ".npy")
NPY_MAGIC = b"\x93NUMPY"


def is_token_file(path: str) -> bool:
    """Token files are told by their name: a ``.bin`` (raw, or Megatron's
    with its ``.idx``), an ``.idx``, or a ``.npy``; local or remote."""
    return path.endswith(TOKEN_SUFFIXES)


def _token_spec(path: str) -> Any:
    """How TokenDataset reads `path`; a remote ``.bin`` with an ``.idx``
    beside it is a Megatron pair here too."""
    from chute.datasets.tokens import TokenFileSpec, token_file_spec

    spec = token_file_spec(path)
    if spec.format == "raw" and path.endswith(".bin") and remote.is_remote(path):
        index = path[: -len(".bin")] + ".idx"
        if remote.exists(index):
            return TokenFileSpec(path, "megatron", index)
    return spec


def _npy_header_bytes(path: str) -> int:
    """The bytes of a .npy file before its data (its magic's, when it has no
    .npy magic: the check then names what is wrong)."""
    prefix = remote.head_bytes(path, 12)
    if not prefix.startswith(NPY_MAGIC) or len(prefix) < 12:
        return len(prefix)
    if prefix[6] == 1:
        return 10 + int.from_bytes(prefix[8:10], "little")
    return 12 + int.from_bytes(prefix[8:12], "little")


@contextlib.contextmanager
def _checkable(spec: Any, whole: bool) -> Iterator[tuple[Any, Callable[[str], str]]]:
    """The spec of local files the engine's TokenFile checks in place of
    `spec`'s, and a function that puts the urls back into its messages. A
    local spec is itself. A remote file becomes a local file of its size
    holding only what the check reads: the .npy header, or nothing of a raw
    or Megatron .bin (its .idx is fetched whole), so the engine judges it as
    it judges a local one; `whole` fetches all of the tokens (to find the
    documents of a raw or .npy file by their end token)."""
    from chute.datasets.tokens import TokenFileSpec

    if not remote.is_remote(spec.url):
        yield spec, lambda message: message
        return
    with tempfile.TemporaryDirectory(prefix="chute-inspect-") as directory:
        names: dict[str, str] = {}

        def place(url: str, head: int | None) -> str:
            local = os.path.join(directory, url.rsplit("/", 1)[-1])
            remote.stand_in(url, local, head)
            names[local] = url
            return local

        if spec.format == "npy":
            head = None if whole else _npy_header_bytes(spec.url)
        else:
            head = None if whole and spec.format == "raw" else 0
        index = place(spec.index_url, None) if spec.index_url else ""
        local_spec = TokenFileSpec(place(spec.url, head), spec.format, index)

        def named(message: str) -> str:
            for local, url in names.items():
                message = message.replace(local, url)
            return message

        yield local_spec, named


def inspect_tokens(path: str, dtype: str | None, eod_id: int | None) -> dict[str, Any]:
    """A token file's format, dtype and tokens; its documents (Megatron's,
    or ended by `eod_id`) and their lengths. A remote file is read by
    ranges: a Megatron pair's .idx, a .npy's header, all of the tokens only
    to find documents by `eod_id`."""
    from chute import _core

    report: dict[str, Any] = {
        "path": path,
        "kind": "tokens",
        "format": None,
        "index": None,
        "size": None,
        "dtype": None,
        "tokens": None,
        "documents": None,
        "document_lengths": None,
        "problems": [],
    }
    try:
        spec = _token_spec(path)
        report.update(format=spec.format, index=spec.index_url or None)
        if remote.is_remote(spec.url):
            report["size"] = remote.size_of(spec.url)
        elif os.path.isfile(spec.url):
            report["size"] = os.path.getsize(spec.url)
    except UsageError as exc:  # a remote object that cannot be read
        report["problems"].append(str(exc))
        return report
    if spec.format == "raw" and dtype is None:
        report["problems"].append("a raw token file has no header: give --dtype (e.g. uint16)")
        return report
    by_eod = spec.format != "megatron" and eod_id is not None
    try:
        with _checkable(spec, whole=by_eod) as (local, named):
            try:
                f = _core.TokenFile(local.url, local.format, dtype or "", local.index_url)
                report.update(dtype=f.dtype, tokens=int(f.num_tokens))
                if spec.format != "megatron" and eod_id is None:
                    return report
                # The documents packing would see; the sequence length only
                # matters to packing, not to the lengths.
                packer = _core.TokenPacker(
                    [f], 1 << 20, "documents", -1 if eod_id is None else eod_id
                )
                lengths = packer.document_lengths()
            except (ValueError, OSError) as exc:  # the file's own fault, reported as found
                report["problems"].append(named(str(exc)))
                return report
    except UsageError as exc:
        report["problems"].append(str(exc))
        return report
    report["documents"] = int(lengths.size)
    if lengths.size:
        import numpy as np

        report["document_lengths"] = {
            "min": int(lengths.min()),
            "median": float(np.median(lengths)),
            "mean": float(lengths.mean()),
            "p90": float(np.percentile(lengths, 90)),
            "p99": float(np.percentile(lengths, 99)),
            "max": int(lengths.max()),
        }
    return report


def _print_tokens(r: dict[str, Any], out: TextIO) -> None:
    size = "" if r["size"] is None else f", {human_size(r['size'])}"
    print(f"{r['path']}: token file ({r['format']}){size}", file=out)
    if r["tokens"] is not None:
        print(f"  {r['tokens']:,} {r['dtype']} tokens", file=out)
    if r["documents"] is not None:
        print(f"  {r['documents']:,} documents", file=out)
        d = r["document_lengths"]
        if d is not None:
            print(
                f"  document lengths: min {d['min']:,}, median {d['median']:,.0f}, mean"
                f" {d['mean']:,.1f}, p90 {d['p90']:,.0f}, p99 {d['p99']:,.0f}, max {d['max']:,}",
                file=out,
            )
    elif r["tokens"] is not None:
        print("  documents: give --eod-id to count them", file=out)
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


def run(args: argparse.Namespace, out: TextIO) -> int:
    remote.configure(args)
    paths = expand(args.paths)
    reports: list[dict[str, Any]] = []
    status = EXIT_OK
    for path in paths:
        if is_token_file(path) and (remote.is_remote(path) or os.path.exists(path)):
            reports.append(inspect_tokens(path, args.dtype, args.eod_id))
            if not args.json:
                _print_tokens(reports[-1], out)
            if reports[-1]["problems"]:
                status = EXIT_PROBLEMS
            continue
        # A path that is missing or of no known kind is a finding about that
        # path: the others are still reported.
        try:
            kind = kind_of(path)
        except UsageError as exc:
            reports.append({"path": path, "kind": None, "problems": [str(exc)]})
            if not args.json:
                print(f"{path}:", file=out)
                _print_problems(reports[-1]["problems"], out)
            status = EXIT_PROBLEMS
            continue
        if kind == "tar":
            tar = inspect_tar(path, first=args.first, scan=args.scan)
            reports.append(tar.as_json())
            if not args.json:
                _print_tar(tar, out)
        elif kind == "parquet":
            reports.append(inspect_parquet(path, first=args.first))
            if not args.json:
                _print_parquet(reports[-1], out)
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


def register(sub: Any) -> None:
    """Adds the ``inspect`` command to the subparsers `sub`."""
    p = sub.add_parser("inspect", help="what is inside tar shards, HDF5, Parquet or token files")
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="tar shards (brace patterns ok), HDF5, Parquet or token files (.bin, .idx, "
        ".npy): paths or urls (s3://, https://, ...)",
    )
    p.add_argument(
        "--first", type=int, default=3, help="samples (Parquet: images) to probe and show per file"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--scan",
        action="store_true",
        help="read tar shards even where a current sidecar index could give the counts",
    )
    p.add_argument("--dtype", help="the element type of raw token files (.bin), e.g. uint16")
    p.add_argument(
        "--eod-id", type=int, help="the token ending each document of raw and .npy token files"
    )
    remote.add_arguments(p)
    p.set_defaults(func=run)
