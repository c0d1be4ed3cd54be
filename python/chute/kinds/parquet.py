"""Parquet files, and the two kinds that read them: ``ParquetDataset``
(map-style rows) and ``ParquetStream`` (row groups as the shards of a
webdataset stream)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from chute.common.errors import translate
from chute.kinds.registry import DataKind, FileFormat, OpenSpec, Target, register_kind
from chute.kinds.report import human_size, print_problems

# Parquet files start (and end) with this magic.
PARQUET_MAGIC = b"PAR1"


def inspect_parquet(target: Target, first: int) -> dict[str, Any]:
    """A Parquet file's rows, row groups and columns (each one's type, what
    ParquetDataset makes of it and its stored bytes), and the image columns'
    first `first` images probed (format and size)."""
    from chute import _core
    from chute.datasets.parquet import ParquetDataset
    from chute.datasets.parquet_columns import column_kind

    path = target.path
    report: dict[str, Any] = {"path": path, "kind": "parquet", "problems": []}
    try:
        ds = ParquetDataset(path, remote=target.remote)
    except Exception as exc:  # an unreadable footer is a finding, not a crash
        report.update(size=target.size(), problems=[str(translate(exc))])
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
        plain = ParquetDataset(path, images, remote=target.remote)
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


class ParquetFiles(FileFormat):
    """Parquet files: told by their magic."""

    name = "parquet"
    noun = "a Parquet file"
    plural = "Parquet files"

    def claims(self, target: Target) -> bool:
        return not target.is_dir() and target.head(4) == PARQUET_MAGIC

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        return inspect_parquet(target, first=options.first)

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        r = report
        print(f"{r['path']}: Parquet file, {human_size(r['size'])}", file=out)
        if "rows" in r:
            low, high = r["row_group_rows"]
            print(
                f"  rows: {r['rows']}   row groups: {r['row_groups']} ({low}..{high} rows each)",
                file=out,
            )
            for c in r["columns"]:
                print(
                    f"    {c['name']}: {c['type']} -> {c['read_as']},"
                    f" {human_size(c['stored_bytes'])}",
                    file=out,
                )
            for image in r["first_images"]:
                what = (
                    "null"
                    if image.get("null")
                    else (f"{image['format']} {image['width']}x{image['height']}")
                )
                print(f"  row {image['row']} {image['column']}: {what}", file=out)
        print_problems(r["problems"], out)

    def indexed_count(self, targets: Sequence[Target]) -> int | None:
        """The rows, from the files' footers."""
        from chute.datasets.parquet import ParquetDataset

        if not targets:
            return 0
        try:
            return len(ParquetDataset([t.path for t in targets], remote=targets[0].remote))
        except (OSError, ValueError):
            return None

    def images(self, paths: Sequence[str], columns: Sequence[str], count: int) -> list[bytes]:
        import pyarrow.parquet as pq

        from chute import _core

        found: list[bytes] = []
        for path in paths:
            table = pq.ParquetFile(path).read_row_group(0, columns=list(columns) or None)
            for column in table.columns:
                for value in column.to_pylist():
                    if isinstance(value, dict):  # the hub's image struct
                        value = value.get("bytes")
                    if not isinstance(value, bytes):
                        continue
                    try:
                        _core.probe_image(value)
                    except _core.DataError:
                        continue
                    found.append(value)
                    if len(found) == count:
                        return found
        return found


PARQUET_FILES = ParquetFiles()

_NO_REFERENCE = (
    "--compare runs webdataset over tar shards; benchmarks/bench_parquet.py compares "
    "Parquet with Hugging Face datasets"
)


class ParquetDatasetKind(DataKind):
    name = "ParquetDataset"
    summary = "rows of Parquet files (the hub's image structs too), map-style"
    files = PARQUET_FILES
    takes = frozenset({"columns"})
    compare_hint = _NO_REFERENCE
    bench_label = "chute (parquet)"

    def open(self, spec: OpenSpec) -> Any:
        from chute.datasets.parquet import ParquetDataset

        return ParquetDataset(
            spec.paths,
            columns=spec.columns or None,
            decode=spec.decode if spec.decode not in ("", "raw") else None,
            storage_options=spec.storage_options or None,
            cache_dir=spec.cache_dir,
            **spec.image_options,
        )


class ParquetStreamKind(DataKind):
    name = "ParquetStream"
    summary = "Parquet row groups as the shards of a webdataset stream (chute.ParquetStream)"
    files = PARQUET_FILES
    index_driven = False
    sample_counter = "parquet"
    takes = frozenset({"columns"})
    compare_hint = _NO_REFERENCE

    def open(self, spec: OpenSpec) -> Any:
        from chute.table_streams.parquet import ParquetStream

        ds = ParquetStream(
            spec.paths,
            spec.columns or None,
            shardshuffle=False,
            storage_options=spec.storage_options or None,
            cache_dir=spec.cache_dir,
        )
        if spec.decode != "raw":
            ds = ds.decode(*((spec.decode,) if spec.decode else ()), **spec.image_options)
        return ds.batched(spec.batch_size)

    def bench_loader(self, spec: OpenSpec) -> tuple[str, Iterable[Any]]:
        from chute.loader.dataloader import DataLoader

        loader: DataLoader[Any] = DataLoader(
            self.open(spec), batch_size=None, num_workers=spec.workers
        )
        return self.bench_label, loader


register_kind(ParquetDatasetKind())
register_kind(ParquetStreamKind())
