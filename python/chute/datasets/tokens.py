"""Pre-tokenized language-model data: ``chute.TokenDataset``.

Token files are mapped by the engine and cut into sequences of ``seq_len``
tokens on its threads, written straight into the batch
(``csrc/tokens/token_packer.h`` has the exact rules). The dataset is
map-style, item i being the i-th packed sequence, so everything chute's
map-style datasets have applies: ``chute.DataLoader`` with a seeded shuffle,
``distributed=True`` (DistributedSampler's partition, equal batch counts),
``state_dict()`` resume mid-epoch and on another world size, and
``chute.mix`` (per sequence, hence by tokens).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chute import _core
from chute._core import DataError
from chute.common.errors import engine_errors
from chute.datasets.indexed import IndexedDataset, ProcessState
from chute.loader.engine import gather_batch, make_indexed_engine
from chute.remote import RemoteOptions, get_session, is_remote_url
from chute.sources.remote_urls import cached_copy, expand_file_patterns, merge_options
from chute.sources.shards import file_change_key, local_path
from chute.tokenize import as_tokenizer, id_bound, recorded_id_range, tokenize_shards

_PACK_MODES = ("windows", "documents")
_WINDOW_OFFSETS = ("fixed", "random")
_OUT_DTYPES = {torch.int64: "int64", torch.int32: "int32"}
# Batches in the files' own dtype (windows only): the files' bytes as they lie.
_FILE_OUT_DTYPES = {
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.int16: "int16",
    torch.uint8: "uint8",
    torch.int8: "int8",
}
# Tokens compared with the vocabulary at once (a bound on the scan's temporaries).
_SCAN_TOKENS = 1 << 24

# Bounds (lowest, highest) of the ids in token files this process has
# checked, by (device, inode, size, modification time, status-change time:
# the one a rewrite cannot set back): opening a file again does not read it
# again.
_id_bounds: dict[tuple[int, ...], tuple[int, int]] = {}
_id_bounds_lock = threading.Lock()


def remember_id_bounds(path: str, lowest: int, highest: int) -> None:
    """Records that every id of the token file `path` (as it is now) lies in
    ``[lowest, highest]``, so the vocabulary check at open does not read it."""
    with _id_bounds_lock:
        _id_bounds[file_change_key(path)] = (lowest, highest)


def _tokens_of(f: Any) -> np.ndarray:
    """The tokens of an opened TokenFile, mapped (a Megatron .bin whole)."""
    tokens: np.ndarray = (
        np.load(f.path, mmap_mode="r")
        if f.format == "npy"
        else np.memmap(f.path, dtype=f.dtype, mode="r")
    )
    return tokens


def _token_runs(f: Any, itemsize: int) -> list[tuple[int, int]]:
    """(first element, count) of each run of a file's tokens that lie back to
    back, in stream order: the whole array, or a Megatron file's sequences
    (its .idx, already checked by the engine, read as documented) with the
    bytes between them left out."""
    if f.format != "megatron":
        return [(0, int(f.num_tokens))]
    index = np.memmap(f.index_path, dtype=np.uint8, mode="r")
    count = int(index[18:26].view("<u8")[0])
    lengths = index[34 : 34 + 4 * count].view("<i4").astype(np.int64)
    starts = index[34 + 4 * count : 34 + 12 * count].view("<i8") // itemsize
    keep = lengths > 0
    lengths, starts = lengths[keep], starts[keep]
    if not len(lengths):
        return []
    # A sequence that starts where the one before ends continues its run.
    breaks = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1]) + 1
    firsts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(lengths)]])
    return [
        (int(starts[a]), int(starts[b - 1] + lengths[b - 1] - starts[a]))
        for a, b in zip(firsts, ends, strict=True)
    ]


def _chunks(f: Any, tokens: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(first element, tokens) of the file's tokens in stream order, in
    pieces of at most _SCAN_TOKENS."""
    for first, count in _token_runs(f, tokens.dtype.itemsize):
        for at in range(first, first + count, _SCAN_TOKENS):
            yield at, np.asarray(tokens[at : min(at + _SCAN_TOKENS, first + count)])


