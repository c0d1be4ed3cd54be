"""chute.TokenDataset: pre-tokenized files (raw .bin, .npy, Megatron
.bin + .idx) packed into sequences on native threads, against a plain-Python
reference packer; resume, elastic resume and mixing by tokens, each token
counted; bad inputs named by file and byte offset."""

from __future__ import annotations

import collections
import os
import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch
from helpers import assert_equal_batch_counts, rewrite_with_its_times_set_back, run_ranks

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

IGNORE = -100
MEGATRON_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int32): 4, np.dtype(np.uint16): 8}


# -- reference packers: plain Python, the documented rules -------------------------


def reference_windows(stream: list[int], seq_len: int) -> list[dict[str, list[int]]]:
    n = (len(stream) - 1) // seq_len if len(stream) > seq_len else 0
    out = []
    for i in range(n):
        w = stream[i * seq_len : (i + 1) * seq_len + 1]
        out.append({"input_ids": w[:-1], "labels": w[1:]})
    return out


def reference_documents(
    documents: list[list[int]], seq_len: int, pad_id: int
) -> list[dict[str, list[int]]]:
    """Next-fit packing; a document longer than seq_len starts a sequence of
    its own and is cut into seq_len pieces whose last label is the next token."""
    pieces: list[list[tuple[list[int], list[int]]]] = [[]]

    def fill() -> int:
        return sum(len(p[0]) for p in pieces[-1])

    def close() -> None:
        if pieces[-1]:
            pieces.append([])

    for doc in documents:
        offset = 0
        if len(doc) > seq_len:
            close()
            while len(doc) - offset > seq_len:
                pieces[-1].append(
                    (doc[offset : offset + seq_len], doc[offset + 1 : offset + seq_len + 1])
                )
                close()
                offset += seq_len
        elif fill() + len(doc) > seq_len:
            close()
        rest = doc[offset:]
        pieces[-1].append((rest, rest[1:] + [IGNORE]))
    if not pieces[-1]:
        pieces.pop()
    out = []
    for seq in pieces:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for inp, lab in seq:
            ids += inp
            labels += lab
            positions += list(range(len(inp)))
        pad = seq_len - len(ids)
        out.append(
            {
                "input_ids": ids + [pad_id] * pad,
                "labels": labels + [IGNORE] * pad,
                "position_ids": positions + list(range(pad)),
            }
        )
    return out


def split_at_eod(tokens: list[int], eod: int) -> list[list[int]]:
    docs: list[list[int]] = [[]]
    for t in tokens:
        docs[-1].append(t)
        if t == eod:
            docs.append([])
    return [d for d in docs if d]


def as_rows(batches: list[dict[str, torch.Tensor]]) -> list[dict[str, list[int]]]:
    rows = []
    for b in batches:
        for i in range(len(b["input_ids"])):
            rows.append({k: v[i].tolist() for k, v in b.items()})
    return rows


# -- writing token files --------------------------------------------------------------


