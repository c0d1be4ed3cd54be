"""chute.TokenDataset(window_views=True): each batch is one [batch, seq_len +
1] tensor the engine writes once, with input_ids and labels as views of it
(its [:, :-1] and [:, 1:]); the tokens still equal the plain-Python
reference packer's (tests/dataset_kinds/test_tokens.py). Without it, two contiguous
tensors as before."""

from __future__ import annotations

import collections
from pathlib import Path

import chute
import numpy as np
import pytest
import torch
from helpers import run_ranks
from test_tokens import as_rows, reference_windows

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native


def _windows_file(tmp_path: Path, tokens: int, seed: int) -> tuple[str, list[int]]:
    stream = np.random.default_rng(seed).integers(0, 60000, size=tokens).astype(np.uint16)
    path = tmp_path / "t.bin"
    stream.tofile(path)
    return str(path), stream.tolist()


def _assert_views_of_one_window(batch: dict[str, torch.Tensor], seq_len: int) -> None:
    inputs, labels = batch["input_ids"], batch["labels"]
    assert inputs.shape == labels.shape == (inputs.shape[0], seq_len)
    assert inputs.stride() == labels.stride() == (seq_len + 1, 1)
    assert labels.data_ptr() == inputs.data_ptr() + inputs.element_size()


@pytest.mark.parametrize("out_dtype", [torch.int64, torch.int32])
def test_input_ids_and_labels_are_views_of_one_window_buffer(
    tmp_path: Path, out_dtype: torch.dtype
) -> None:
    path, stream = _windows_file(tmp_path, 1000, seed=1)
    seq_len = 16
    ds = chute.TokenDataset(path, seq_len, dtype="uint16", out_dtype=out_dtype, window_views=True)
    g = torch.Generator().manual_seed(3)
    batches = list(chute.DataLoader(ds, batch_size=6, shuffle=True, generator=g, num_workers=2))
    for batch in batches:
        assert batch["input_ids"].dtype == batch["labels"].dtype == out_dtype
        _assert_views_of_one_window(batch, seq_len)
    order = list(
        torch.utils.data.DataLoader(
            range(len(ds)), batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(3)
        )
    )
    expected = reference_windows(stream, seq_len)
    assert as_rows(batches) == [expected[i] for b in order for i in b.tolist()]


def test_writing_into_labels_changes_input_ids_unless_cloned(tmp_path: Path) -> None:
    path, stream = _windows_file(tmp_path, 200, seed=2)
    ds = chute.TokenDataset(path, 8, dtype="uint16", window_views=True)
    batch = next(iter(chute.DataLoader(ds, batch_size=4)))
    labels = batch["labels"].clone()
    labels[:, 0] = -100
    assert batch["input_ids"][:, 1].tolist() == [stream[i * 8 + 1] for i in range(4)]
    batch["labels"][:, 0] = -100  # the documented pitfall: labels[j] is input_ids[j + 1]
    assert batch["input_ids"][:, 1].tolist() == [-100] * 4


def test_items_and_torch_dataloader_rows_are_the_reference_windows(tmp_path: Path) -> None:
    path, stream = _windows_file(tmp_path, 500, seed=4)
    seq_len = 7
    ds = chute.TokenDataset(path, seq_len, dtype="uint16", window_views=True)
    expected = reference_windows(stream, seq_len)
    item = ds[5]
    assert item["labels"].data_ptr() == item["input_ids"].data_ptr() + 8
    assert {k: v.tolist() for k, v in item.items()} == expected[5]
    # torch's DataLoader takes rows through __getitems__ and stacks them.
    loader = torch.utils.data.DataLoader(ds, batch_size=9)
    assert as_rows(list(loader)) == expected


def test_without_window_views_input_ids_and_labels_are_contiguous(tmp_path: Path) -> None:
    path, stream = _windows_file(tmp_path, 300, seed=5)
    ds = chute.TokenDataset(path, 8, dtype="uint16")
    batch = next(iter(chute.DataLoader(ds, batch_size=4)))
    assert batch["input_ids"].is_contiguous() and batch["labels"].is_contiguous()
    assert as_rows([batch]) == reference_windows(stream, 8)[:4]


