"""TokenDataset(window_offsets="random"): nanoGPT's get_batch draws each
window's start uniformly from the tokens' ``len - seq_len`` starts; chute
draws them per epoch from (seed, epoch), without replacement within an
epoch, and resumes exactly. Megatron's multimodal .idx (one mode byte per
sequence after the document indices) reads; documents are counted in
windows mode and empty ones as Megatron counts them."""

from __future__ import annotations

import collections
import struct
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
from helpers import counts, run_ranks
from test_tokens import MEGATRON_CODES

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def stream_file(tmp_path: Path, tokens: int, seed: int = 0) -> tuple[str, np.ndarray]:
    # Token i is i (mod 65536), so a window's first token names its start.
    stream = (np.arange(tokens) % 65536).astype(np.uint16)
    path = tmp_path / f"s{seed}.bin"
    stream.tofile(path)
    return str(path), stream


def starts_of(batches: list[dict[str, torch.Tensor]]) -> list[int]:
    return [int(s) for b in batches for s in b["input_ids"][:, 0]]


def test_windows_start_at_distinct_random_tokens_drawn_anew_each_epoch(tmp_path: Path) -> None:
    path, stream = stream_file(tmp_path, 6001)
    seq_len = 20
    ds = chute.TokenDataset(path, seq_len, dtype="uint16", window_offsets="random", seed=7)
    fixed = chute.TokenDataset(path, seq_len, dtype="uint16")
    assert len(ds) == len(fixed) == 6000 // seq_len  # as many windows as fixed ones
    loader = chute.DataLoader(ds, batch_size=32)
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = list(loader)
        starts = starts_of(batches)
        epochs.append(starts)
        assert len(starts) == len(set(starts)) == len(ds)  # without replacement
        assert min(starts) >= 0 and max(starts) <= 6001 - seq_len - 1
        for b in batches:  # every window is the stream's tokens from its start
            for inputs, labels in zip(b["input_ids"], b["labels"], strict=True):
                s = int(inputs[0])
                assert inputs.tolist() == stream[s : s + seq_len].tolist()
                assert labels.tolist() == stream[s + 1 : s + seq_len + 1].tolist()
    assert epochs[0] != epochs[1] != epochs[2]
    # Offsets not on the fixed windows' grid: nanoGPT's draws, not a shifted grid.
    assert len({s % seq_len for s in epochs[0]}) == seq_len
    # The draws are a function of (seed, epoch) alone.
    again = chute.DataLoader(
        chute.TokenDataset(path, seq_len, dtype="uint16", window_offsets="random", seed=7),
        batch_size=50,
    )
    again.set_epoch(1)
    assert starts_of(list(again)) == epochs[1]
    other = chute.DataLoader(
        chute.TokenDataset(path, seq_len, dtype="uint16", window_offsets="random", seed=8),
        batch_size=32,
    )
    assert starts_of(list(other)) != epochs[0]


def test_draws_cover_the_starts_uniformly(tmp_path: Path) -> None:
    # Over many epochs every start is drawn about equally often, as nanoGPT's are.
    path, _ = stream_file(tmp_path, 401)
    ds = chute.TokenDataset(path, 4, dtype="uint16", window_offsets="random")
    seen: collections.Counter[int] = collections.Counter()
    for epoch in range(200):
        ds.set_epoch(epoch)
        seen.update(ds.window_starts(range(len(ds))).tolist())
    assert set(seen) == set(range(401 - 4))
    expected = 200 * len(ds) / (401 - 4)
    assert max(seen.values()) < 2 * expected and min(seen.values()) > expected / 2


def test_items_getitem_and_torch_loader_read_the_same_windows(tmp_path: Path) -> None:
    path, stream = stream_file(tmp_path, 3000)
    ds = chute.TokenDataset(path, 16, dtype="uint16", window_offsets="random", seed=1)
    ds.set_epoch(3)
    starts = ds.window_starts(range(len(ds)))
    assert ds[5]["input_ids"].tolist() == stream[starts[5] : starts[5] + 16].tolist()
    theirs = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2)
    assert starts_of(list(theirs)) == starts.tolist()
    ours = chute.DataLoader(ds, batch_size=10, num_workers=2, collate_fn=lambda rows: rows)
    ours.set_epoch(3)
    assert [int(r["input_ids"][0]) for b in ours for r in b] == starts.tolist()
    with pytest.raises(IndexError, match=f"index {len(ds)} is out of range"):
        ds[len(ds)]


def test_resume_mid_epoch_is_exact_and_needs_the_epoch(tmp_path: Path) -> None:
    path, _ = stream_file(tmp_path, 5000)

    def loader() -> chute.DataLoader[Any]:
        ds = chute.TokenDataset(path, 24, dtype="uint16", window_offsets="random", seed=3)
        return chute.DataLoader(
            ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)
        )

    whole = loader()
    whole.set_epoch(4)
    expected = starts_of(list(whole))
    first = loader()
    first.set_epoch(4)
    it = iter(first)
    head = starts_of([next(it) for _ in range(5)])
    state = first.state_dict()
    assert state["loader"]["dataset"]["epoch"] == 4
    resumed = loader()
    resumed.set_epoch(4)
    resumed.load_state_dict(state)
    assert head + starts_of(list(resumed)) == expected
    stale = loader()  # epoch 0's windows: not the state's
    with pytest.raises(
        ValueError, match=r"the state was taken over epoch 4 but this loader reads 0"
    ):
        stale.load_state_dict(state)


