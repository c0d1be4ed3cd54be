"""Shared parts of the atheris harnesses: which exceptions are allowed.

A harness passes when chute either returns or raises one of its documented
exceptions for bad input (DataError, ReadError, ValueError for a usage error,
TimeoutError). Anything else (a crash, a MemoryError from trusting a declared
size, a SystemError from a binding, a KeyError...) is a finding: it is
re-raised so that atheris stops and saves the input.

Coverage: the parsers are C++ in chute._core, which is not built with
-fsanitize=fuzzer here, and instrumenting the Python imports would only
instrument torch (imported by chute's package) at great cost for no signal.
So atheris runs as a fast mutation fuzzer around the seed corpus; building
_core with libFuzzer's coverage (clang, -fsanitize=fuzzer-no-link) would
turn it into a coverage-guided one.
"""

from __future__ import annotations

import os
import sys

# Run against the work tree (scripts/dev_build.sh links _core into python/chute).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

# The test-only module (the whole decode); dev_build.sh links it into python/ too.
import chute_testing  # noqa: E402, F401
from chute import _core  # noqa: E402

ALLOWED: tuple[type[BaseException], ...] = (
    _core.DataError,
    _core.ReadError,
    ValueError,  # DataError's base; also kUsage errors
    TimeoutError,
)