def write_megatron(prefix: Path, documents: list[list[list[int]]], dtype: Any) -> tuple[str, str]:
    """A Megatron pair as its documented layout says: the .bin is the
    sequences' tokens; the .idx is the magic, u64 version 1, u8 dtype code,
    u64 sequence count, u64 document-index count, int32 lengths, int64 byte
    pointers, int64 document indices (0, then each document's end)."""
    dt = np.dtype(dtype)
    sequences = [seq for doc in documents for seq in doc]
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * dt.itemsize
    doc_index = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(np.int64)
    bin_path, idx_path = f"{prefix}.bin", f"{prefix}.idx"
    np.concatenate([np.asarray(s, dtype=dt) for s in sequences]).tofile(bin_path)
    with open(idx_path, "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", MEGATRON_CODES[dt]))
        f.write(struct.pack("<Q", len(sequences)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())
    return bin_path, idx_path


def random_documents(seed: int, count: int, eod: int, longest: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(1, 500, size=int(rng.integers(0, longest))).tolist() + [eod]
        for _ in range(count)
    ]


# -- windows ----------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len", [1, 7, 32])
def test_windows_equal_the_reference_across_files_and_formats(tmp_path: Path, seq_len: int):
    rng = np.random.default_rng(seq_len)
    a = rng.integers(0, 60000, size=301).astype(np.uint16)
    b = rng.integers(0, 60000, size=77).astype(np.uint16)
    a.tofile(tmp_path / "a.bin")
    np.save(tmp_path / "b.npy", b)
    ds = chute.TokenDataset(
        [str(tmp_path / "a.bin"), str(tmp_path / "b.npy")], seq_len, dtype="uint16"
    )
    expected = reference_windows(a.tolist() + b.tolist(), seq_len)
    assert len(ds) == len(expected)
    assert ds.field_names() == ["input_ids", "labels"]
    loader = chute.DataLoader(ds, batch_size=5, num_workers=2)
    assert as_rows(list(loader)) == expected
    item = ds[len(ds) - 1]
    assert item["input_ids"].dtype == torch.int64
    assert item["input_ids"].tolist() == expected[-1]["input_ids"]
    stats = ds.token_stats()
    assert stats["tokens"] == 378 and stats["unused_tokens"] == 378 - len(expected) * seq_len


def test_windows_of_uint32_int32_and_int32_output(tmp_path: Path):
    big = np.arange(100_000, 100_000 + 500, dtype=np.uint32)
    big.tofile(tmp_path / "big.bin")
    np.save(tmp_path / "small.npy", np.arange(50, dtype=np.int32))
    ds = chute.TokenDataset([str(tmp_path / "big.bin")], 16, dtype=np.uint32, out_dtype=torch.int32)
    batch = next(iter(chute.DataLoader(ds, batch_size=3)))
    assert batch["input_ids"].dtype == torch.int32
    assert batch["labels"][2].tolist() == list(range(100_033, 100_049))
    npy = chute.TokenDataset(str(tmp_path / "small.npy"), 7)
    assert npy[6]["labels"].tolist() == list(range(43, 50))


def test_shuffled_loader_delivers_every_window_once(tmp_path: Path):
    tokens = np.arange(4097, dtype=np.uint16)
    tokens.tofile(tmp_path / "t.bin")
    ds = chute.TokenDataset(str(tmp_path / "t.bin"), 64, dtype="uint16")
    g = torch.Generator().manual_seed(7)
    batches = list(chute.DataLoader(ds, batch_size=8, shuffle=True, generator=g, num_workers=2))
    ids = torch.cat([b["input_ids"] for b in batches]).reshape(-1)
    assert sorted(ids.tolist()) == list(range(4096))
    # torch's order for the same generator: the same windows in the same order.
    g2 = torch.Generator().manual_seed(7)
    order = list(
        torch.utils.data.DataLoader(range(len(ds)), batch_size=8, shuffle=True, generator=g2)
    )
    assert [b["input_ids"][:, 0].div(64).long().tolist() for b in batches] == [
        o.tolist() for o in order
    ]


# -- documents ----------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len", [8, 33, 64])
def test_documents_equal_the_reference(tmp_path: Path, seq_len: int):
    eod = 0
    docs = random_documents(1, 120, eod, longest=90)  # some longer than seq_len
    flat = [t for d in docs for t in d]
    cut = len(flat) // 3
    np.asarray(flat[:cut], dtype=np.uint16).tofile(tmp_path / "a.bin")
    np.save(tmp_path / "b.npy", np.asarray(flat[cut:], dtype=np.int32))
    with pytest.raises(ValueError, match="holds int32 tokens"):
        chute.TokenDataset(
            [str(tmp_path / "a.bin"), str(tmp_path / "b.npy")], seq_len, dtype="uint16"
        )
    np.asarray(flat[cut:], dtype=np.uint16).tofile(tmp_path / "b.bin")
    ds = chute.TokenDataset(
        [str(tmp_path / "a.bin"), str(tmp_path / "b.bin")],
        seq_len,
        dtype="uint16",
        pack="documents",
        eod_id=eod,
        pad_id=7,
    )
    # Documents do not continue across files: the cut splits one in two.
    file_docs = split_at_eod(flat[:cut], eod) + split_at_eod(flat[cut:], eod)
    expected = reference_documents(file_docs, seq_len, pad_id=7)
    assert len(ds) == len(expected)
    assert ds.field_names() == ["input_ids", "labels", "position_ids"]
    got = as_rows(list(chute.DataLoader(ds, batch_size=4, num_workers=2)))
    assert got == expected
    stats = ds.stats()
    assert stats["documents"] == len(file_docs)
    # Every token is in some sequence's input: the rest is padding.
    assert stats["pad_tokens"] == len(expected) * seq_len - len(flat)
    assert stats["pad_tokens"] == sum(r["labels"].count(IGNORE) for r in expected) - len(file_docs)
    assert list(ds.document_lengths()) == [len(d) for d in file_docs]


def test_documents_boundaries_positions_and_cu_seqlens(tmp_path: Path):
    # documents (eod 9): [1 2 9] [3 9] [4 5 6 7 8 1 2 9] [5]
    np.asarray([1, 2, 9, 3, 9, 4, 5, 6, 7, 8, 1, 2, 9, 5], dtype=np.uint16).tofile(
        tmp_path / "t.bin"
    )
    ds = chute.TokenDataset(str(tmp_path / "t.bin"), 5, dtype="uint16", pack="documents", eod_id=9)
    rows = as_rows(list(chute.DataLoader(ds, batch_size=10)))
    assert [r["input_ids"] for r in rows] == [
        [1, 2, 9, 3, 9],
        [4, 5, 6, 7, 8],  # the long document starts a sequence and is cut
        [1, 2, 9, 5, 9],  # its rest, then [5]; padding is pad_id (eod by default)
    ]
    assert [r["labels"] for r in rows] == [
        [2, 9, IGNORE, 9, IGNORE],
        [5, 6, 7, 8, 1],  # the piece's last label is the document's next token
        [2, 9, IGNORE, IGNORE, IGNORE],
    ]
    assert [r["position_ids"] for r in rows] == [
        [0, 1, 2, 0, 1],
        [0, 1, 2, 3, 4],
        [0, 1, 2, 0, 0],
    ]
    batch = next(iter(chute.DataLoader(ds, batch_size=3)))
    bounds, longest = chute.cu_seqlens(batch["position_ids"])
    assert bounds.dtype == torch.int32
    assert bounds.tolist() == [0, 3, 5, 10, 13, 14, 15]
    assert longest == 5
    assert ds.token_stats()["pad_tokens"] == 1


def test_megatron_files_written_by_the_layout_read_back(tmp_path: Path):
    docs16 = [[[5, 6, 7], [8]], [[9, 10]], [[11, 12, 13, 14, 15, 16]]]  # sentences per document
    bin16, idx16 = write_megatron(tmp_path / "m16", docs16, np.uint16)
    docs32 = [[[70_000, 70_001]], [[70_002]]]
    _, idx32 = write_megatron(tmp_path / "m32", docs32, np.int32)
    # A .bin with its .idx beside it, and a pair named by its .idx.
    ds = chute.TokenDataset([bin16, idx32], 4, pack="documents")
    lengths = [4, 2, 6, 2, 1]
    assert list(ds.document_lengths()) == lengths
    flat_docs = [[t for s in d for t in s] for d in docs16 + docs32]
    assert as_rows(list(chute.DataLoader(ds, batch_size=2))) == reference_documents(
        flat_docs, 4, pad_id=0
    )
    windows = chute.TokenDataset([bin16, idx32], 3)
    stream = [t for d in flat_docs for t in d]
    assert as_rows(list(chute.DataLoader(windows, batch_size=2))) == reference_windows(stream, 3)
    # A glob naming both files of each pair reads each pair once.
    assert len(chute.TokenDataset(str(tmp_path / "m16.*"), 3)) == len(chute.TokenDataset(bin16, 3))


# -- bad inputs ----------------------------------------------------------------------------


def test_raw_length_not_a_multiple_of_the_dtype(tmp_path: Path):
    path = tmp_path / "odd.bin"
    path.write_bytes(np.arange(10, dtype=np.uint32).tobytes() + b"\x01\x02")
    with pytest.raises(
        chute.DataError, match=r"odd\.bin.*42 bytes.*uint32.*2 bytes left over at byte offset 40"
    ):
        chute.TokenDataset(str(path), 4, dtype="uint32")


def test_raw_needs_a_dtype_and_documents_need_an_end(tmp_path: Path):
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="give dtype"):
        chute.TokenDataset(str(tmp_path / "t.bin"), 4)
    with pytest.raises(ValueError, match="needs eod_id"):
        chute.TokenDataset(str(tmp_path / "t.bin"), 4, dtype="uint16", pack="documents")
    with pytest.raises(ValueError, match="pack must be"):
        chute.TokenDataset(str(tmp_path / "t.bin"), 4, dtype="uint16", pack="greedy")
    with pytest.raises(ValueError, match="a token array is 1-D"):
        np.save(tmp_path / "two.npy", np.zeros((3, 4), dtype=np.int32))
        chute.TokenDataset(str(tmp_path / "two.npy"), 4)
    with pytest.raises(ValueError, match="holds integers, this .npy holds float32"):
        np.save(tmp_path / "f.npy", np.zeros(8, dtype=np.float32))
        chute.TokenDataset(str(tmp_path / "f.npy"), 4)