def test_window_views_only_for_windows(tmp_path: Path) -> None:
    np.zeros(20, dtype=np.uint16).tofile(tmp_path / "d.bin")
    with pytest.raises(ValueError, match=r"window_views=True is for pack='windows'"):
        chute.TokenDataset(
            str(tmp_path / "d.bin"),
            4,
            dtype="uint16",
            pack="documents",
            eod_id=0,
            window_views=True,
        )


def test_documents_labels_are_their_own_buffer(tmp_path: Path) -> None:
    tokens = np.array([1, 2, 0, 3, 4, 5, 0, 6, 0], dtype=np.uint16)
    tokens.tofile(tmp_path / "d.bin")
    ds = chute.TokenDataset(str(tmp_path / "d.bin"), 4, dtype="uint16", pack="documents", eod_id=0)
    batch = next(iter(chute.DataLoader(ds, batch_size=3)))
    for name in ("input_ids", "labels", "position_ids"):
        assert batch[name].is_contiguous()
    assert batch["labels"].untyped_storage().data_ptr() != (
        batch["input_ids"].untyped_storage().data_ptr()
    )
    assert batch["labels"][0].tolist() == [2, 0, -100, -100]


def test_mix_of_window_views_and_contiguous_sources(tmp_path: Path) -> None:
    path, stream = _windows_file(tmp_path, 400, seed=6)
    views = chute.TokenDataset(path, 8, dtype="uint16", window_views=True)
    plain = chute.TokenDataset(path, 8, dtype="uint16")
    mixed = chute.mix({"a": views, "b": plain}, weights={"a": 0.5, "b": 0.5}, seed=0)
    expected = [tuple(r["input_ids"] + r["labels"][-1:]) for r in reference_windows(stream, 8)]
    rows = as_rows(list(chute.DataLoader(mixed, batch_size=6)))
    assert len(rows) == len(mixed)
    assert all(tuple(r["input_ids"] + r["labels"][-1:]) in expected for r in rows)
    assert all(r["labels"][:-1] == r["input_ids"][1:] for r in rows)


@pytest.mark.parametrize("window_views", [False, True])
def test_batches_in_the_files_own_dtype(tmp_path: Path, window_views: bool) -> None:
    # out_dtype=torch.uint16 over nanoGPT's uint16 files: the batch is the
    # files' bytes, ids above int16's range included, across two files.
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    stream = np.random.default_rng(7).integers(0, 65536, size=700).astype(np.uint16)
    stream[:300].tofile(first)
    stream[300:].tofile(second)
    ds = chute.TokenDataset(
        [str(first), str(second)],
        16,
        dtype="uint16",
        out_dtype=torch.uint16,
        window_views=window_views,
    )
    g = torch.Generator().manual_seed(5)
    batches = list(chute.DataLoader(ds, batch_size=5, shuffle=True, generator=g))
    assert all(b[k].dtype == torch.uint16 for b in batches for k in ("input_ids", "labels"))
    order = torch.utils.data.DataLoader(
        range(len(ds)), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(5)
    )
    expected = reference_windows(stream.tolist(), 16)
    assert as_rows(batches) == [expected[i] for b in order for i in b.tolist()]


def test_files_own_dtype_must_be_the_files_and_windows(tmp_path: Path) -> None:
    np.arange(50, dtype=np.uint32).tofile(tmp_path / "u32.bin")
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "u16.bin")
    with pytest.raises(ValueError, match=r"u32.bin' holds uint32 tokens: batches of uint16 are"):
        chute.TokenDataset(str(tmp_path / "u32.bin"), 4, dtype="uint32", out_dtype=torch.uint16)
    with pytest.raises(ValueError, match=r"out_dtype=torch.uint16 \(the files' own dtype\) is for"):
        chute.TokenDataset(
            str(tmp_path / "u16.bin"),
            4,
            dtype="uint16",
            pack="documents",
            eod_id=0,
            out_dtype=torch.uint16,
        )
    with pytest.raises(ValueError, match=r"out_dtype must be torch.int64, torch.int32 or the"):
        chute.TokenDataset(str(tmp_path / "u16.bin"), 4, dtype="uint16", out_dtype=torch.float32)


# -- num_workers=0: batches made in the consumer's own next() ------------------------


