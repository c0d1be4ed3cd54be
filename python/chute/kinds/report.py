"""What the formats' ``chute inspect`` reports share: sizes and problems
printed, and the columns and images of data sets read in blocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO


def human_size(n: float) -> str:
    """A byte count for people: "512 B", "1.5 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def print_problems(problems: list[str], out: TextIO) -> None:
    if not problems:
        print("  problems: none", file=out)
        return
    print(f"  problems ({len(problems)}):", file=out)
    for p in problems[:20]:
        print(f"    - {p}", file=out)
    if len(problems) > 20:
        print(f"    ... {len(problems) - 20} more", file=out)


# -- data sets of blocks (chute.datasets.blocks: ArrowDataset, MDSDataset) --------------


def _read_as(kind: Any) -> str:
    """What a block dataset makes of a column (its ColumnKind), for people."""
    if kind.image:
        return "image"
    if kind.kind == "encoded":
        return "bytes"
    if kind.kind == "tensor":
        shape = "" if not kind.shape else f" {tuple(kind.shape)}"
        return f"tensor {kind.dtype}{shape}"
    return "list"


def block_columns(ds: Any, type_of: Callable[[str], str]) -> list[dict[str, Any]]:
    """Each column of the block dataset `ds`: its stored type (`type_of`)
    and what the dataset makes of it."""
    return [
        {"name": name, "type": type_of(name), "read_as": _read_as(ds._kinds[name])}
        for name in ds.columns
    ]


def _image_bytes(value: Any) -> bytes | None:
    if isinstance(value, dict):  # the hub's image struct
        value = value.get("bytes")
    return value if isinstance(value, bytes) else None


def first_block_images(ds: Any, first: int, problems: list[str]) -> list[dict[str, Any]]:
    """The image columns' values in the first `first` rows of the block
    dataset `ds` (read undecoded), probed: format and size, or null;
    what cannot be read or probed is added to `problems`."""
    from chute import _core
    from chute.common.errors import translate

    found: list[dict[str, Any]] = []
    images = [name for name in ds.columns if ds._kinds[name].image]
    for row in range(min(first, len(ds)) if images else 0):
        try:
            values = ds[row]
        except Exception as exc:
            problems.append(f"row {row}: {translate(exc)}")
            break
        for name in images:
            data = _image_bytes(values[name])
            if data is None:
                found.append({"row": row, "column": name, "null": True})
                continue
            try:
                fmt, width, height = _core.probe_image(data, f"row {row}, column {name!r}")
            except Exception as exc:
                problems.append(f"row {row}, column {name!r}: {translate(exc)}")
                continue
            found.append(
                {"row": row, "column": name, "format": fmt, "width": width, "height": height}
            )
    return found


def block_images(ds: Any, count: int) -> list[bytes]:
    """Up to `count` encoded images of the block dataset `ds`'s image columns."""
    from chute import _core

    found: list[bytes] = []
    images = [name for name in ds.columns if ds._kinds[name].image]
    # Rows enough for `count` images where a few are null.
    for row in range(min(len(ds), 4 * count) if images else 0):
        for name in images:
            data = _image_bytes(ds[row][name])
            if data is None:
                continue
            try:
                _core.probe_image(data)
            except _core.DataError:
                continue
            found.append(data)
            if len(found) == count:
                return found
    return found


def print_block_columns(report: dict[str, Any], out: TextIO) -> None:
    """The columns and first images of a block dataset's report."""
    for c in report["columns"]:
        print(f"    {c['name']}: {c['type']} -> {c['read_as']}", file=out)
    for image in report["first_images"]:
        what = (
            "null" if image.get("null") else f"{image['format']} {image['width']}x{image['height']}"
        )
        print(f"  row {image['row']} {image['column']}: {what}", file=out)
