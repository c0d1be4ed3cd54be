"""Tar shards (webdataset's layout), and the two kinds that read them:
``WebDataset`` (streamed shard by shard) and ``TarDataset`` (map-style,
read by offset through each shard's sidecar index)."""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from chute.common.errors import engine_errors, translate
from chute.decoding.extensions import (
    INT_EXTENSIONS,
    JSON_EXTENSIONS,
    NATIVE_IMAGE_EXTENSIONS,
    NPY_EXTENSION,
    TEXT_EXTENSIONS,
    last_extension,
)
from chute.kinds.registry import DataKind, FileFormat, OpenSpec, Target, register_kind
from chute.kinds.report import human_size, print_problems


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


def inspect_tar(target: Target, first: int = 3, scan: bool = False) -> TarReport:
    """What is in the tar shard at `target`: counted from its sidecar index
    when that is current (unless `scan`), else from the shard itself."""
    from chute import _core
    from chute.sources.tarindex import TarIndexError, index_path, read_index

    path = target.path
    report = TarReport(path=path, size=target.size())
    # (name, key, extension, header offset, payload offset, size) of each member.
    members: list[tuple[str, str | None, str, int, int | None, int]] = []
    damaged = False
    index_file = index_path(path)
    if not scan and not target.is_remote and index_file.exists():
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
                listed = _core.list_tar_payloads(path, source=target.native_source())
        except (_core.DataError, _core.ReadError) as exc:
            report.problems.append(f"unreadable: {exc}")
            # Report what comes before the damage: readers deliver those samples.
            listed = [] if target.is_remote else _members_before_damage(path)
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
            report.first_samples.append(_peek_sample(target, current_key, current, report))

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
    target: Target, key: str, members: list[tuple[str, int, int]], report: TarReport
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    with target.reader() as read:
        for ext, offset, size in members:
            if offset < 0:  # a sparse file: not one range to read
                fields[ext] = {"bytes": size, "type": "sparse"}
                continue
            where = f"{target.path}: sample {key!r} member {ext!r}"
            data = read(offset, size)
            try:
                fields[ext] = _describe_payload(ext, data, where)
            except Exception as exc:  # any decoder error is a finding, not a crash
                message = str(translate(exc))
                fields[ext] = {"bytes": size, "error": message}
                report.problems.append(f"sample {key!r} member {ext!r} does not decode: {message}")
    return {"key": key, "fields": fields}


def _print_tar(r: dict[str, Any], out: TextIO) -> None:
    print(f"{r['path']}: tar shard, {human_size(r['size'])}", file=out)
    print(f"  samples: {r['samples']}   members: {r['members']}", file=out)
    if r["index"] is not None:
        print(f"  counted from its index {r['index']} (current; --scan reads the shard)", file=out)
    if r["first_key"] is not None:
        print(f"  keys: {r['first_key']} ... {r['last_key']}", file=out)
    skipped = r["skipped_members"]
    if skipped:
        shown = ", ".join(repr(n) for n in skipped[:3])
        more = f" (+{len(skipped) - 3} more)" if len(skipped) > 3 else ""
        print(f"  skipped members (no key.extension name): {shown}{more}", file=out)
    extensions = r["extensions"]
    if extensions:
        print("  extensions:", file=out)
        width = max(len(e) for e in extensions)
        for ext, s in sorted(extensions.items()):
            print(
                f"    {ext:<{width}}  {s['members']:>8} members  {human_size(s['bytes']):>10}"
                f"  (mean {human_size(s['bytes'] / max(1, s['members']))})",
                file=out,
            )
    for sample in r["first_samples"]:
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
    notes = r["notes"]
    for note in notes[:10]:
        print(f"  note: {note}", file=out)
    if len(notes) > 10:
        print(f"  ... {len(notes) - 10} more notes", file=out)
    print_problems(r["problems"], out)


def _index_local(target: Target, force: bool) -> str:
    from chute.sources.tarindex import index_path, write_index

    path = target.path
    existing = index_path(path)
    if existing.exists() and not force and existing.stat().st_mtime_ns >= os.stat(path).st_mtime_ns:
        return f"{existing}: up to date"
    written = write_index(path)
    doc = json.loads(written.read_text(encoding="utf-8"))
    return f"{written}: {len(doc['samples'])} samples"


def _index_remote(target: Target, force: bool) -> str:
    """Indexes a remote shard and puts the index beside it (``<url>.idx.json``,
    where datasets look for it). The shard is read once, through the cache
    (the remote options' ``cache_dir``; else a temporary copy)."""
    from chute import _core
    from chute.remote import get_session
    from chute.sources.remote_urls import build_remote_index
    from chute.sources.tarindex import INDEX_SUFFIX, _problem

    url = target.path
    index = url + INDEX_SUFFIX
    session = get_session(target.remote)
    ranges = session.ranges(url)
    size, version = int(ranges.size), str(ranges.version)
    if not force:
        try:
            current = json.loads(session.read_bytes(index))
            if (
                _problem(current, url, None, exact=True) is None
                and current["shard_size"] == size
                and current["shard_version"] == version
            ):
                return f"{index}: up to date"
        except (_core.ReadError, ValueError):
            pass  # none yet, or not one of ours: write it
    document = build_remote_index(url, session, version)
    session.put(index, json.dumps(document, separators=(",", ":")).encode())
    return f"{index}: {len(document['samples'])} samples"