def test_ranks_and_elastic_resume_deliver_every_window_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = stream_file(tmp_path, 4000)
    ds = chute.TokenDataset(path, 32, dtype="uint16", window_offsets="random", seed=5)

    def make() -> chute.DataLoader[Any]:
        return chute.DataLoader(ds, batch_size=4, distributed=True, shuffle=True, seed=2)

    def ids(batch: dict[str, torch.Tensor]) -> list[int]:
        return [int(s) for s in batch["input_ids"][:, 0]]

    first, states = run_ranks(monkeypatch, 4, make, ids, batches=3)
    second, _ = run_ranks(monkeypatch, 3, make, ids, state=states[0])
    seen = counts(first, second)
    ds.set_epoch(2)  # run_ranks' epoch
    assert set(seen) == set(ds.window_starts(range(len(ds))).tolist())
    assert set(seen.values()) == {1}


def test_random_offsets_are_for_windows(tmp_path: Path) -> None:
    path, _ = stream_file(tmp_path, 100)
    with pytest.raises(ValueError, match="window_offsets='random' is for pack='windows'"):
        chute.TokenDataset(
            path, 8, dtype="uint16", pack="documents", eod_id=0, window_offsets="random"
        )
    with pytest.raises(ValueError, match="window_offsets must be 'fixed' or 'random'"):
        chute.TokenDataset(path, 8, dtype="uint16", window_offsets="shuffled")


# -- Megatron's layout --------------------------------------------------------------------


def write_megatron_index(
    prefix: Path,
    documents: list[list[list[int]]],
    dtype: Any = np.uint16,
    modes: list[int] | None = None,
) -> str:
    """A Megatron pair laid out as megatron/core/datasets/indexed_dataset.py's
    writer lays it out: header, int32 lengths, int64 byte pointers, int64
    document indices (0, then each document's end in sequences), then, for
    a multimodal dataset, one int8 mode per sequence."""
    dt = np.dtype(dtype)
    sequences = [seq for doc in documents for seq in doc]
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * dt.itemsize
    doc_index = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(np.int64)
    tokens = [np.asarray(s, dtype=dt) for s in sequences]
    np.concatenate(tokens or [np.zeros(0, dt)]).tofile(f"{prefix}.bin")
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", MEGATRON_CODES[dt]))
        f.write(struct.pack("<Q", len(sequences)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())
        if modes is not None:
            f.write(np.asarray(modes, dtype=np.int8).tobytes())
    return f"{prefix}.idx"


def test_a_multimodal_index_reads_with_its_modes(tmp_path: Path) -> None:
    docs = [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]], [[10], [11, 12]]]
    modes = [0, 1, 0, 1, 1]
    multimodal = write_megatron_index(tmp_path / "mm", docs, modes=modes)
    plain = write_megatron_index(tmp_path / "plain", docs)
    a = chute.TokenDataset(multimodal, 4, pack="documents")
    b = chute.TokenDataset(plain, 4, pack="documents")
    rows_a = [{k: v.tolist() for k, v in a[i].items()} for i in range(len(a))]
    rows_b = [{k: v.tolist() for k, v in b[i].items()} for i in range(len(b))]
    assert rows_a == rows_b  # every sequence's tokens, whatever its mode
    [got] = a.sequence_modes()
    assert got is not None and got.tolist() == modes and b.sequence_modes() == [None]
    assert list(chute.TokenDataset(multimodal, 3).window_starts([0, 1])) == [0, 3]
    # Neither size is refused unexplained.
    raw = Path(multimodal).read_bytes()
    Path(multimodal).write_bytes(raw[:-2])
    with pytest.raises(chute.DataError, match=r"or \d+ with a multimodal index's mode byte"):
        chute.TokenDataset(multimodal, 4)


def test_documents_are_counted_as_megatron_counts_them(tmp_path: Path) -> None:
    # 300 documents, one of them without any sequence and one with an empty one.
    rng = np.random.default_rng(0)
    docs: list[list[list[int]]] = [
        [rng.integers(1, 900, int(rng.integers(1, 30))).tolist()] for _ in range(300)
    ]
    docs[41] = []
    docs[77] = [[]]
    idx = write_megatron_index(tmp_path / "m", docs)
    lengths = [sum(len(s) for s in d) for d in docs]
    for pack in ("documents", "windows"):
        ds = chute.TokenDataset(idx, 16, pack=pack)
        assert ds.token_stats()["documents"] == 300  # Megatron: len(document_indices) - 1
        assert ds.document_lengths().tolist() == lengths
    packed = chute.TokenDataset(idx, 16, pack="documents")
    fed = [t for i in range(len(packed)) for t in packed[i]["input_ids"].tolist() if t]
    assert fed == [t for d in docs for s in d for t in s]  # the empty ones pack as nothing


def test_windows_mode_reports_documents_when_the_files_bound_them(tmp_path: Path) -> None:
    tokens = np.array([5, 6, 0, 7, 0, 0, 8, 9, 10, 0, 11], dtype=np.uint16)
    path = tmp_path / "t.bin"
    tokens.tofile(path)
    with_eod = chute.TokenDataset(str(path), 3, dtype="uint16", eod_id=0)
    assert with_eod.token_stats()["documents"] == 5
    assert with_eod.document_lengths().tolist() == [3, 2, 1, 4, 1]
    documents = chute.TokenDataset(str(path), 3, dtype="uint16", eod_id=0, pack="documents")
    assert with_eod.document_lengths().tolist() == documents.document_lengths().tolist()
    unbounded = chute.TokenDataset(str(path), 3, dtype="uint16")
    assert unbounded.token_stats()["documents"] == 0 and unbounded.document_lengths().size == 0
