"""Token files (raw ``.bin``, ``.npy``, Megatron ``.bin`` + ``.idx``), read
by ``TokenDataset`` (packed sequences: windows or whole documents)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from chute.kinds.registry import DataKind, FileFormat, PathError, Target, register_kind
from chute.kinds.report import human_size, print_problems

TOKEN_SUFFIXES = (".bin", ".idx", ".npy")
NPY_MAGIC = b"\x93NUMPY"


def _token_spec(target: Target) -> Any:
    """How TokenDataset reads the file; a remote ``.bin`` with an ``.idx``
    beside it is a Megatron pair here too."""
    from chute.datasets.tokens import TokenFileSpec, token_file_spec

    path = target.path
    spec = token_file_spec(path)
    if spec.format == "raw" and path.endswith(".bin") and target.is_remote:
        index = path[: -len(".bin")] + ".idx"
        if target.sibling(index).exists():
            return TokenFileSpec(path, "megatron", index)
    return spec


def _npy_header_bytes(target: Target) -> int:
    """The bytes of a .npy file before its data (its magic's, when it has no
    .npy magic: the check then names what is wrong)."""
    prefix = target.head(12)
    if not prefix.startswith(NPY_MAGIC) or len(prefix) < 12:
        return len(prefix)
    if prefix[6] == 1:
        return 10 + int.from_bytes(prefix[8:10], "little")
    return 12 + int.from_bytes(prefix[8:12], "little")


@contextlib.contextmanager
def _checkable(
    spec: Any, target: Target, whole: bool
) -> Iterator[tuple[Any, Callable[[str], str]]]:
    """The spec of local files the engine's TokenFile checks in place of
    `spec`'s, and a function that puts the urls back into its messages. A
    local spec is itself. A remote file becomes a local file of its size
    holding only what the check reads: the .npy header, or nothing of a raw
    or Megatron .bin (its .idx is fetched whole), so the engine judges it as
    it judges a local one; `whole` fetches all of the tokens (to find the
    documents of a raw or .npy file by their end token)."""
    from chute.datasets.tokens import TokenFileSpec

    if not target.sibling(spec.url).is_remote:
        yield spec, lambda message: message
        return
    with tempfile.TemporaryDirectory(prefix="chute-inspect-") as directory:
        names: dict[str, str] = {}

        def place(url: str, head: int | None) -> str:
            local = os.path.join(directory, url.rsplit("/", 1)[-1])
            target.sibling(url).stand_in(local, head)
            names[local] = url
            return local

        if spec.format == "npy":
            head = None if whole else _npy_header_bytes(target.sibling(spec.url))
        else:
            head = None if whole and spec.format == "raw" else 0
        index = place(spec.index_url, None) if spec.index_url else ""
        local_spec = TokenFileSpec(place(spec.url, head), spec.format, index)

        def named(message: str) -> str:
            for local, url in names.items():
                message = message.replace(local, url)
            return message

        yield local_spec, named


def inspect_tokens(target: Target, dtype: str | None, eod_id: int | None) -> dict[str, Any]:
    """A token file's format, dtype and tokens; its documents (Megatron's,
    or ended by `eod_id`) and their lengths. A remote file is read by
    ranges: a Megatron pair's .idx, a .npy's header, all of the tokens only
    to find documents by `eod_id`."""
    from chute import _core

    report: dict[str, Any] = {
        "path": target.path,
        "kind": "tokens",
        "format": None,
        "index": None,
        "size": None,
        "dtype": None,
        "tokens": None,
        "documents": None,
        "document_lengths": None,
        "problems": [],
    }
    try:
        spec = _token_spec(target)
        report.update(format=spec.format, index=spec.index_url or None)
        data = target.sibling(spec.url)
        if data.is_remote:
            report["size"] = data.size()
        elif os.path.isfile(spec.url):
            report["size"] = os.path.getsize(spec.url)
    except PathError as exc:  # a remote object that cannot be read
        report["problems"].append(str(exc))
        return report
    if spec.format == "raw" and dtype is None:
        report["problems"].append("a raw token file has no header: give --dtype (e.g. uint16)")
        return report
    by_eod = spec.format != "megatron" and eod_id is not None
    try:
        with _checkable(spec, target, whole=by_eod) as (local, named):
            try:
                f = _core.TokenFile(local.url, local.format, dtype or "", local.index_url)
                report.update(dtype=f.dtype, tokens=int(f.num_tokens))
                if spec.format != "megatron" and eod_id is None:
                    return report
                # The documents packing would see; the sequence length only
                # matters to packing, not to the lengths.
                packer = _core.TokenPacker(
                    [f], 1 << 20, "documents", -1 if eod_id is None else eod_id
                )
                lengths = packer.document_lengths()
            except (ValueError, OSError) as exc:  # the file's own fault, reported as found
                report["problems"].append(named(str(exc)))
                return report
    except PathError as exc:
        report["problems"].append(str(exc))
        return report
    report["documents"] = int(lengths.size)
    if lengths.size:
        import numpy as np

        report["document_lengths"] = {
            "min": int(lengths.min()),
            "median": float(np.median(lengths)),
            "mean": float(lengths.mean()),
            "p90": float(np.percentile(lengths, 90)),
            "p99": float(np.percentile(lengths, 99)),
            "max": int(lengths.max()),
        }
    return report


class TokenFiles(FileFormat):
    """Token files, told by their name (a raw ``.bin`` has no header to
    read): ``.bin``, ``.idx`` or ``.npy``, local or remote. Asked before the
    formats told by content, as a raw file may begin with anything."""

    name = "tokens"
    noun = "a token file"
    plural = "token files"
    priority = 1

    def claims(self, target: Target) -> bool:
        return (
            target.path.endswith(TOKEN_SUFFIXES)
            and not target.is_dir()
            and (target.is_remote or target.exists())
        )

    def add_inspect_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dtype", help="the element type of raw token files (.bin), e.g. uint16"
        )
        parser.add_argument(
            "--eod-id", type=int, help="the token ending each document of raw and .npy token files"
        )

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        return inspect_tokens(target, options.dtype, options.eod_id)

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        r = report
        size = "" if r["size"] is None else f", {human_size(r['size'])}"
        print(f"{r['path']}: token file ({r['format']}){size}", file=out)
        if r["tokens"] is not None:
            print(f"  {r['tokens']:,} {r['dtype']} tokens", file=out)
        if r["documents"] is not None:
            print(f"  {r['documents']:,} documents", file=out)
            d = r["document_lengths"]
            if d is not None:
                print(
                    f"  document lengths: min {d['min']:,}, median {d['median']:,.0f}, mean"
                    f" {d['mean']:,.1f}, p90 {d['p90']:,.0f}, p99 {d['p99']:,.0f},"
                    f" max {d['max']:,}",
                    file=out,
                )
        elif r["tokens"] is not None:
            print("  documents: give --eod-id to count them", file=out)
        print_problems(r["problems"], out)


TOKEN_FILES = TokenFiles()


class TokenDatasetKind(DataKind):
    name = "TokenDataset"
    summary = "token files packed into sequences: fixed windows or whole documents, map-style"
    files = TOKEN_FILES


register_kind(TokenDatasetKind())
