"""Sidecar indexes for tar shards (``chute index``).

A shard ``data/shard-000000.tar`` gets ``data/shard-000000.tar.idx.json``::

    {
      "format": "chute-tar-index",
      "version": 1,
      "shard": "shard-000000.tar",       # basename, so shard and index move together
      "shard_size": 1290240,             # bytes; a shard of another size is stale
      "shard_mtime_ns": 1764108000000000000,
      "samples": [
        {"key": "img000000", "offset": 0,
         "members": [["cls", 512, 1], ["jpg", 1536, 20931]]},
        ...
      ]
    }

Per sample: its key, the byte offset of its first member's header, and per
member ``[extension, payload offset, payload size]``, in archive order. The
payload offset points at the first byte of the member's data (after any PAX
or GNU long-name headers), so one ``pread(size, offset)`` reads it. Samples are
grouped by the engine's own rule, which ``_core.list_tar_payloads`` reports
per member (``csrc/tar/sample_key.h``): the key is the member path up to the
first dot of its basename, the extension the rest, lowercased; consecutive
members with the same key form one sample; metadata members (``__*__``) and
names without an extension are left out. A shard with a GNU sparse member
cannot be indexed: its payload is not one range of the shard.

JSON rather than a binary table: an index is read once per shard at open, its
size is about 60 bytes per member, and it stays readable with any tool.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from chute import _core
from chute.extensions import SAMPLE_FIELDS

INDEX_SUFFIX = ".idx.json"
FORMAT = "chute-tar-index"
VERSION = 1


def index_path(shard: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(shard) + INDEX_SUFFIX)


def build_index(shard: str | os.PathLike[str]) -> dict[str, Any]:
    """Scans a shard once (headers only) and returns its index document.

    Raises ``chute.DataError`` for a corrupt or truncated shard and
    ``ValueError`` for a sample that repeats an extension (a reader drops
    the repeat) or a sparse member.
    """
    path = os.fspath(shard)
    st = os.stat(path)
    samples: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for name, header_offset, data_offset, size, key, extension in _core.list_tar_payloads(path):
        if key is None or extension is None:
            continue
        if data_offset is None:
            raise ValueError(
                f"{path}: member {name!r} at offset {header_offset} is a sparse file, whose"
                " payload is not one range of the shard; it cannot be indexed"
            )
        if current is None or current["key"] != key:
            current = {"key": key, "offset": int(header_offset), "members": []}
            samples.append(current)
        if extension in SAMPLE_FIELDS or any(m[0] == extension for m in current["members"]):
            raise ValueError(
                f"{path}: member {name!r} at offset {header_offset} repeats extension"
                f" {extension!r} of sample {key!r}"
            )
        current["members"].append([extension, int(data_offset), int(size)])
    return {
        "format": FORMAT,
        "version": VERSION,
        "shard": os.path.basename(path),
        "shard_size": int(st.st_size),
        "shard_mtime_ns": int(st.st_mtime_ns),
        "samples": samples,
    }


def write_index(
    shard: str | os.PathLike[str], output: str | os.PathLike[str] | None = None
) -> Path:
    """Builds the index of ``shard`` and writes it next to it (or to ``output``)
    atomically, so a reader never sees half an index."""
    document = build_index(shard)
    target = Path(output) if output is not None else index_path(shard)
    tmp = target.with_name(target.name + ".tmp")
    # One sample per line: compact, yet diffable and greppable.
    lines = [json.dumps(s, separators=(",", ":")) for s in document["samples"]]
    head = {k: v for k, v in document.items() if k != "samples"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "samples": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target


def read_index(shard: str | os.PathLike[str], check: bool = True) -> dict[str, Any]:
    """Loads the sidecar index of ``shard``; with ``check``, refuses one whose
    shard has changed size or modification time since it was written."""
    path = index_path(shard)
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if document.get("format") != FORMAT or document.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} version {VERSION} file")
    if check:
        st = os.stat(shard)
        if st.st_size != document["shard_size"] or st.st_mtime_ns != document["shard_mtime_ns"]:
            raise ValueError(f"{path} is stale: {os.fspath(shard)} changed after it was indexed")
    return document
