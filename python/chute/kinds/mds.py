"""Mosaic streaming's MDS directories, read by ``MDSDataset`` (map-style
samples): ``index.json`` beside the ``shard.NNNNN.mds[.zstd]`` files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

from chute.common.errors import translate
from chute.kinds.registry import DataKind, FileFormat, OpenSpec, Target, register_kind
from chute.kinds.report import (
    block_columns,
    block_images,
    first_block_images,
    print_block_columns,
    print_problems,
)

# The file that makes a directory an MDS data set.
MDS_INDEX = "index.json"


def _dataset(target: Target) -> Any:
    from chute.datasets.mds import MDSDataset

    return MDSDataset(target.path, remote=target.remote)


def inspect_mds(target: Target, first: int) -> dict[str, Any]:
    """An MDS directory's shards (samples, bytes, compression each), its
    columns (encoding, and what MDSDataset makes of each), and the image
    columns' first `first` images probed."""
    report: dict[str, Any] = {"path": target.path, "kind": "mds", "problems": []}
    try:
        ds = _dataset(target)
    except Exception as exc:  # an unreadable index is a finding, not a crash
        report.update(shards=[], problems=[str(translate(exc))])
        return report
    shards = ds._shards
    first_shard = shards[0]
    encodings = dict(zip(first_shard.names, first_shard.encodings, strict=True))
    report.update(
        rows=len(ds),
        shards=[
            {
                "file": s.zip or s.raw,
                "samples": s.samples,
                "bytes": s.zip_bytes if s.zip else s.raw_bytes,
                "compression": s.compression,
            }
            for s in shards
        ],
        columns=block_columns(ds, lambda name: encodings[name]),
    )
    report["first_images"] = first_block_images(ds, first, report["problems"])
    return report


class MDSFiles(FileFormat):
    """MDS directories (told by their ``index.json``, of streaming's
    version 2), and such an ``index.json`` named itself."""

    name = "mds"
    noun = "an MDS index.json"
    plural = "MDS directories"
    directory_noun = "an MDS directory"

    def claims(self, target: Target) -> bool:
        if target.is_dir() or not target.path.rstrip("/").endswith(MDS_INDEX):
            return False
        return _is_mds_index(target)

    def claims_directory(self, target: Target) -> bool:
        index = target.child(MDS_INDEX)
        return index.exists() and _is_mds_index(index)

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        return inspect_mds(_directory_of(target), first=options.first)

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        r = report
        shards = r["shards"]
        compressions = sorted({s["compression"] or "none" for s in shards})
        print(
            f"{r['path']}: MDS directory, {len(shards)} shard(s)"
            f" (compression: {', '.join(compressions) or 'none'})",
            file=out,
        )
        if "rows" in r:
            print(f"  samples: {r['rows']}", file=out)
            print_block_columns(r, out)
        print_problems(r["problems"], out)

    def indexed_count(self, targets: Sequence[Target]) -> int | None:
        """The samples, from the directories' indexes."""
        try:
            return sum(len(_dataset(_directory_of(t))) for t in targets)
        except (OSError, ValueError):
            return None

    def images(self, paths: Sequence[str], columns: Sequence[str], count: int) -> list[bytes]:
        from chute.datasets.mds import MDSDataset

        dirs = [_directory_of(Target(p)).path for p in paths]
        return block_images(MDSDataset(dirs, columns=list(columns) or None), count)


def _is_mds_index(index: Target) -> bool:
    """Whether the JSON at `index` is an MDS index (its first bytes name
    the version and shards; a large index is not read whole here)."""
    head = index.head(4096)
    if b'"shards"' not in head and b'"version"' not in head:
        return False
    try:
        with index.reader() as read:
            data = json.loads(read(0, index.size()))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("shards"), list)


def _directory_of(target: Target) -> Target:
    """The directory of an MDS index named itself; a directory as it is."""
    path = target.path.rstrip("/")
    if not path.endswith(MDS_INDEX):
        return target
    return target.sibling(path[: -len(MDS_INDEX)].rstrip("/") or ".")


MDS_FILES = MDSFiles()


class MDSDatasetKind(DataKind):
    name = "MDSDataset"
    summary = "samples of Mosaic streaming's MDS directories (compressed shards too), map-style"
    files = MDS_FILES
    takes = frozenset({"columns"})
    compare_hint = "--compare runs webdataset over tar shards; MDSDataset has no reference here"

    def open(self, spec: OpenSpec) -> Any:
        from chute.datasets.mds import MDSDataset

        dirs = [_directory_of(Target(p)).path for p in spec.paths]
        return MDSDataset(
            dirs,
            columns=spec.columns or None,
            decode=spec.decode if spec.decode not in ("", "raw") else None,
            storage_options=spec.storage_options or None,
            cache_dir=spec.cache_dir,
            **spec.image_options,
        )


register_kind(MDSDatasetKind())