class TarShards(FileFormat):
    """Tar shards: told by the ustar magic of their first header (or an
    all-zero first block, an archive of no members)."""

    name = "tar"
    noun = "a tar shard"
    plural = "tar shards"

    def claims(self, target: Target) -> bool:
        if target.is_dir():
            return False
        head = target.head(512)
        # ustar magic at 257 ("ustar\0" POSIX, "ustar  " GNU); also accept an
        # empty archive (all-zero first block), which tar writes for zero members.
        return len(head) == 512 and (head[257:262] == b"ustar" or head == bytes(512))

    def add_inspect_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--scan",
            action="store_true",
            help="read tar shards even where a current sidecar index could give the counts",
        )

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        return inspect_tar(target, first=options.first, scan=options.scan).as_json()

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        _print_tar(report, out)

    def index(self, target: Target, force: bool) -> str:
        """``chute index``: the shard's sidecar index (``chute.sources.tarindex``)."""
        return _index_remote(target, force) if target.is_remote else _index_local(target, force)

    def indexed_count(self, targets: Sequence[Target]) -> int | None:
        """From the shards' current sidecar indexes (the tar sample counter's)."""
        from chute.sources.sample_counts import sample_counter

        total = 0
        for t in targets:
            count = sample_counter(t.path).indexed_count(t.path)
            if count is None:
                return None
            total += count
        return total

    def images(self, paths: Sequence[str], columns: Sequence[str], count: int) -> list[bytes]:
        from chute import _core

        found: list[bytes] = []
        for path in paths:
            with tarfile.open(path) as tar:
                for member in tar:
                    if len(found) == count:
                        return found
                    if member.isfile() and (
                        last_extension(member.name).lower() in NATIVE_IMAGE_EXTENSIONS
                    ):
                        f = tar.extractfile(member)
                        data = f.read() if f is not None else b""
                        try:
                            _core.probe_image(data)
                        except _core.DataError:
                            continue
                        found.append(data)
        return found


TAR_SHARDS = TarShards()


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


def _pipeline(module: Any, spec: OpenSpec, chute_side: bool) -> Any:
    """``module.WebDataset(paths).decode(...).to_tuple(...).batched(B)``:
    chute's (`module` chute.wds) or webdataset's."""
    remote_kwargs: dict[str, Any] = {}
    if chute_side and spec.storage_options:
        remote_kwargs["storage_options"] = spec.storage_options
    if chute_side and spec.cache_dir:
        remote_kwargs["cache_dir"] = spec.cache_dir
    ds = module.WebDataset(spec.paths, shardshuffle=False, **remote_kwargs)
    if spec.decode != "raw":
        specs = (spec.decode,) if spec.decode else ()
        opts = spec.image_options
        if chute_side:
            ds = ds.decode(*specs, **opts)
        else:
            # --compare takes --size alone: webdataset's decode, then the
            # same resize and centre crop.
            ds = ds.decode(*specs)
            if "size" in opts:
                ds = ds.map(ResizeCrop(tuple(opts["size"])))
    if spec.fields:
        ds = ds.to_tuple(*spec.fields)
    return ds.batched(spec.batch_size)


class WebDatasetKind(DataKind):
    name = "WebDataset"
    summary = "tar shards streamed shard by shard (chute.wds.WebDataset, webdataset's API)"
    files = TAR_SHARDS
    index_driven = False
    sample_counter = "tar"
    takes = frozenset({"fields"})
    bench_label = "chute"
    reference_label = "torch+webdataset"

    def open(self, spec: OpenSpec) -> Any:
        import chute.wds

        return _pipeline(chute.wds, spec, chute_side=True)

    def bench_loader(self, spec: OpenSpec) -> tuple[str, Iterable[Any]]:
        from chute.loader.dataloader import DataLoader

        loader: DataLoader[Any] = DataLoader(
            self.open(spec), batch_size=None, num_workers=spec.workers
        )
        return self.bench_label, loader

    def reference_problem(self, spec: OpenSpec) -> str | None:
        from chute.remote import is_remote_url

        if set(spec.image_options) - {"size"}:
            return (
                "--compare runs webdataset's own decode, which has none of chute's image "
                "options but --size (resized and centre-cropped after it); "
                "benchmarks/bench_transforms.py compares them with Pillow-based transforms"
            )
        try:
            import webdataset  # noqa: F401
        except ImportError:
            return "--compare needs webdataset installed (pip install webdataset)"
        unread = [
            p for p in spec.paths if is_remote_url(p) and not p.startswith(("http:", "https:"))
        ]
        if unread:
            return (
                f"{unread[0]}: webdataset reads http(s) urls only (through curl); compare "
                "it on http(s) urls, or give both loaders pipe: urls"
            )
        return None

    def reference_loader(self, spec: OpenSpec) -> tuple[str, Iterable[Any]] | None:
        import torch.utils.data
        import webdataset

        ds = _pipeline(webdataset, spec, chute_side=False)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=int(spec.workers))
        return self.reference_label, loader


class TarDatasetKind(DataKind):
    name = "TarDataset"
    summary = "tar shards as a map-style dataset, samples read by offset through their index"
    files = TAR_SHARDS
    takes = frozenset({"fields"})
    compare_hint = "--compare runs webdataset over the shards: leave --kind at WebDataset"

    def open(self, spec: OpenSpec) -> Any:
        from chute.datasets.tardataset import TarDataset

        return TarDataset(
            spec.paths,
            decode=None if spec.decode == "raw" else spec.decode,
            fields=tuple(spec.fields) or None,
            storage_options=spec.storage_options or None,
            **spec.image_options,
        )


register_kind(WebDatasetKind())
register_kind(TarDatasetKind())
