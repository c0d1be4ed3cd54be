#!/usr/bin/env python3
"""Reads native-dependencies.txt, the one list of the native libraries and
tools chute builds with (its header says what each column means).

    scripts/native_deps.py COLUMN [KEY=VALUE ...]

prints COLUMN's values, one a line, of the rows whose KEY columns hold
VALUE (a comma-separated list in a cell counts each item; "-" is none),
e.g. `native_deps.py debian needed_by=build` or
`native_deps.py soname wheel=bundled`. `native_deps.py --rows KEY=VALUE ...`
prints the matching rows whole, tab-separated, in the file's column order.
Standard library only: the set-up scripts run it before anything is
installed, on the device machine too.
"""

from __future__ import annotations

import sys
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent.parent / "native-dependencies.txt"
COLUMNS = (
    "name",
    "needed_by",
    "probe",
    "debian",
    "runtime",
    "almalinux",
    "wheel",
    "soname",
    "source",
    "device",
)


def read(path: Path = MANIFEST) -> list[dict[str, str]]:
    """The rows of the manifest, each a dict over COLUMNS."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = line.split()
        if len(cells) != len(COLUMNS):
            raise ValueError(
                f"{path}:{number}: {len(cells)} columns, expected {len(COLUMNS)} "
                f"({' '.join(COLUMNS)})"
            )
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def items(cell: str) -> list[str]:
    """A cell's values: its comma-separated items, none for "-"."""
    return [] if cell == "-" else cell.split(",")


def select(rows: list[dict[str, str]], **where: str) -> list[dict[str, str]]:
    """The rows whose every KEY cell lists VALUE."""
    for key in where:
        if key not in COLUMNS:
            raise ValueError(f"no column {key!r} (columns: {' '.join(COLUMNS)})")
    return [row for row in rows if all(value in items(row[key]) for key, value in where.items())]


def values(column: str, **where: str) -> list[str]:
    """COLUMN's items over the rows that `where` selects, in the file's order."""
    if column not in COLUMNS:
        raise ValueError(f"no column {column!r} (columns: {' '.join(COLUMNS)})")
    return [item for row in select(read(), **where) for item in items(row[column])]


def cibuildwheel_before_all() -> str:
    """pyproject's [tool.cibuildwheel.linux] before-all: the AlmaLinux 8
    packages the extension builds against."""
    return "dnf install -y " + " ".join(values("almalinux", needed_by="build"))


def main(argv: list[str]) -> int:
    whole_rows = argv[:1] == ["--rows"]
    if whole_rows:
        argv = argv[1:]
    elif not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    column, filters = ("", argv) if whole_rows else (argv[0], argv[1:])
    where = {}
    for pair in filters:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"not KEY=VALUE: {pair!r}", file=sys.stderr)
            return 2
        where[key] = value
    try:
        if whole_rows:
            for row in select(read(), **where):
                print("\t".join(row[c] for c in COLUMNS))
        else:
            for value in values(column, **where):
                print(value)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
