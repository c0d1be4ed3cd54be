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

_ENV = re.compile(r"\$\{(\w+)\}")


def _env_lookup(match: re.Match[str]) -> str:
    name = "WDS_" + match.group(1)
    if name not in os.environ:
        raise ValueError(f"url names ${{{match.group(1)}}} but the environment has no {name}")
    return os.environ[name]


def expand_urls(urls: str | Iterable[str]) -> list[str]:
    """Expand ``shard-{000000..000127}.tar`` ranges and ``{train,val}``
    alternatives; ``::`` separates url groups; ``${NAME}`` is replaced by the
    environment variable ``WDS_NAME`` (all as webdataset does)."""
    if isinstance(urls, str):
        out: list[str] = []
        for part in urls.split("::"):
            for _ in range(10):  # substitutions may name further variables
                substituted = _ENV.sub(_env_lookup, part)
                if substituted == part:
                    break
                part = substituted
            out.extend(_expand_braces(part))
        return out
    result: list[str] = []
    for url in urls:
        result.extend(expand_urls(url))
    return result


def _brace_group(url: str) -> tuple[int, int] | None:
    """The span of the first top-level ``{...}`` of `url`, or None."""
    start = url.find("{")
    while start >= 0:
        depth = 0
        for i in range(start, len(url)):
            if url[i] == "{":
                depth += 1
            elif url[i] == "}":
                depth -= 1
                if depth == 0:
                    return start, i + 1
        start = url.find("{", start + 1)
    return None


def _split_top_level(body: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in body:
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += (ch == "{") - (ch == "}")
        current.append(ch)
    parts.append("".join(current))
    return parts


_RANGE = re.compile(r"\A(\d+)\.\.(\d+)\Z")


def _expand_braces(url: str) -> list[str]:
    span = _brace_group(url)
    if span is None:
        return [url]
    prefix, body, suffix = url[: span[0]], url[span[0] + 1 : span[1] - 1], url[span[1] :]
    match = _RANGE.match(body)
    if match is not None:
        first, last = match.group(1), match.group(2)
        width = len(first) if first.startswith("0") or len(first) == len(last) else 0
        lo, hi = int(first), int(last)
        if hi < lo:
            raise ValueError(f"empty brace range {{{first}..{last}}} in {url!r}")
        choices = [f"{i:0{width}d}" for i in range(lo, hi + 1)]
    else:
        choices = _split_top_level(body)
        if len(choices) == 1:
            # Not a brace expression (as in braceexpand): keep it literally.
            return [prefix + "{" + body + "}" + rest for rest in _expand_braces(suffix)]
    out: list[str] = []
    for choice in choices:
        out.extend(_expand_braces(prefix + choice + suffix))
    return out


def remote_scheme_list() -> str:
    """Every remote url scheme and alias chute reads, as the engine's table
    (remote_schemes()) orders them: "http://, https://, ...", for messages."""
    from chute.remote._stores import SCHEMES

    return ", ".join(f"{scheme}://" for scheme in SCHEMES)


def file_change_key(path: str) -> tuple[int, ...]:
    """What changes whenever a local file's bytes do: its device and inode,
    size, modification time and status-change time (which a file's owner
    cannot set back, as `os.utime` sets the modification time back)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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
