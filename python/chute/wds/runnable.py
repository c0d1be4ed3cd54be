"""What the run of an epoch (``chute.wds.run``, ``chute.wds.parallel``) and
its elastic segment (``chute.wds.elastic_stream``) need of the dataset they
iterate. ``WebDataset`` is the dataset that has it; it imports those
modules, so they name this protocol rather than it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from chute.common.handlers import Handler
from chute.remote import RemoteOptions
from chute.stream.compiler import CompiledPipeline
from chute.stream.native import EngineSettings, ErrorHandlers
from chute.stream.stages import Stage


class RunnableDataset(Protocol):
    """A dataset of tar shards with recorded stages, as an epoch run reads
    it (see ``chute.wds.dataset.WebDataset`` for what each member means)."""

    urls: list[str]
    remote: RemoteOptions
    cache_dir: str | None
    pipe_timeout: float
    stages: list[Stage]
    seed: int
    handler: Handler
    shardshuffle: bool
    resampled: bool
    repeat_shards: bool
    streams: int
    shuffle_max_bytes: int
    repetitions: int
    epoch_items: int
    empty_check: bool
    elastic: bool
    even_batches: str
    finished_stats: dict[str, Any]

    def shard_urls(self) -> tuple[list[str], int]: ...

    def first_sample_extensions(self, urls: list[str]) -> list[str]: ...

    def compile_pipeline(
        self,
        first_sample_extensions: Callable[[], Sequence[str]],
        *,
        seed: int,
        shuffle_seed: int | None = None,
    ) -> CompiledPipeline: ...

    def state_fingerprint(self) -> dict[str, Any]: ...

    def even_count(self, compiled: CompiledPipeline, urls: list[str]) -> int | None: ...

    def make_plan(
        self,
        compiled: CompiledPipeline,
        urls: list[str],
        worker: int,
        rank: int,
        epoch: int,
        pass_index: int,
        settings: EngineSettings,
        handlers: ErrorHandlers,
    ) -> Any: ...
