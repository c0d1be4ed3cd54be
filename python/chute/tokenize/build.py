"""``tokenize_shards``: the shards looked up in the cache, and those whose
entry cannot be used read, encoded and written (reading, encoding and
writing overlap)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from chute.remote import RemoteOptions
from chute.sources.remote_urls import expand_file_patterns
from chute.tokenize.cache_entries import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    CacheEntry,
    Claims,
    EntryWriter,
)
from chute.tokenize.text_shards import TextShard, documents, text_batches

logger = logging.getLogger("chute")

# Batches read ahead of the encoder.
QUEUE_DEPTH = 4
# Batches encoded at once (see _build).
ENCODERS = 2
# Shards whose input and cache entry are checked at once.
LOOKUP_THREADS = 16


@dataclass(frozen=True)
class TokenizeOptions:
    """What, besides the input and the tokenizer, decides the tokens."""

    text_key: str
    eod_id: int | None
    add_special_tokens: bool

    def record(self) -> dict[str, Any]:
        return {
            "text_key": self.text_key,
            "eod_id": self.eod_id,
            "add_special_tokens": self.add_special_tokens,
        }


def as_tokenizer(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from one, from a transformers fast
    tokenizer (its ``backend_tokenizer``) or from a tokenizer.json path."""
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(
            "tokenizing text needs the tokenizers library: pip install 'chute[tokenizers]'"
        ) from exc
    if isinstance(tokenizer, (str, os.PathLike)):
        return tokenizers.Tokenizer.from_file(os.fspath(tokenizer))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, tokenizers.Tokenizer):
        return backend
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer
    raise TypeError(
        "tokenizer must be a tokenizers.Tokenizer, a transformers fast tokenizer or the path "
        f"of a tokenizer.json, not {type(tokenizer).__name__}"
    )


def id_bound(tokenizer: Any, eod_id: int | None) -> int:
    """One past the largest id the tokens can hold: the vocabulary (added
    tokens included) and the end-of-document id."""
    bound = int(tokenizer.get_vocab_size(with_added_tokens=True))
    return max(bound, eod_id + 1) if eod_id is not None else bound


def token_dtype(tokenizer: Any, eod_id: int | None) -> np.dtype[Any]:
    """uint16 when every id fits (below 65,536), else int32 (Megatron's
    .idx has no uint32)."""
    return np.dtype(np.uint16) if id_bound(tokenizer, eod_id) <= 0x10000 else np.dtype(np.int32)


class _Reader(threading.Thread):
    """Reads the shards this process claims, one after another, into
    batches of texts on a bounded queue: (shard, texts) items, (shard, None)
    at each shard's end, (None, None) after the last, and (None, exception)
    when reading fails."""

    def __init__(self, sources: Sequence[TextShard], claims: Claims, text_key: str) -> None:
        super().__init__(name="chute-tokenize-reader", daemon=True)
        self.sources = sources
        self.claims = claims
        self.text_key = text_key
        self.items: queue.Queue[tuple[int | None, Any]] = queue.Queue(QUEUE_DEPTH)
        self.stop = claims.stop

    def _put(self, item: tuple[int | None, Any]) -> bool:
        while not self.stop.is_set():
            try:
                self.items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        try:
            for i in self.claims.claimed():
                source = self.sources[i]
                for batch in text_batches(documents(source, self.text_key)):
                    if not self._put((i, batch)):
                        return
                source.check_unchanged()
                if not self._put((i, None)):
                    return
            self._put((None, None))
        except BaseException as exc:
            self._put((None, exc))