def check_vocabulary(url: str, f: Any, vocab_size: int) -> None:
    """Raises chute.DataError naming `url`, the byte offset and the id when
    the TokenFile `f` holds an id outside ``[0, vocab_size)``. The file's id
    bounds are found by one vectorised pass over it, once per process."""
    if f.num_tokens == 0:
        return
    key = file_change_key(f.path)
    with _id_bounds_lock:
        bounds = _id_bounds.get(key)
    tokens: np.ndarray | None = None
    if bounds is None:
        tokens = _tokens_of(f)
        signed = tokens.dtype.kind == "i"
        lowest, highest = 0, 0
        for _, chunk in _chunks(f, tokens):
            highest = max(highest, int(chunk.max()))
            if signed:
                lowest = min(lowest, int(chunk.min()))
        bounds = (lowest, highest)
        with _id_bounds_lock:
            _id_bounds[key] = bounds
    if bounds[0] >= 0 and bounds[1] < vocab_size:
        return
    if tokens is None:
        tokens = _tokens_of(f)
    for at, chunk in _chunks(f, tokens):
        outside = (chunk >= vocab_size) | (chunk < 0)
        if outside.any():
            i = int(np.argmax(outside))
            offset = getattr(tokens, "offset", 0) + (at + i) * tokens.dtype.itemsize
            raise DataError(
                f"'{url}': token id {int(chunk[i])} at byte offset {offset} is outside the"
                f" vocabulary (vocab_size {vocab_size})"
            )


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: each bit of the result depends on every bit of `z`."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = z ^ (z >> np.uint64(31))
    return mixed