def _corrupt(idx: str, offset: int, data: bytes) -> None:
    with open(idx, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize(
    ("offset", "data", "message"),
    [
        (0, b"XX", r"m\.idx.*bad magic at byte offset 0"),
        (9, struct.pack("<Q", 2), r"m\.idx.*version 2 at byte offset 9"),
        (17, b"\x07", r"m\.idx.*dtype code 7 at byte offset 17"),
        (18, struct.pack("<Q", 4), r"m\.idx.*declares 4 sequences"),
        # the length of sequence 1 (int32 at 34 + 4)
        (
            38,
            struct.pack("<i", 50),
            r"sequence 1 \(byte offset 54\) ends at byte 104 of '.*m\.bin', which has 12 bytes",
        ),
        # the pointer of sequence 2 (int64 at 34 + 3 * 4 + 2 * 8)
        (62, struct.pack("<q", 1 << 20), r"m\.idx.*sequence 2 \(byte offset 62\) ends at byte"),
        (62, struct.pack("<q", 3), r"sequence 2 starts at byte 3 of the \.bin \(byte offset 62\)"),
        # the last document index (int64 at 34 + 36 + 2 * 8)
        (86, struct.pack("<q", 2), r"m\.idx.*end at 2, not at the 3 sequences \(byte offset 70\)"),
    ],
    ids=[
        "magic",
        "version",
        "dtype",
        "counts",
        "length-past-end",
        "pointer-past-end",
        "pointer-not-at-token",
        "documents",
    ],
)
def test_megatron_index_that_does_not_match_its_bin(
    tmp_path: Path, offset: int, data: bytes, message: str
):
    _, idx = write_megatron(tmp_path / "m", [[[1, 2], [3]], [[4, 5, 6]]], np.uint16)
    chute.TokenDataset(idx, 2)  # intact, it reads
    _corrupt(idx, offset, data)
    with pytest.raises(chute.DataError, match=message):
        chute.TokenDataset(idx, 2)


def test_megatron_index_cut_short(tmp_path: Path):
    _, idx = write_megatron(tmp_path / "m", [[[1, 2], [3]]], np.uint16)
    Path(idx).write_bytes(Path(idx).read_bytes()[:-3])
    with pytest.raises(chute.DataError, match=r"m\.idx.*: 71 bytes, but its header"):
        chute.TokenDataset(idx, 2)


def test_token_ids_beyond_the_vocabulary_refused_at_open(tmp_path: Path):
    tokens = np.arange(100, dtype=np.uint16) % 50
    tokens[77] = 50
    tokens[90] = 60
    tokens.tofile(tmp_path / "v.bin")
    # The first id outside the vocabulary, by its byte offset.
    with pytest.raises(
        chute.DataError,
        match=r"v\.bin': token id 50 at byte offset 154 is outside the vocabulary"
        r" \(vocab_size 50\)",
    ):
        chute.TokenDataset(str(tmp_path / "v.bin"), 10, dtype="uint16", vocab_size=50)
    ds = chute.TokenDataset(str(tmp_path / "v.bin"), 10, dtype="uint16", vocab_size=61)
    assert len(list(chute.DataLoader(ds, batch_size=4, num_workers=2))) == 3
    # Negative ids of a signed file are outside it too.
    signed = np.arange(30, dtype=np.int32)
    signed[12] = -3
    np.save(tmp_path / "s.npy", signed)
    with pytest.raises(chute.DataError, match=r"s\.npy': token id -3 at byte offset 176 "):
        chute.TokenDataset(str(tmp_path / "s.npy"), 5, vocab_size=1000)
    # A Megatron pair names its .bin; every file of a dataset is checked.
    _, good = write_megatron(tmp_path / "g", [[[1, 2], [3]]], np.int32)
    _, bad = write_megatron(tmp_path / "m", [[[1, 2], [3]], [[4, 999, 6]]], np.int32)
    with pytest.raises(chute.DataError, match=r"m\.bin': token id 999 at byte offset 16 "):
        chute.TokenDataset([good, bad], 2, vocab_size=999)
    assert len(chute.TokenDataset([good, bad], 2, vocab_size=1000)) == 4
    # Bytes of a Megatron .bin that lie in no sequence hold no tokens.
    data = np.array([99, 1, 2, 99, 99, 3, 4, 5, 99, 6], dtype=np.uint16)
    with open(tmp_path / "g.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 3, 3))
        f.write(np.array([2, 3, 1], dtype=np.int32).tobytes())
        f.write(np.array([2, 10, 18], dtype=np.int64).tobytes())
        f.write(np.array([0, 2, 3], dtype=np.int64).tobytes())
    data.tofile(tmp_path / "g.bin")
    assert len(chute.TokenDataset(str(tmp_path / "g.idx"), 2, vocab_size=10)) == 2
    data[6] = 50
    data.tofile(tmp_path / "g2.bin")
    (tmp_path / "g2.idx").write_bytes((tmp_path / "g.idx").read_bytes())
    with pytest.raises(chute.DataError, match=r"g2\.bin': token id 50 at byte offset 12 "):
        chute.TokenDataset(str(tmp_path / "g2.idx"), 2, vocab_size=10)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
            chute.TokenDataset(str(tmp_path / "s.npy"), 5, vocab_size=bad)


def test_vocabulary_check_reads_a_file_once(tmp_path: Path, monkeypatch: Any):
    import chute.datasets.tokens

    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "a.bin")
    reads: list[str] = []
    real = chute.datasets.tokens._tokens_of

    def counting(f: Any) -> Any:
        reads.append(f.path)
        return real(f)

    monkeypatch.setattr(chute.datasets.tokens, "_tokens_of", counting)
    path = str(tmp_path / "a.bin")
    chute.TokenDataset(path, 10, dtype="uint16", vocab_size=1000)
    chute.TokenDataset(path, 10, dtype="uint16", vocab_size=2000)
    assert reads == [path]
    # A smaller vocabulary: the error is located by reading the file again.
    with pytest.raises(chute.DataError, match=r"token id 999 at byte offset 1998 "):
        chute.TokenDataset(path, 10, dtype="uint16", vocab_size=999)
    assert reads == [path, path]
    # A file written again is a new file to check.
    arr = np.arange(1000, dtype=np.uint16)
    arr[3] = 4000
    written = Path(path).stat().st_mtime_ns
    arr.tofile(path)
    os.utime(path, ns=(written + 10**9, written + 10**9))
    with pytest.raises(chute.DataError, match=r"token id 4000 at byte offset 6 "):
        chute.TokenDataset(path, 10, dtype="uint16", vocab_size=2000)


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_an_id_that_int32_batches_cannot_hold_is_refused(tmp_path: Path, dtype: Any):
    ids = np.arange(40, dtype=dtype)
    ids[21] = 2**31 + 7  # wraps to a negative int32
    np.save(tmp_path / "ids.npy", ids)
    ds = chute.TokenDataset(str(tmp_path / "ids.npy"), 4, out_dtype=torch.int32)
    assert ds[0]["input_ids"].tolist() == [0, 1, 2, 3]
    with pytest.raises(
        chute.DataError,
        match=r"ids\.npy': token id 2147483655 at byte offset \d+ does not fit the int32 batches",
    ):
        ds[5]  # tokens 20 to 24
    wide = chute.TokenDataset(str(tmp_path / "ids.npy"), 4)  # int64 batches hold it
    assert wide[5]["input_ids"].tolist() == [20, 2**31 + 7, 22, 23]


def test_a_file_given_twice_is_refused(tmp_path: Path):
    path = str(tmp_path / "a.bin")
    np.arange(100, dtype=np.uint16).tofile(path)
    with pytest.raises(ValueError, match=r"'.*a\.bin' is given twice; each file is read once"):
        chute.TokenDataset([path, path], 9, dtype="uint16")


def test_vocabulary_check_reads_a_file_rewritten_with_its_times_set_back(tmp_path: Path):
    path = tmp_path / "a.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    chute.TokenDataset(str(path), 10, dtype="uint16", vocab_size=1000)
    bad = np.arange(1000, dtype=np.uint16)
    bad[3] = 4000
    rewrite_with_its_times_set_back(path, lambda: path.write_bytes(bad.tobytes()))
    with pytest.raises(chute.DataError, match=r"token id 4000 at byte offset 6 "):
        chute.TokenDataset(str(path), 10, dtype="uint16", vocab_size=1000)


def test_a_copy_that_maps_changed_files_again_names_them(tmp_path: Path):
    path = tmp_path / "w.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    windows = chute.TokenDataset(str(path), 8, dtype="uint16")
    np.arange(3000, dtype=np.uint16).tofile(path)
    copy = pickle.loads(pickle.dumps(windows))  # as a worker process gets it
    with pytest.raises(
        chute.DataError,
        match=r"'.*w\.bin': the file changed after the dataset opened it \(2000 bytes, 1000 "
        r"uint16 tokens; now 6000 bytes, 3000 uint16 tokens\): open the dataset again",
    ):
        copy[0]
    # The same size, other documents: the sequences they make are counted again.
    docs = tmp_path / "docs.bin"
    np.tile(np.array([1, 2, 3, 4, 0], np.uint16), 20).tofile(docs)
    packed = chute.TokenDataset(str(docs), 8, dtype="uint16", pack="documents", eod_id=0)
    np.tile(np.array([1, 2, 0, 3, 4], np.uint16), 20).tofile(docs)
    copy = pickle.loads(pickle.dumps(packed))
    with pytest.raises(chute.DataError, match=r"make 19 sequences, not 20: open the dataset"):
        copy[0]


# -- resume, elastic resume, mixing ---------------------------------------------------------


def counting_dataset(tmp_path: Path, name: str, sequences: int, seq_len: int, first: int) -> Any:
    """Token ids that are their own positions (plus `first`): every token
    delivered names itself."""
    np.arange(first, first + sequences * seq_len + 1, dtype=np.uint32).tofile(tmp_path / name)
    return chute.TokenDataset(str(tmp_path / name), seq_len, dtype="uint32")


def test_resume_mid_epoch_gives_the_rest_of_the_epoch(tmp_path: Path):
    ds = counting_dataset(tmp_path, "r.bin", 37, 16, 0)

    def loader() -> Any:
        return chute.DataLoader(
            ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(11)
        )

    full = [b["input_ids"] for b in loader()]
    first = loader()
    it = iter(first)
    seen = [next(it)["input_ids"] for _ in range(3)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    rest = [b["input_ids"] for b in second]
    assert len(seen) + len(rest) == len(full)
    for a, b in zip(seen + rest, full, strict=True):
        assert torch.equal(a, b)
    tokens = torch.cat(seen + rest).reshape(-1).tolist()
    assert sorted(tokens) == list(range(37 * 16))
    # A state of other files, or of the same file cut otherwise, is refused.
    other = counting_dataset(tmp_path, "o.bin", 37, 16, 5)
    with pytest.raises(ValueError, match="dataset"):
        chute.DataLoader(other, batch_size=4, shuffle=True).load_state_dict(state)
    shorter = chute.TokenDataset(str(tmp_path / "r.bin"), 8, dtype="uint32")
    with pytest.raises(ValueError, match="rows=37 in the state, 74 in this loader"):
        chute.DataLoader(shorter, batch_size=4, shuffle=True).load_state_dict(state)


def token_ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return batch["input_ids"].reshape(-1).tolist()


@pytest.mark.parametrize("world", [2, 3, 6])
def test_elastic_resume_delivers_every_token_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int
):
    ds = counting_dataset(tmp_path, "e.bin", 50, 8, 0)

    def make() -> Any:
        return chute.DataLoader(ds, batch_size=2, distributed=True, num_workers=2)

    first, states = run_ranks(monkeypatch, 4, make, token_ids, batches=3)
    assert all(s["elastic"] == states[0]["elastic"] for s in states)
    second, _ = run_ranks(monkeypatch, world, make, token_ids, state=states[0])
    seen = collections.Counter(
        t for part in (first, second) for rank in part for batch in rank for t in batch
    )
    assert sorted(seen) == list(range(50 * 8)) and set(seen.values()) == {1}
    assert_equal_batch_counts(second, -(-(50 - 24) // (world * 2)))


@pytest.mark.parametrize("world", [2, 3, 6])
def test_mix_of_two_token_sources_by_tokens_resumes_elastically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int
):
    web = counting_dataset(tmp_path, "web.bin", 60, 8, 0)
    books = counting_dataset(tmp_path, "books.bin", 40, 8, 1_000_000)
    mixed = chute.mix({"web": web, "books": books}, weights={"web": 0.75, "books": 0.25}, seed=3)

    def make() -> Any:
        return chute.DataLoader(mixed, batch_size=2, distributed=True)

    first, states = run_ranks(monkeypatch, 4, make, token_ids, batches=2)
    second, _ = run_ranks(monkeypatch, world, make, token_ids, state=states[0])
    seen = collections.Counter(
        t for part in (first, second) for rank in part for batch in rank for t in batch
    )
    assert set(seen.values()) == {1}
    counts = mixed.counts(2)
    from_web = sum(1 for t in seen if t < 1_000_000)
    from_books = len(seen) - from_web
    # By tokens: every sequence holds seq_len tokens, so the shares of
    # sequences are the shares of tokens.
    assert (from_web, from_books) == (counts["web"] * 8, counts["books"] * 8)
    assert from_web == 3 * from_books
    total = counts["web"] + counts["books"]
    assert_equal_batch_counts(second, -(-(total - 16) // (world * 2)))


def test_state_and_batches_through_a_pickled_copy(tmp_path: Path):
    import pickle

    ds = counting_dataset(tmp_path, "p.bin", 10, 4, 0)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.state_identity() == ds.state_identity()
    assert copy[3]["input_ids"].tolist() == [12, 13, 14, 15]


# -- remote ---------------------------------------------------------------------------------


def test_remote_token_files_through_the_node_cache(tmp_path: Path, object_server: Any):
    pytest.importorskip("obstore")
    tokens = np.arange(1000, dtype=np.uint16)
    object_server.objects["/tok/train.bin"] = tokens.tobytes()
    _, idx = write_megatron(tmp_path / "m", [[[1, 2, 3]], [[4, 5]]], np.uint16)
    object_server.objects["/tok/m.bin"] = (tmp_path / "m.bin").read_bytes()
    object_server.objects["/tok/m.idx"] = Path(idx).read_bytes()
    url = f"{object_server.url}/tok/train.bin"
    with pytest.raises(ValueError, match="give cache_dir"):
        chute.TokenDataset(url, 16, dtype="uint16")
    cache = str(tmp_path / "cache")
    ds = chute.TokenDataset(url, 16, dtype="uint16", cache_dir=cache)
    local_copy = tmp_path / "train.bin"
    tokens.tofile(local_copy)
    local = chute.TokenDataset(str(local_copy), 16, dtype="uint16")
    g = lambda: torch.Generator().manual_seed(2)  # noqa: E731
    for a, b in zip(
        chute.DataLoader(ds, batch_size=8, shuffle=True, generator=g()),
        chute.DataLoader(local, batch_size=8, shuffle=True, generator=g()),
        strict=True,
    ):
        assert torch.equal(a["input_ids"], b["input_ids"])
    mega = chute.TokenDataset(
        f"{object_server.url}/tok/m.idx", 4, pack="documents", cache_dir=cache
    )
    assert as_rows(list(chute.DataLoader(mega, batch_size=2))) == reference_documents(
        [[1, 2, 3], [4, 5]], 4, pad_id=0
    )


# -- chute inspect ---------------------------------------------------------------------------


def test_inspect_reports_token_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import json

    from chute.cli.main import main

    np.asarray([1, 2, 0, 3, 4, 5, 0, 6], dtype=np.uint16).tofile(tmp_path / "raw.bin")
    _, idx = write_megatron(tmp_path / "m", [[[1, 2], [3]], [[4, 5, 6, 7]]], np.int32)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    args = ["--json", "--dtype", "uint16", "--eod-id", "0"]
    code = main(["inspect", str(tmp_path / "raw.bin"), idx, *args])
    reports = json.loads(capsys.readouterr().out)
    assert code == 0
    raw, mega = reports
    assert (raw["format"], raw["dtype"], raw["tokens"], raw["documents"]) == ("raw", "uint16", 8, 3)
    assert raw["document_lengths"]["max"] == 4 and raw["document_lengths"]["min"] == 1
    assert (mega["format"], mega["dtype"], mega["tokens"], mega["documents"]) == (
        "megatron",
        "int32",
        7,
        2,
    )
    assert mega["document_lengths"]["median"] == 3.5
    code = main(["inspect", str(tmp_path / "odd.bin"), "--dtype", "uint16"])
    out = capsys.readouterr().out
    assert code == 1
    assert (
        "odd.bin': 3 bytes is not a whole number of uint16 tokens: "
        "1 bytes left over at byte offset 2" in out
    )


def test_megatron_sequences_with_gaps_between_them(tmp_path: Path):
    # Sequences need not lie back to back in the .bin: the stream is the
    # sequences in index order, whatever lies between or around them.
    data = np.array([99, 1, 2, 99, 99, 3, 4, 5, 99, 6], dtype=np.uint16)
    data.tofile(tmp_path / "g.bin")
    lengths = np.array([2, 3, 1], dtype=np.int32)
    pointers = np.array([2, 10, 18], dtype=np.int64)  # bytes
    documents = np.array([0, 2, 3], dtype=np.int64)
    with open(tmp_path / "g.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 3, 3))
        f.write(lengths.tobytes() + pointers.tobytes() + documents.tobytes())
    windows = chute.TokenDataset(str(tmp_path / "g.idx"), 2)
    assert as_rows(list(chute.DataLoader(windows, batch_size=8))) == reference_windows(
        [1, 2, 3, 4, 5, 6], 2
    )
    docs = chute.TokenDataset(str(tmp_path / "g.idx"), 6, pack="documents")
    assert list(docs.document_lengths()) == [5, 1]
    assert as_rows(list(chute.DataLoader(docs, batch_size=8))) == reference_documents(
        [[1, 2, 3, 4, 5], [6]], 6, pad_id=0
    )


# -- a token file cut while it is mapped ---------------------------------------------

TOKENS_CUT = """
import os, sys
sys.path.insert(0, {python!r})
import numpy as np
import torch
import chute

path = {path!r}
ds = chute.TokenDataset(
    path, 256, dtype="uint16", out_dtype=getattr(torch, {out_dtype!r}), window_views={views}
)
g = torch.Generator().manual_seed(0)
loader = chute.DataLoader(ds, batch_size=8, shuffle=True, num_workers={workers}, generator=g)
it = iter(loader)
next(it)
# Another process rewrites the file: a third of it is left, the rest is gone.
os.truncate(path, 100_000 + 1)
try:
    for batch in it:
        pass
except chute.ReadError as e:
    print("ReadError:", e)
"""


@pytest.mark.parametrize(
    ("out_dtype", "views", "workers"),
    [("int64", False, 0), ("uint16", False, 0), ("uint16", True, 0), ("uint16", True, 2)],
)
def test_token_file_cut_while_mapped_raises_read_error(
    tmp_path: Path, out_dtype: str, views: bool, workers: int
):
    # Pages past the new end fault (SIGBUS, which would kill the process:
    # hence the subprocess); the end's own page reads as zeros. Both must be
    # a ReadError naming the file and the byte offset, whether the batches
    # are made on the caller's thread (num_workers=0) or on engine threads.
    path = tmp_path / "train.bin"
    np.random.default_rng(0).integers(1, 50000, size=150_000, dtype=np.uint16).tofile(path)
    script = TOKENS_CUT.format(
        python=str(Path(chute.__file__).parent.parent),
        path=str(path),
        out_dtype=out_dtype,
        views=views,
        workers=workers,
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "ReadError:" in done.stdout, done.stdout
    assert f"'{path}': tokens at byte offset " in done.stdout
    assert "are gone: the file was cut to 100001 bytes after it was opened" in done.stdout
