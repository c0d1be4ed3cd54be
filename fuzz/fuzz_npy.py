"""Fuzzes the npy header parser and payload copy:
``python fuzz/fuzz_npy.py [libFuzzer flags] [corpus dirs]``."""

from __future__ import annotations

import sys

import atheris
from common import ALLOWED, _core  # not instrumented: see common.py


def test_one(data: bytes) -> None:
    try:
        array = _core.decode_npy(data)
    except ALLOWED:
        return
    # A decoded array never claims more payload than the input holds.
    assert array.nbytes <= len(data), (array.shape, array.dtype, len(data))


def main() -> None:
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