def _distinct_draws(idx: np.ndarray, count: int, seed: int, epoch: int) -> np.ndarray:
    """Draws `idx` of (seed, epoch)'s random permutation of ``range(count)``:
    distinct numbers for distinct `idx` (below `count`), each a function of
    its own index alone, so any batch of an epoch is drawn without the
    others. The permutation is a four-round Feistel network over the
    smallest even number of bits that holds `count`, walked until it lands
    in range (fewer than four steps on average)."""
    half = max(1, ((count - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    digest = hashlib.blake2b(f"chute windows {seed} {epoch}".encode(), digest_size=32).digest()
    keys = np.frombuffer(digest, dtype="<u8").astype(np.uint64)

    def permute(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << shift) | right

    out = permute(idx.astype(np.uint64))
    outside = out >= np.uint64(count)
    while outside.any():
        out[outside] = permute(out[outside])
        outside = out >= np.uint64(count)
    return out.astype(np.int64)


@dataclass(frozen=True)
class TokenFileSpec:
    """One token file as given: its url, its format (``raw``, ``npy`` or
    ``megatron``) and, for Megatron, the url of its ``.idx``."""

    url: str
    format: str
    index_url: str = ""


def token_file_spec(url: str) -> TokenFileSpec:
    """How `url` is read: ``.npy`` as a 1-D array; ``.idx``, or a local
    ``.bin`` with an ``.idx`` beside it, as a Megatron pair; anything else as
    raw tokens (nanoGPT's ``train.bin``)."""
    if url.endswith(".npy"):
        return TokenFileSpec(url, "npy")
    if url.endswith(".idx"):
        return TokenFileSpec(url[: -len(".idx")] + ".bin", "megatron", url)
    if url.endswith(".bin") and not is_remote_url(url):
        index = url[: -len(".bin")] + ".idx"
        if os.path.isfile(local_path(index) or index):
            return TokenFileSpec(url, "megatron", index)
    return TokenFileSpec(url, "raw")


def cu_seqlens(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Variable-length attention's boundaries for a batch packed by
    documents (``flash_attn_varlen_func``'s ``cu_seqlens`` and
    ``max_seqlen``): every position where ``position_ids`` is 0 starts a
    segment of the flattened batch (a document, a piece of a long one, or
    the padding)."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).reshape(-1)
    ends = torch.tensor([flat.numel()], dtype=starts.dtype, device=starts.device)
    bounds = torch.cat([starts, ends]).to(torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max()) if bounds.numel() > 1 else 0
    return bounds, longest


class TokenDataset(IndexedDataset):
    """Map-style packed sequences of token files.

    ``TokenDataset(urls, seq_len=2048, dtype="uint16")``: item i is
    ``{"input_ids": int64[seq_len], "labels": int64[seq_len]}`` (and
    ``"position_ids"`` when packing documents).

    Args:
        urls: files, local globs, ``{a..b}`` ranges, or remote urls
            (``s3://``, ``gs://``, ...; read through the node cache, so give
            ``cache_dir``). ``.npy`` files are 1-D token arrays; an ``.idx``
            url, or a local ``.bin`` with an ``.idx`` beside it, is a
            Megatron-LM indexed dataset; anything else is a raw array of
            tokens (nanoGPT's ``train.bin``), whose ``dtype`` must be given.
        seq_len: tokens of each sequence's ``input_ids`` (and ``labels``).
        dtype: the element type of raw files (``"uint16"``, ``np.uint32``,
            ...); for ``.npy`` and Megatron files it must match theirs.
        pack: ``"windows"`` (nanoGPT's: the files as one stream cut into
            consecutive windows of seq_len + 1 tokens, ``input_ids =
            w[:-1]``, ``labels = w[1:]``) or ``"documents"`` (documents
            packed whole, none split unless longer than seq_len, the rest
            of a sequence padded; see docs/language-models.md).
        eod_id: the token that ends each document of raw and ``.npy`` files
            (packing documents; Megatron files list their documents).
        pad_id: the ``input_ids`` of padding (default: eod_id, else 0);
            padding's labels are -100.
        vocab_size: when given, a file holding a token id outside ``[0,
            vocab_size)`` is refused when the dataset is made: a
            ``chute.DataError`` names the file, the id and its byte offset
            (each file is read once per process to find its largest id).
        window_views: windows only: each batch is one ``[batch, seq_len +
            1]`` tensor the engine writes once, and ``input_ids`` and
            ``labels`` are views of it (its ``[:, :-1]`` and ``[:, 1:]``):
            half the memory written. The views are not contiguous, and
            writing into one changes the other (see
            docs/language-models.md).
        out_dtype: ``torch.int64`` (default, what embeddings and
            cross-entropy take), ``torch.int32``, or, packing windows, the
            token files' own dtype (``torch.uint16`` for nanoGPT's files):
            the batch is then the files' bytes copied as they lie, a
            quarter of int64's, to widen where it is used (``.long()`` on
            the GPU after the copy).
        window_offsets: windows only: ``"fixed"`` (the default: window i
            starts at token ``i * seq_len``, every epoch) or ``"random"``
            (nanoGPT's ``get_batch``: each window starts at a token drawn
            from all ``tokens - seq_len`` starts, anew each epoch, from
            (seed, epoch), but without replacement: no start twice in an
            epoch). An epoch has as many windows either way.
        seed: seeds the random window offsets (with the epoch:
            ``set_epoch``, which ``chute.DataLoader.set_epoch`` reaches).
        num_threads: native threads of ``__getitem__`` (the loader's
            ``num_workers`` sets its own).
        storage_options, cache_dir, cache_limit_bytes, remote: how remote
            files are reached, as for ``H5Dataset``.
    """

    # A batch is copies from the page cache (and conversions): with
    # num_workers=0 the consumer's next() makes it, no thread hand-off.
    reads_inline = True

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        seq_len: int = 2048,
        *,
        dtype: Any = None,
        pack: str = "windows",
        eod_id: int | None = None,
        pad_id: int | None = None,
        vocab_size: int | None = None,
        window_views: bool = False,
        out_dtype: torch.dtype = torch.int64,
        window_offsets: str = "fixed",
        seed: int = 0,
        num_threads: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        cache_limit_bytes: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive integer, not {seq_len!r}")
        if pack not in _PACK_MODES:
            raise ValueError(f"pack must be 'windows' or 'documents', not {pack!r}")
        if window_views and pack != "windows":
            raise ValueError(
                "window_views=True is for pack='windows' (labels are input_ids shifted)"
            )
        if out_dtype not in _OUT_DTYPES and out_dtype not in _FILE_OUT_DTYPES:
            raise ValueError(
                "out_dtype must be torch.int64, torch.int32 or the token files' own dtype"
                f" (such as torch.uint16), not {out_dtype}"
            )
        if out_dtype in _FILE_OUT_DTYPES and pack != "windows":
            raise ValueError(
                f"out_dtype={out_dtype} (the files' own dtype) is for pack='windows':"
                " packed documents' labels hold -100"
            )
        if window_offsets not in _WINDOW_OFFSETS:
            raise ValueError(f"window_offsets must be 'fixed' or 'random', not {window_offsets!r}")
        if window_offsets == "random" and pack != "windows":
            raise ValueError("window_offsets='random' is for pack='windows'")
        if vocab_size is not None and (
            isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1
        ):
            raise ValueError(f"vocab_size must be a positive integer, not {vocab_size!r}")
        self._remote = merge_options(
            remote,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit_bytes=cache_limit_bytes,
        )
        self.specs = _distinct_specs(_expand(urls, self._remote))
        if any(is_remote_url(s.url) for s in self.specs) and not self._remote.cache_dir:
            raise ValueError(
                "TokenDataset maps remote token files from the node cache: give cache_dir"
            )
        self.seq_len = seq_len
        self.dtype = None if dtype is None else np.dtype(dtype).name
        self.pack = pack
        self.eod_id = eod_id
        self.pad_id = pad_id if pad_id is not None else (eod_id if eod_id is not None else 0)
        self.vocab_size = vocab_size
        self.out_dtype = out_dtype
        self.window_views = bool(window_views)
        self.window_offsets = window_offsets
        self.seed = int(seed)
        self._window_epoch = 0
        self._init_indexed(num_threads)
        held: list[Any] = []
        self._files, self._packer = self._open_files(held)
        self._held = held
        self._packer_pid = os.getpid()
        if vocab_size is not None:
            for spec, f in zip(self.specs, self._files, strict=True):
                check_vocabulary(spec.url, f, vocab_size)
        self._identity = self._make_identity()

    @classmethod
    def from_text(
        cls,
        urls: str | os.PathLike[str] | Sequence[str],
        tokenizer: Any,
        seq_len: int = 2048,
        *,
        cache_dir: str | os.PathLike[str],
        text_key: str = "text",
        eod_id: int | None = None,
        add_special_tokens: bool = True,
        read_only: bool = False,
        verify: bool = True,
        storage_options: dict[str, Any] | None = None,
        remote: RemoteOptions | None = None,
        **kwargs: Any,
    ) -> TokenDataset:
        """Packed sequences of text shards: ``chute.tokenize_shards(urls,
        tokenizer, cache_dir, ...)`` (tar shards of .txt/.json members, JSON
        Lines; see docs/language-models.md), then a TokenDataset of the token files
        it wrote or found in `cache_dir`. `eod_id` ends every document and
        is the default padding; `vocab_size` defaults to the tokenizer's
        (and `eod_id`'s). The other keyword arguments are TokenDataset's
        (``pack``, ``pad_id``, ``out_dtype``, ...)."""
        tok = as_tokenizer(tokenizer)
        paths = tokenize_shards(
            urls,
            tok,
            cache_dir,
            text_key=text_key,
            eod_id=eod_id,
            add_special_tokens=add_special_tokens,
            read_only=read_only,
            verify=verify,
            remote=merge_options(remote, storage_options=storage_options),
        )
        # The cache's manifests record each file's id bounds: the vocabulary
        # check at open need not read the files.
        for path in paths:
            bounds = recorded_id_range(path)
            if bounds is not None:
                remember_id_bounds(path, *bounds)
        kwargs.setdefault("vocab_size", id_bound(tok, eod_id))
        return cls(paths, seq_len, eod_id=eod_id, **kwargs)

    # -- files --------------------------------------------------------------------

    def _local(self, url: str, held: list[Any]) -> str:
        if not is_remote_url(url):
            return local_path(url) or url
        copy = cached_copy(get_session(self._remote), url, self._remote.cache_dir or "", held)
        if copy is None:
            raise ValueError(f"{url}: cannot be held in the node cache (cache_dir), so not mapped")
        return str(copy["path"])

    def _open_files(self, held: list[Any]) -> tuple[list[Any], Any]:
        files = []
        for spec in self.specs:
            index = self._local(spec.index_url, held) if spec.index_url else ""
            if spec.format == "raw" and self.dtype is None:
                raise ValueError(
                    f"{spec.url}: a raw token file has no header: give dtype (nanoGPT: 'uint16')"
                )
            local = self._local(spec.url, held)
            with engine_errors():  # as chute.common.errors maps it: a missing .bin, say
                f = _core.TokenFile(local, spec.format, self.dtype or "", index)
            if self.dtype is not None and f.dtype != self.dtype:
                raise ValueError(f"{spec.url}: holds {f.dtype} tokens, dtype={self.dtype!r} given")
            files.append(f)
        packer = _core.TokenPacker(
            files,
            self.seq_len,
            self.pack,
            -1 if self.eod_id is None else int(self.eod_id),
            int(self.pad_id),
            0 if self.vocab_size is None else int(self.vocab_size),
            _OUT_DTYPES.get(self.out_dtype) or _FILE_OUT_DTYPES[self.out_dtype],
            # Random offsets: every start is a row, the epoch's windows drawn among them.
            1 if self.window_offsets == "random" else 0,
        )
        return files, packer

    def _current_packer(self) -> Any:
        """This process's packer (a forked or unpickled copy maps the files again)."""
        if self._packer is None or self._packer_pid != os.getpid():
            held: list[Any] = []
            files, packer = self._open_files(held)
            self._check_reopened(files, packer)
            self._files, self._packer = files, packer
            self._held = held
            self._packer_pid = os.getpid()
        return self._packer

    def _check_reopened(self, files: list[Any], packer: Any) -> None:
        """Raises chute.DataError naming the file when the files mapped anew
        (in a worker process, say) no longer make the sequences this
        dataset counted when it was made."""
        for spec, f, was in zip(self.specs, files, self._identity["files"], strict=True):
            if (int(f.size), int(f.num_tokens), f.dtype) != (
                was["size"],
                was["tokens"],
                was["dtype"],
            ):
                raise DataError(
                    f"'{spec.url}': the file changed after the dataset opened it ({was['size']} "
                    f"bytes, {was['tokens']} {was['dtype']} tokens; now {int(f.size)} bytes, "
                    f"{int(f.num_tokens)} {f.dtype} tokens): open the dataset again"
                )
        if int(packer.num_sequences) != self._identity["rows"]:
            raise DataError(
                f"the token files {[s.url for s in self.specs]} changed after the dataset opened "
                f"them: they make {int(packer.num_sequences)} sequences, not "
                f"{self._identity['rows']}: open the dataset again"
            )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_files"], state["_packer"], state["_held"] = [], None, []
        return state

    # -- IndexedDataset ---------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._identity["sequences"])

    def field_names(self) -> list[str]:
        names = ["input_ids", "labels"]
        return names + ["position_ids"] if self.pack == "documents" else names

    def _native_field_names(self) -> list[str]:
        # window_views: each sequence's seq_len + 1 tokens are read and
        # written once, and input_ids and labels are views of them (`_assemble`).
        return ["window"] if self.window_views else self.field_names()

    def _open_native(self) -> tuple[list[Any], dict[str, Any]]:
        packer = self._current_packer()
        sources = [packer.source(name) for name in self._native_field_names()]
        return sources, {"packer": packer}

    def _assemble(self, arrays: Any, idx: np.ndarray) -> Any:
        if not self.window_views:
            return super()._assemble(arrays, idx)
        # numpy's slicing: the two views cost a fraction of torch's per batch.
        (windows,) = arrays
        return {
            "input_ids": torch.from_numpy(windows[:, :-1]),
            "labels": torch.from_numpy(windows[:, 1:]),
        }

    def _native_stats(self, state: ProcessState) -> dict[str, int]:
        return self.token_stats()

    # -- random window offsets -------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose window offsets the next batches read
        (``window_offsets="random"``; ``chute.DataLoader.set_epoch`` reaches
        it). Without it every epoch reads epoch 0's windows, as
        DistributedSampler's order stays epoch 0's."""
        self._window_epoch = int(epoch)

    def window_starts(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The token (in the files' stream) where each of the windows
        `indices` of the current epoch starts."""
        idx = self._as_indices(indices)
        n = len(self)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise IndexError(
                f"index {int(idx[bad][0])} is out of range for a dataset of length {n}"
            )
        if self.window_offsets == "fixed":
            return idx * self.seq_len
        return _distinct_draws(idx, int(self._identity["rows"]), self.seed, self._window_epoch)

    def _rows_of(self, idx: np.ndarray) -> np.ndarray:
        """The packer's rows of the dataset's items `idx` (the items
        themselves, but for random offsets: the windows' starts)."""
        return idx if self.window_offsets == "fixed" else self.window_starts(idx)

    def _make_engine(
        self, state: ProcessState, threads: int, in_flight: int, hooks: tuple[int, int] | None
    ) -> Any:
        return make_indexed_engine(
            state.sources, int(self._identity["rows"]), threads, in_flight, hooks
        )

    def _submit(self, engine: Any, idx: np.ndarray) -> None:
        engine.submit(self._rows_of(idx))

    def _read_inline(self, engine: Any, idx: np.ndarray) -> Any:
        return gather_batch(engine, self._rows_of(idx))

    def worker_epoch(self) -> Any:
        return self._window_epoch

    def enter_worker_epoch(self, state: Any) -> None:
        self._window_epoch = int(state)

    def reads_remote(self) -> bool:
        return any(is_remote_url(s.url) for s in self.specs)

    # -- what the files hold ------------------------------------------------------------

    def token_stats(self) -> dict[str, int]:
        """``tokens`` in the files, ``sequences``, ``documents`` (as
        Megatron counts them, empty ones too; packing windows, when the
        files bound them: every file's ``.idx``, or ``eod_id``, else 0),
        ``pad_tokens`` (the padding of all sequences: the waste of packing
        documents) and ``unused_tokens`` (in no sequence's input: the tail
        fixed windows leave; random offsets: the tokens minus an epoch's
        ``sequences * seq_len``)."""
        p = self._current_packer()
        unused = int(p.unused_tokens)
        if self.window_offsets == "random":
            unused = int(p.num_tokens) - len(self) * self.seq_len
        return {
            "tokens": int(p.num_tokens),
            "sequences": len(self),
            "documents": int(p.num_documents),
            "pad_tokens": int(p.pad_tokens),
            "unused_tokens": unused,
        }

    def stats(self) -> dict[str, Any]:
        """The engine's figures (README, "Stats") plus `token_stats()`."""
        out = super().stats()
        out.update(self.token_stats())
        return out

    def document_lengths(self) -> np.ndarray:
        """Tokens of each document, in stream order (0 for an empty one, as
        Megatron counts it); packing windows, empty when the files do not
        bound the documents (see `token_stats`). The first call packing
        windows with ``eod_id`` scans the files once."""
        return np.asarray(self._current_packer().document_lengths())

    def sequence_modes(self) -> list[np.ndarray | None]:
        """Per file, a Megatron multimodal ``.idx``'s mode of each of its
        sequences (uint8; Megatron's meaning), None for every other file.
        The modes are read, not used: every sequence's tokens are packed."""
        self._current_packer()
        return [f.sequence_modes for f in self._files]

    def _make_identity(self) -> dict[str, Any]:
        files = []
        for spec, f in zip(self.specs, self._files, strict=True):
            files.append(
                {
                    "url": spec.url,
                    "format": spec.format,
                    "index": spec.index_url,
                    "size": int(f.size),
                    "tokens": int(f.num_tokens),
                    "dtype": f.dtype,
                }
            )
        rows = int(self._packer.num_sequences)
        identity: dict[str, Any] = {
            "type": "TokenDataset",
            "files": files,
            "seq_len": self.seq_len,
            "pack": self.pack,
            "eod_id": self.eod_id,
            "pad_id": self.pad_id,
            "sequences": rows,
            "rows": rows,
        }
        if self.window_offsets == "random":
            tokens = int(self._packer.num_tokens)
            identity["sequences"] = (tokens - 1) // self.seq_len if tokens > self.seq_len else 0
        return identity

    def state_identity(self) -> dict[str, Any]:
        """What a loader state over this dataset is bound to (see
        ``chute.DataLoader.load_state_dict``): each file (url, format, size,
        tokens, dtype), seq_len, the packing and the sequences it made; with
        random window offsets also the seed and the epoch whose windows the
        state was taken in (``set_epoch`` that epoch before loading it)."""
        identity = {k: v for k, v in self._identity.items() if k != "rows"}
        if self.window_offsets == "random":
            identity.update(window_offsets="random", seed=self.seed, epoch=self._window_epoch)
        return identity

    def __repr__(self) -> str:
        return (
            f"TokenDataset({len(self.specs)} files, {len(self)} sequences of {self.seq_len}, "
            f"pack={self.pack!r})"
        )


def _distinct_specs(urls: list[str]) -> list[TokenFileSpec]:
    """The token files of `urls`, a Megatron pair named by both its files
    (a glob over a folder) once; a file named twice raises, rather than
    being read once or twice unasked."""
    seen: set[str] = set()
    for url in urls:
        if url in seen:
            raise ValueError(
                f"TokenDataset: {url!r} is given twice; each file is read once (to weigh "
                "files, mix datasets of them with chute.mix)"
            )
        seen.add(url)
    return list(dict.fromkeys(token_file_spec(u) for u in urls))


def _expand(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], remote: RemoteOptions
) -> list[str]:
    out: list[str] = []
    for url in expand_file_patterns(urls, remote, "token file"):
        if is_remote_url(url):
            out.append(url)
            continue
        path = local_path(url) or url
        if not os.path.isfile(path):
            raise FileNotFoundError(2, "token file not found", path)
        out.append(os.path.abspath(path))
    if not out:
        raise ValueError("TokenDataset needs at least one token file")
    return out
