"""Arrow IPC data, read by ``ArrowDataset`` (map-style rows): Hugging Face
``datasets``' ``save_to_disk`` directories and cache files, Feather v2 and
any Arrow IPC file or stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from chute.common.errors import translate
from chute.kinds.registry import DataKind, FileFormat, OpenSpec, Target, register_kind
from chute.kinds.report import (
    block_columns,
    block_images,
    first_block_images,
    human_size,
    print_block_columns,
    print_problems,
)

# The IPC file format starts with this magic; the IPC stream format (what
# save_to_disk writes) with a message, whose length follows this marker.
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_CONTINUATION = b"\xff\xff\xff\xff"
# save_to_disk's directory lists its files here.
SAVED_STATE = "state.json"


def _dataset(target: Target) -> Any:
    from chute.datasets.arrow import ArrowDataset

    return ArrowDataset(target.path, remote=target.remote)


def inspect_arrow(target: Target, first: int) -> dict[str, Any]:
    """An Arrow file's or save_to_disk directory's files (rows and record
    batches each), its columns (type, and what ArrowDataset makes of each),
    and the image columns' first `first` images probed."""
    report: dict[str, Any] = {"path": target.path, "kind": "arrow", "problems": []}
    try:
        ds = _dataset(target)
    except Exception as exc:  # an unreadable header is a finding, not a crash
        report.update(files=[], problems=[str(translate(exc))])
        return report
    report.update(
        rows=len(ds),
        files=[
            {
                "url": f.url,
                "size": f.size,
                "rows": sum(b.rows for b in f.batches),
                "record_batches": len(f.batches),
            }
            for f in ds._files
        ],
        columns=block_columns(ds, lambda name: str(ds._files[0].schema.field(name).type)),
    )
    report["first_images"] = first_block_images(ds, first, report["problems"])
    return report


class ArrowFiles(FileFormat):
    """Arrow IPC files (told by the file format's magic or the stream
    format's first message marker) and ``save_to_disk`` directories (told
    by their ``state.json``)."""

    name = "arrow"
    noun = "an Arrow IPC file"
    plural = "Arrow IPC files"
    directory_noun = "a datasets save_to_disk directory"

    def claims(self, target: Target) -> bool:
        if target.is_dir():
            return False
        head = target.head(8)
        return head.startswith(ARROW_FILE_MAGIC) or head[:4] == ARROW_STREAM_CONTINUATION

    def claims_directory(self, target: Target) -> bool:
        return target.child(SAVED_STATE).exists()

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        return inspect_arrow(target, first=options.first)

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        r = report
        size = sum(f["size"] for f in r["files"])
        print(f"{r['path']}: Arrow data, {len(r['files'])} file(s), {human_size(size)}", file=out)
        if "rows" in r:
            batches = sum(f["record_batches"] for f in r["files"])
            print(f"  rows: {r['rows']}   record batches: {batches}", file=out)
            print_block_columns(r, out)
        print_problems(r["problems"], out)

    def indexed_count(self, targets: Sequence[Target]) -> int | None:
        """The rows, from the files' message headers."""
        try:
            return sum(len(_dataset(t)) for t in targets)
        except (OSError, ValueError):
            return None

    def images(self, paths: Sequence[str], columns: Sequence[str], count: int) -> list[bytes]:
        from chute.datasets.arrow import ArrowDataset

        return block_images(ArrowDataset(list(paths), columns=list(columns) or None), count)


ARROW_FILES = ArrowFiles()


class ArrowDatasetKind(DataKind):
    name = "ArrowDataset"
    summary = (
        "rows of Arrow IPC files and datasets' save_to_disk directories, memory-mapped, map-style"
    )
    files = ARROW_FILES
    takes = frozenset({"columns"})
    compare_hint = (
        "--compare runs webdataset over tar shards; benchmarks/bench_parquet.py --part arrow "
        "compares ArrowDataset with Hugging Face datasets"
    )

    def open(self, spec: OpenSpec) -> Any:
        from chute.datasets.arrow import ArrowDataset

        return ArrowDataset(
            spec.paths,
            columns=spec.columns or None,
            decode=spec.decode if spec.decode not in ("", "raw") else None,
            storage_options=spec.storage_options or None,
            cache_dir=spec.cache_dir,
            **spec.image_options,
        )


register_kind(ArrowDatasetKind())