def _encode(
    tokenizer: Any, texts: list[str], options: TokenizeOptions, dtype: np.dtype[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `texts`, concatenated (each document followed by the
    end-of-document id when there is one), and each document's length."""
    # encode_batch_fast (tokenizers 0.20+) gives encode_batch's ids without
    # computing character offsets.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encodings = encode(texts, add_special_tokens=options.add_special_tokens)
    # Each document's ids become an array in one C loop, and the arrays one
    # by concatenation: no Python step per token.
    documents = [np.array(e.ids, dtype=dtype) for e in encodings]
    lengths = np.fromiter(map(len, documents), dtype=np.int64, count=len(documents))
    tokens = np.concatenate(documents) if documents else np.zeros(0, dtype)
    if options.eod_id is not None:
        tokens = np.insert(tokens, np.cumsum(lengths), np.array(options.eod_id, dtype))
        lengths += 1
    return tokens, lengths


def _build(
    sources: Sequence[TextShard],
    entries: Sequence[CacheEntry],
    descriptions: Sequence[dict[str, Any]],
    tokenizer: Any,
    options: TokenizeOptions,
    dtype: np.dtype[Any],
    verify: bool,
) -> None:
    claims = Claims(entries, descriptions, verify, threading.Event())
    reader = _Reader(sources, claims, options.text_key)
    # Batches are encoded on ENCODERS threads, so that while one thread
    # turns its batch's ids into arrays (holding the GIL) the tokenizer's
    # own threads encode the next batch; their results are written in order.
    pool = ThreadPoolExecutor(max_workers=ENCODERS, thread_name_prefix="chute-tokenize-encode")
    # (shard, its next batch's encoding, or None for the shard's end)
    pending: deque[tuple[int, Future[tuple[np.ndarray, np.ndarray]] | None]] = deque()
    writer: EntryWriter | None = None
    read_all = False
    failure: BaseException | None = None
    reader.start()
    try:
        while pending or not read_all:
            encoding = sum(future is not None for _, future in pending)
            if pending and (
                read_all or pending[0][1] is None or encoding > ENCODERS or reader.items.empty()
            ):
                shard, future = pending.popleft()
                if writer is None:
                    writer = EntryWriter(entries[shard], dtype)
                if future is not None:
                    writer.add(*future.result())
                    continue
                writer.finish(descriptions[shard])
                writer = None
                claims.release(shard)
                continue
            read, item = reader.items.get()
            if read is None:
                # The shards read whole before a failure are still written.
                failure = item
                read_all = True
            elif item is None:
                pending.append((read, None))
            else:
                pending.append((read, pool.submit(_encode, tokenizer, item, options, dtype)))
        if failure is not None:
            raise failure
    finally:
        claims.stop.set()
        for _, future in pending:
            if future is not None:
                future.cancel()
        pool.shutdown(wait=True)
        if writer is not None:
            writer.abort()
        reader.join()
        claims.release_all()


def tokenize_shards(
    urls: str | os.PathLike[str] | Iterable[str],
    tokenizer: Any,
    cache_dir: str | os.PathLike[str],
    *,
    text_key: str = "text",
    eod_id: int | None = None,
    add_special_tokens: bool = True,
    read_only: bool = False,
    verify: bool = True,
    remote: RemoteOptions | None = None,
) -> list[str]:
    """Tokenizes text shards into Megatron ``.bin`` + ``.idx`` token files in
    `cache_dir` (one pair per shard) and returns the ``.bin`` paths in the
    order of `urls`; the ``.idx`` of each lies beside it.

    `urls`: tar shards (``.tar``, ``.tar.gz``, ``.tgz``) whose samples each
    hold a ``.txt`` member (the document) or a ``.json`` member (its
    `text_key` field is), or JSON Lines files (``.jsonl``, ``.ndjson``: the
    `text_key` field of each non-blank line), or Parquet files (``.parquet``:
    the `text_key` string column, row by row); local paths or remote urls,
    brace ranges and globs (local, and on s3/gs/az buckets) expanded.
    `tokenizer`: a ``tokenizers.Tokenizer``, a transformers fast tokenizer
    or a tokenizer.json path; padding must be off. `eod_id`: appended to every document when given.
    `add_special_tokens`: passed to the tokenizer (its post-processor's
    tokens, BOS for instance). Tokens are uint16 when every id fits, else
    int32.

    A shard whose entry is present and still describes it (same input size
    and modification time or ETag, same tokenizer, same options, a local
    input and files that match their recorded SHA-256; `verify=False` checks
    sizes and times only) is not tokenized again. Any other is tokenized
    again (a warning on the "chute" logger says why an existing entry was
    not used), or with
    `read_only=True` refused with a ``ValueError`` naming the shard and
    the reason. Bad input raises ``chute.DataError`` naming the file and
    line or member.
    """
    tok = as_tokenizer(tokenizer)
    if tok.padding is not None:
        raise ValueError(
            "the tokenizer pads its encodings, which would put padding between documents: "
            "call tokenizer.no_padding() first"
        )
    if eod_id is not None and eod_id < 0:
        raise ValueError(f"eod_id must be a token id (>= 0), not {eod_id}")
    options = TokenizeOptions(text_key, eod_id, add_special_tokens)
    dtype = token_dtype(tok, eod_id)
    tokenizer_sha256 = hashlib.sha256(tok.to_str().encode()).hexdigest()
    cache = os.fspath(cache_dir)
    if not read_only:
        os.makedirs(cache, exist_ok=True)
    key = json.dumps([tokenizer_sha256, options.record()], sort_keys=True)

    remote_options = remote if remote is not None else RemoteOptions()

    def look_up(url: str) -> tuple[str, TextShard, CacheEntry, dict[str, Any], str | None]:
        source = TextShard(url, remote_options)
        entry = CacheEntry.for_input(cache, source.identity.url, key)
        expected = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "input": source.identity.record(),
            "tokenizer_sha256": tokenizer_sha256,
            "options": options.record(),
        }
        problem = entry.problem(expected, verify, source)
        if problem is not None and source.sha256() is not None:
            # The entry built records the input's digest, taken before it is read.
            expected["input_sha256"] = source.sha256()
        return url, source, entry, expected, problem

    # A remote shard's HEAD and an entry's digests wait on the network and on
    # hashlib, both without the GIL: the shards are looked up side by side.
    with ThreadPoolExecutor(max_workers=LOOKUP_THREADS) as pool:
        looked_up = list(
            pool.map(look_up, expand_file_patterns(urls, remote_options, "text shard"))
        )
    todo: list[tuple[TextShard, CacheEntry, dict[str, Any]]] = []
    for url, source, entry, expected, problem in looked_up:
        if problem is None:
            continue
        if read_only:
            raise ValueError(
                f"{url}: the token cache {cache} cannot be used ({problem}) and read_only=True"
            )
        if problem != "no cache entry":
            logger.warning("%s: tokenizing again: %s", url, problem)
        todo.append((source, entry, expected))
    if todo:
        sources, entries, descriptions = zip(*todo, strict=True)
        _build(sources, entries, descriptions, tok, options, dtype, verify)
    return [entry.bin for _, _, entry, _, _ in looked_up]
