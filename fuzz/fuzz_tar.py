"""Fuzzes the tar parser and the key/extension grouping (SampleReader) with
in-memory shards: ``python fuzz/fuzz_tar.py [libFuzzer flags] [corpus dirs]``."""

from __future__ import annotations

import sys

import atheris
from common import ALLOWED, _core  # not instrumented: see common.py


def test_one(data: bytes) -> None:
    try:
        samples = _core.read_tar_bytes(data, "fuzz.tar")
    except ALLOWED:
        return
    # Invariants of a successful parse: keys are non-empty, offsets are
    # 512-aligned and increasing, and payloads fit in the input.
    last = -1
    for key, fields, offset in samples:
        assert isinstance(key, str) and fields, (key, fields)
        assert offset % 512 == 0 and offset > last, (offset, last)
        last = offset
        assert sum(len(v) for v in fields.values()) <= len(data)


def main() -> None:
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
