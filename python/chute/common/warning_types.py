"""Every warning class chute raises, in one place and one naming style
(what happened, then ``Warning``), so that users filter them by name
(``warnings.filterwarnings("error", category=chute.SlowPathWarning)``)
without knowing which module warns."""

from __future__ import annotations


class SkippedSampleWarning(UserWarning):
    """A bad sample was skipped under ``warn_and_continue``."""


class SlowPathWarning(UserWarning):
    """A dataset is read through the Python slow path: a layout or filter the
    native readers do not handle (docs/usage.md says which)."""


class IndexNotSavedWarning(UserWarning):
    """Indexes were built but could not be saved: the next open builds them again."""


class WorkerFallbackWarning(UserWarning):
    """A loader's dataset (or its ``worker_init_fn`` or ``collate_fn``)
    could not be sent to worker processes, so its Python stages run in the
    loader's process."""


class WorkerInitFnWarning(UserWarning):
    """``worker_init_fn`` was given for a dataset chute runs on native threads,
    where there are no worker processes to call it in."""


class SameDataOnEveryRankWarning(UserWarning):
    """A chute loader that does not partition its data is iterated under a
    process group of several ranks: every rank gets the same batches."""


class ForeignLoaderWarning(UserWarning):
    """A chute dataset is read by a loader that is not chute's (a framework
    rebuilt chute's loader, or built its own), bypassing chute's engine,
    its state and ``set_epoch``."""


# The names of earlier releases, kept so that filters written against them
# still match.
ChuteSlowPathWarning = SlowPathWarning
ChuteIndexWarning = IndexNotSavedWarning