def _engine_threads() -> int:
    """This process's native engine threads now (named by the engine)."""
    names = [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]
    return sum(name == "chute-read" for name in names)


def _windows_loader(path: str, workers: int, **kwargs: object) -> chute.DataLoader:
    ds = chute.TokenDataset(path, 16, dtype="uint16", out_dtype=torch.uint16, window_views=True)
    return chute.DataLoader(ds, batch_size=5, num_workers=workers, **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads listed by /proc")
def test_no_workers_makes_each_batch_on_the_consumers_thread(tmp_path: Path) -> None:
    path, stream = _windows_file(tmp_path, 2000, seed=4)
    inline = _windows_loader(path, 0, shuffle=True, generator=torch.Generator().manual_seed(5))
    threaded = _windows_loader(path, 2, shuffle=True, generator=torch.Generator().manual_seed(5))
    before = _engine_threads()
    got = []
    for batch in inline:
        assert _engine_threads() == before  # no engine thread behind the loop
        got.append(batch)
    expected = list(threaded)
    assert len(got) == len(expected) == -(-(1999 // 16) // 5)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert torch.equal(a["labels"], b["labels"])
        _assert_views_of_one_window(a, 16)
    order = torch.utils.data.DataLoader(
        range(1999 // 16), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(5)
    )
    windows = reference_windows(stream, 16)
    assert as_rows(got) == [windows[i] for b in order for i in b.tolist()]


def _rows(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    return batch["input_ids"].tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("workers", [0, 2])
def test_no_workers_resumes_as_threads_do(tmp_path: Path, workers: int) -> None:
    path, _ = _windows_file(tmp_path, 3000, seed=6)

    def loader(w: int) -> chute.DataLoader:
        return _windows_loader(path, w, shuffle=True, generator=torch.Generator().manual_seed(7))

    full = [_rows(b) for b in loader(2)]
    first = loader(workers)
    it = iter(first)
    seen = [_rows(next(it)) for _ in range(4)]
    state = first.state_dict()
    second = loader(0)  # the rest of the epoch made in-line, whoever made the start
    second.load_state_dict(state)
    assert seen + [_rows(b) for b in second] == full


def test_no_workers_gives_each_rank_the_threads_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _windows_file(tmp_path, 3000, seed=8)

    def make(workers: int) -> chute.DataLoader:
        return _windows_loader(path, workers, distributed=True)

    inline, inline_states = run_ranks(monkeypatch, 3, lambda: make(0), _rows, batches=2)
    threaded, threaded_states = run_ranks(monkeypatch, 3, lambda: make(2), _rows, batches=2)
    assert inline == threaded
    # An elastic resume on 2 ranks: the same rest of the epoch either way.
    rest_inline, _ = run_ranks(monkeypatch, 2, lambda: make(0), _rows, state=inline_states[0])
    rest_threaded, _ = run_ranks(monkeypatch, 2, lambda: make(2), _rows, state=threaded_states[0])
    assert rest_inline == rest_threaded
    windows = collections.Counter(
        tuple(row) for part in (inline, rest_inline) for rank in part for b in rank for row in b
    )
    assert len(windows) == 2999 // 16 and set(windows.values()) == {1}


class _ReadInWorker(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A whole batch per item, read in a torch worker process, with the
    engine threads that process had once it was read."""

    def __init__(self, ds: chute.TokenDataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, rows: list[int]) -> tuple[list[list[int]], int]:
        batch = self.ds.read_batch(np.asarray(rows, dtype=np.int64))
        return batch["input_ids"].tolist(), _engine_threads()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads listed by /proc")
def test_torch_worker_processes_read_without_engine_threads(tmp_path: Path) -> None:
    path, stream = _windows_file(tmp_path, 600, seed=9)
    ds = chute.TokenDataset(path, 8, dtype="uint16", out_dtype=torch.uint16, window_views=True)
    batches = [[3, 1, 4], [15, 9, 2], [6, 5]]
    loader = torch.utils.data.DataLoader(
        _ReadInWorker(ds), batch_size=None, sampler=batches, num_workers=1
    )
    windows = reference_windows(stream, 8)
    got = list(loader)
    assert [rows for rows, _ in got] == [[windows[i]["input_ids"] for i in b] for b in batches]
    assert [threads for _, threads in got] == [0, 0, 0]
