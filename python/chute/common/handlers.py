"""Error handlers with webdataset's names and meaning.

A handler receives the exception of a bad sample and returns True to skip it
and go on, False to stop the iteration, or raises. chute recognises the three
below and runs them natively (the engine skips and counts the sample); any
other callable is called from the consumer thread for each skipped sample.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from chute.common.warning_types import SkippedSampleWarning

Handler = Callable[[BaseException], bool]


def reraise_exception(exn: BaseException) -> bool:
    """Stop at the first bad sample: the exception propagates."""
    raise exn


def warn_and_continue(exn: BaseException) -> bool:
    """Warn about the bad sample and go on (webdataset sleeps here; chute does not)."""
    warnings.warn(str(exn), SkippedSampleWarning, stacklevel=2)
    return True


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip the bad sample silently (it is still counted in ``stats()``)."""
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """End the iteration quietly at the first bad sample."""
    return False


def warn_and_stop(exn: BaseException) -> bool:
    """Warn and end the iteration at the first bad sample."""
    warnings.warn(str(exn), SkippedSampleWarning, stacklevel=2)
    return False
