"""What chute's loaders do inside the training frameworks that own the loop
(PyTorch Lightning, Hugging Face Accelerate and the transformers Trainer;
docs/frameworks.md has the recipes). No framework is imported here: their
objects are recognised by what they are when chute meets them.

- Partition across ranks: whether a loader gives each rank its own part
  (`partitions_itself`); a loader that does not, iterated under a process
  group of several ranks, warns once that every rank gets the same data
  (`SameDataOnEveryRankWarning`).
- Accelerate: ``accelerator.prepare`` rebuilds any ``DataLoader`` as a
  torch loader over its dataset (chute's engine then runs only through
  ``__getitems__``) and shards it again, unless the loader says it is
  prepared already. A chute loader that partitions itself, or runs in one
  process, says so (`keeps_itself_under_accelerate`), and is used as is.
- Foreign loaders: a chute dataset read by a loader that is not chute's
  under several ranks (a framework built it: the Trainer over
  ``train_dataset``; or rebuilt chute's loader: accelerate's ``prepare`` or
  ``skip_first_batches``, the Trainer's mid-epoch resume) warns
  (`ForeignLoaderWarning`): chute's engine, its state and ``set_epoch`` are
  bypassed. When a chute loader over it partitions across ranks itself,
  the foreign loader's batches are a partition taken twice (or an epoch
  order the loader's ``set_epoch`` never reached): that raises.
- Lightning's prefetch: without ``len()`` Lightning's fetcher pulls a batch
  ahead of the training step, and takes the loader's state while it holds
  that batch. A chute loader iterated by that fetcher keeps the states
  after its last few batches and answers ``state_dict()`` with the one the
  step has reached (`PrefetchView`).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch.distributed as dist
from torch.utils.data import DistributedSampler

from chute.common.warning_types import ForeignLoaderWarning, SameDataOnEveryRankWarning
from chute.loader.skipped_batches import refuse_skipping_rebuild
from chute.sources.shards import single_node_only, split_by_node, split_by_worker


def process_group_size() -> int:
    """The world size of an initialized torch.distributed process group, else 1."""
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def stream_splits_across_ranks(dataset: Any) -> bool | None:
    """Whether a stream gives each rank its own samples: a node splitter
    (``split_by_node`` or one of the user's), an elastic or resampled
    stream (each rank its own draws); False when it reads everything on
    every rank; None when chute cannot tell."""
    native = dataset.native() if callable(getattr(dataset, "native", None)) else dataset
    if native is None:
        stages = getattr(dataset, "pipeline", None)
        return _shard_stages_split(stages) if isinstance(stages, list) else None
    sources = getattr(native, "sources", None)
    if isinstance(sources, (list, tuple)) and sources:
        each = [stream_splits_across_ranks(source) for source in sources]
        return None if None in each else all(each)
    if getattr(native, "elastic", False) or getattr(native, "resampled", False):
        return True
    if not hasattr(native, "nodesplitter"):
        return None
    splitter = native.nodesplitter
    stages = getattr(splitter, "stages", None)
    if isinstance(stages, list):  # a DataPipeline's stages before its tar reader
        return _shard_stages_split(stages)
    if splitter is None:
        return False
    # single_node_only refuses several ranks itself; anything else splits.
    return splitter is not single_node_only


def _shard_stages_split(stages: list[Any]) -> bool | None:
    """Whether pipeline stages split across ranks: True with
    ``split_by_node``, False when they hold nothing that could (only the
    worker split), None for stages of the user's."""
    if any(stage is split_by_node for stage in stages):
        return True
    return False if all(stage is split_by_worker for stage in stages) else None


def partitions_itself(loader: Any) -> bool | None:
    """Whether `loader` gives each rank its own part of the data: a sampler
    that deals to ranks (``DistributedSampler``, chute's elastic, curriculum
    and mix samplers), or a stream that splits across ranks; None when
    chute cannot tell."""
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(sampler, DistributedSampler) or hasattr(sampler, "num_replicas"):
            return True
    native = getattr(loader, "_native", None)
    if native is not None and not native.index_driven:
        return stream_splits_across_ranks(native)
    return False


def warn_if_same_data_on_every_rank(loader: Any) -> None:
    """Once per loader: warns when `loader` is iterated under a process
    group of several ranks without partitioning its data."""
    world_size = process_group_size()
    if world_size <= 1 or getattr(loader, "_told_same_data", False):
        return
    if partitions_itself(loader) is not False:
        return
    loader._told_same_data = True
    fix = (
        "pass distributed=True"
        if getattr(loader, "_native", None) is None or loader._native.index_driven
        else "split the shards with nodesplitter=chute.wds.split_by_node (or elastic=True)"
    )
    warnings.warn(
        f"chute.DataLoader over {type(loader.dataset).__name__} is iterated on each of "
        f"{world_size} ranks without a partition: every rank gets the same data; {fix} "
        "(see docs/frameworks.md)",
        SameDataOnEveryRankWarning,
        stacklevel=3,
    )


def keeps_itself_under_accelerate(loader: Any) -> bool:
    """Whether ``accelerator.prepare`` should use `loader` as is (its
    ``_is_accelerate_prepared``): it partitions across ranks itself, or
    there is one process, so sharding it again would take a part of a part
    and rebuilding it would bypass chute's engine. When it is False for a
    chute dataset, accelerate is about to rebuild the loader: that warns."""
    if getattr(loader, "_native", None) is None:
        return False
    world_size = process_group_size()
    if world_size <= 1 or partitions_itself(loader) is True:
        return True
    warnings.warn(
        f"accelerate rebuilds this chute.DataLoader over {type(loader.dataset).__name__} as a "
        f"torch DataLoader sharded across {world_size} ranks, since it does not partition "
        "itself: chute's engine, its state_dict() and its threads are bypassed (num_workers "
        "becomes worker processes). Pass distributed=True (or split a stream across ranks) "
        "and accelerate uses it as is (docs/frameworks.md)",
        ForeignLoaderWarning,
        stacklevel=4,
    )
    return False


# The chute loaders built over each dataset (weakly: a loader collected is
# no longer an owner), and the datasets already warned about.
_owners: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
_warned_foreign: weakref.WeakSet[Any] = weakref.WeakSet()


def register_owner(dataset: Any, loader: Any) -> None:
    """Records that the chute loader `loader` runs `dataset`."""
    with contextlib.suppress(TypeError):  # a dataset that cannot be weakly referenced
        _owners.setdefault(dataset, weakref.WeakSet()).add(loader)


def check_foreign_read(dataset: Any, how: str) -> None:
    """Called where a loader that is not chute's reads `dataset` (`how`:
    ``__getitems__`` or ``__iter__``) under a process group of several
    ranks: raises when a chute loader built over `dataset` partitions it
    across ranks itself, else warns once per dataset. (In one process a
    torch loader over a chute dataset is a supported way to read it, and a
    stream iterated directly, with no chute loader over it, is webdataset's
    own way under any number of ranks.)"""
    try:
        owners = list(_owners.get(dataset, ()))
    except TypeError:  # a dataset that cannot be weakly referenced
        return
    refuse_skipping_rebuild(dataset, owners)
    world_size = process_group_size()
    if world_size <= 1:
        return
    if not owners and how == "__iter__":
        return
    name = type(dataset).__name__
    if any(partitions_itself(o) for o in owners):
        raise ValueError(
            f"{name} is read through {how} by a loader that is not its chute.DataLoader, "
            f"on {world_size} ranks, while that chute.DataLoader gives each rank its own "
            "part: a framework rebuilt it (accelerate's prepare or skip_first_batches, the "
            "Trainer's mid-epoch resume), so its batches are a part of a part, or an "
            "order its set_epoch never reached. Hand the chute.DataLoader to the framework "
            "as is and resume from its state_dict() (docs/frameworks.md)"
        )
    if dataset in _warned_foreign:
        return
    _warned_foreign.add(dataset)
    warnings.warn(
        f"{name} is read through {how} by a loader that is not chute's, on {world_size} "
        "ranks (a framework built it, or rebuilt chute's loader: the Trainer over "
        "train_dataset, accelerate's prepare); chute's engine, its state_dict() and "
        "set_epoch are bypassed. Iterate a chute.DataLoader with distributed=True (or a "
        "stream split across ranks) and hand it to the framework as is (docs/frameworks.md)",
        ForeignLoaderWarning,
        stacklevel=3,
    )


class LightningFetch:
    """Lightning's ``_PrefetchDataFetcher`` creating an iterator of a loader,
    and the epoch Lightning is setting up when it does so from
    ``_FitLoop.setup_data`` (None from elsewhere: the epoch loop creates
    later epochs' iterators after it told the sampler the epoch)."""

    def __init__(self, fetcher: Any, epoch: int | None) -> None:
        self.fetcher = fetcher
        self.epoch = epoch


def lightning_fetch(depth: int = 16) -> LightningFetch | None:
    """The `LightningFetch` when Lightning's prefetching fetcher is what is
    creating an iterator of a loader right now (it calls ``iter(loader)``
    from its own ``__iter__``), else None. Looked up on the caller's stack,
    since Lightning hands the loader nothing; only when Lightning is
    imported."""
    if "lightning.pytorch" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return None
    fetcher = None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        # Only Lightning's loop frames are read: reading a frame's f_locals
        # leaves a snapshot of its locals on the frame, which would keep the
        # caller's objects (its dataset, say) alive after it drops them.
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("lightning.pytorch.loops", "pytorch_lightning.loops")):
            owner = frame.f_locals.get("self")
            kind = type(owner)
            if fetcher is None and kind.__name__ == "_PrefetchDataFetcher":
                fetcher = owner
            elif fetcher is not None and frame.f_code.co_name == "setup_data":
                progress = getattr(owner, "epoch_progress", None)
                processed = getattr(getattr(progress, "current", None), "processed", None)
                return LightningFetch(fetcher, processed if isinstance(processed, int) else None)
        frame = frame.f_back
    return None if fetcher is None else LightningFetch(fetcher, None)


