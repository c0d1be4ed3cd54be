"""A TarDataset's index: the shards' indexes as the engine's columns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chute.sources.tarindex import ShardColumns


@dataclass
class IndexColumns:
    """The whole dataset's index as the engine's columns."""

    sizes: list[int]
    mtimes_ns: list[int]
    versions: list[str]  # remote objects' ETags ("" where none is checked)
    headers_digests: list[str]
    extension_table: list[str]
    extensions: list[str]  # in order of first appearance
    everywhere: frozenset[str]  # extensions every sample has
    shard_starts: np.ndarray
    sample_offsets: np.ndarray
    key_starts: np.ndarray
    keys: np.ndarray  # uint8: the keys' bytes back to back
    member_starts: np.ndarray
    member_extensions: np.ndarray  # int32
    member_offsets: np.ndarray
    member_sizes: np.ndarray
    member_header_offsets: np.ndarray

    @property
    def num_samples(self) -> int:
        return int(self.sample_offsets.size)


def concatenate_indexes(shards: list[ShardColumns]) -> IndexColumns:
    """The shards' indexes as one dataset's columns (extensions numbered in
    order of first appearance)."""
    table: dict[str, int] = {}
    ext_ids: list[np.ndarray] = []
    for s in shards:
        ext_ids.append(
            np.array([table.setdefault(e, len(table)) for e in s.extensions], dtype=np.int32)
        )
    counts = [s.num_samples for s in shards]
    member_counts = np.concatenate([s.member_counts for s in shards]) if shards else np.zeros(0)
    key_bytes = [k.encode("utf-8", "surrogateescape") for s in shards for k in s.keys]
    member_extensions = np.concatenate(ext_ids) if ext_ids else np.zeros(0, dtype=np.int32)
    total = int(sum(counts))
    present = np.bincount(member_extensions, minlength=len(table))
    return IndexColumns(
        sizes=[s.size for s in shards],
        mtimes_ns=[s.mtime_ns for s in shards],
        versions=[s.version for s in shards],
        headers_digests=[s.headers_digest for s in shards],
        extension_table=list(table),
        extensions=list(table),
        everywhere=frozenset(e for e, i in table.items() if present[i] == total),
        shard_starts=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        sample_offsets=np.concatenate([s.offsets for s in shards]).astype(np.int64),
        key_starts=np.concatenate([[0], np.cumsum([len(k) for k in key_bytes])]).astype(np.int64),
        keys=np.frombuffer(b"".join(key_bytes), dtype=np.uint8),
        member_starts=np.concatenate([[0], np.cumsum(member_counts)]).astype(np.int64),
        member_extensions=member_extensions,
        member_offsets=np.concatenate([s.member_offsets for s in shards]).astype(np.int64),
        member_sizes=np.concatenate([s.member_sizes for s in shards]).astype(np.int64),
        member_header_offsets=np.concatenate([s.member_header_offsets for s in shards]).astype(
            np.int64
        ),
    )
