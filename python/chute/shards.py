"""Shard lists: brace expansion and splitting by node and by worker.

Splitters have webdataset's shape: a function from an iterator of
``{"url": ...}`` dicts to an iterator of them, so user-written splitters work
unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any
from urllib.parse import urlparse

import torch.distributed as dist
import torch.utils.data

Splitter = Callable[[Iterator[dict[str, Any]]], Iterator[dict[str, Any]]]

_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_urls(urls: str | Iterable[str]) -> list[str]:
    """Expand ``shard-{000000..000127}.tar`` patterns; ``::`` separates url groups."""
    if isinstance(urls, str):
        out: list[str] = []
        for part in urls.split("::"):
            out.extend(_expand_braces(part))
        return out
    result: list[str] = []
    for url in urls:
        result.extend(expand_urls(url))
    return result


def _expand_braces(url: str) -> list[str]:
    match = _BRACE.search(url)
    if match is None:
        return [url]
    first, last = match.group(1), match.group(2)
    width = len(first) if first.startswith("0") or len(first) == len(last) else 0
    lo, hi = int(first), int(last)
    if hi < lo:
        raise ValueError(f"empty brace range {{{first}..{last}}} in {url!r}")
    prefix, suffix = url[: match.start()], url[match.end() :]
    out: list[str] = []
    for i in range(lo, hi + 1):
        out.extend(_expand_braces(f"{prefix}{i:0{width}d}{suffix}"))
    return out


def local_path(url: str) -> str | None:
    """webdataset's ``__local_path__``: the path of a plain-file url, else None."""
    parsed = urlparse(url)
    return parsed.path if parsed.scheme in ("", "file") else None


def rank_and_world_size(group: object = None) -> tuple[int, int]:
    """From torch.distributed when initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group=group), dist.get_world_size(group=group)  # type: ignore[arg-type]
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def worker_and_num_workers() -> tuple[int, int]:
    """The torch DataLoader worker this code runs in, or (0, 1) in the main process."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def single_node_only(
    src: Iterator[dict[str, Any]], group: object = None
) -> Iterator[dict[str, Any]]:
    """Refuse to run on several nodes without an explicit node splitter."""
    _, world_size = rank_and_world_size(group)
    if world_size > 1:
        raise ValueError(
            "you need to add an explicit nodesplitter to your input pipeline "
            "for multi-node training"
        )
    yield from src


def split_by_node(src: Iterator[dict[str, Any]], group: object = None) -> Iterator[dict[str, Any]]:
    """Rank r of n takes shards r, r+n, r+2n, ..."""
    rank, world_size = rank_and_world_size(group)
    if world_size > 1:
        yield from islice(src, rank, None, world_size)
    else:
        yield from src


def split_by_worker(src: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Worker w of n (torch DataLoader processes) takes shards w, w+n, ..."""
    worker, num_workers = worker_and_num_workers()
    if num_workers > 1:
        yield from islice(src, worker, None, num_workers)
    else:
        yield from src


def apply_splitter(splitter: Splitter | None, urls: list[str]) -> list[str]:
    if splitter is None:
        return urls
    return [item["url"] for item in splitter(iter([{"url": u} for u in urls]))]