class PrefetchView:
    """The states of a loader after each of its last few batches, while
    Lightning's fetcher iterates it: ``state()`` is the state after the
    batches the fetcher has handed to the training step (those it holds
    ahead are not counted)."""

    def __init__(self, fetcher: Any, before_first: dict[str, Any]) -> None:
        self._fetcher = weakref.ref(fetcher)
        ahead = int(getattr(fetcher, "prefetch_batches", 1))
        self.states: deque[dict[str, Any]] = deque([before_first], maxlen=ahead + 1)

    def state(self) -> dict[str, Any] | None:
        """None when the fetcher is gone."""
        fetcher = self._fetcher()
        if fetcher is None:
            return None
        held = len(getattr(fetcher, "batches", ()))
        return self.states[max(0, len(self.states) - 1 - held)]


def behind_prefetch(loader: Any, items: Iterator[Any], fetch: LightningFetch) -> Iterator[Any]:
    """`items` of `loader`, with a `PrefetchView` as the loader's
    ``_prefetch_view`` while they run: the state after each batch is
    recorded as it is handed on. A fetcher that knows the loader's length
    (it has read it by the first batch) pulls nothing ahead. Lightning's
    fit loop pulls the first batch of an epoch before it tells the sampler
    the epoch (``_FitLoop.setup_data`` runs first): the epoch it is setting
    up is told here, unless the iteration resumes a loaded state."""
    fetcher = fetch.fetcher
    if getattr(fetcher, "length", None) is not None:
        yield from items
        return
    if fetch.epoch is not None and loader._resume is None:
        loader.set_epoch(fetch.epoch)
    view = PrefetchView(fetcher, loader._next_state())
    loader._prefetch_view = view
    try:
        for batch in items:
            view.states.append(loader._current_state())
            yield batch
    finally:
        if loader._prefetch_view is view:
            loader._prefetch_view = None
