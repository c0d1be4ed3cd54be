"""`create_loader`: a loader for one split of a dataset saved as tensor files.

Directory layout::

    dataset_dir/
      config.json        {"fields": ["x", "y"]}
      x.npy              rows of field x (memory-mapped, never loaded whole)
      y.pt               rows of field y (torch.save of one tensor)
      train_idx.npy      row indices of the train split (.npy or .pt)
      val_idx.pt
      test_idx.npy

`config.json` keys:

- `fields` (required): a list of field names, each stored as `{name}.npy`
  or `{name}.pt` (`.npy` preferred when both exist), or a dict
  `{name: file}` with file paths relative to the directory. All fields must
  have the same number of rows; a batch is `{name: tensor[B, ...]}`.
- `splits` (optional): `{split: index file}` overriding the default
  `{split}_idx.npy` / `{split}_idx.pt`.
- `seed` (optional, default 0): the shuffle seed. The train order of an
  epoch is a function of (seed, epoch) only, with or without DDP.

Index files hold one 1-D integer array of row numbers (repeats allowed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.utils.data

from chute.datasets.arrays import ArrayDataset
from chute.datasets.indexed import Batch, IndexedDataset
from chute.loader.dataloader import DataLoader


def create_loader(
    dataset_dir: str | os.PathLike[str],
    split: str,
    batch_size: int,
    num_workers: int = 0,
    distributed: bool = False,
    epoch: int = 0,
    drop_last: bool | None = None,
    pin_memory: bool = True,
) -> DataLoader[Any]:
    """A `chute.DataLoader` over the rows of `split` (see the module doc for the layout).

    - `split == "train"` shuffles (a permutation per epoch from the config's
      seed and `epoch`); other splits keep index-file order.
    - `drop_last` defaults to True for train and False otherwise.
    - `distributed=True` partitions the split's rows across ranks exactly as
      `DistributedSampler(shuffle=train, seed=seed, drop_last=drop_last)`
      over the split (rank and world size from torch.distributed, else
      RANK/WORLD_SIZE). As with DistributedSampler, val/test splits whose
      length is not a multiple of the world size are padded with repeated
      rows (unless `drop_last=True`); reduce metrics accordingly.
    - `pin_memory` is applied only when CUDA is available: without it torch
      warns that pinning does nothing, and there is nothing to pin for.
    - `set_epoch(epoch)` is applied; call `loader.set_epoch(e)` for later
      epochs.
    - `num_workers` is the number of native reader threads.

    Errors: a missing directory, config, split index file or field file
    raises `FileNotFoundError` naming it; an index outside the rows raises
    `IndexError` naming the index file, the index, its position and the row
    count.
    """
    root = Path(dataset_dir)
    config = _read_config(root)
    fields = _field_files(root, config)
    base = ArrayDataset(**{name: _load_field(path) for name, path in fields.items()})
    rows = _load_index(_index_file(root, split, config), len(base))
    view = _RowView(base, rows)
    train = split == "train"
    if drop_last is None:
        drop_last = train
    seed = int(config.get("seed", 0))
    if distributed:
        sampler: torch.utils.data.Sampler[int] | None = None
    else:
        # World size 1 of torch's DistributedSampler: the permutation is a
        # function of (seed, epoch), which a generator-driven RandomSampler
        # is not, so a restarted job sees the same order for the same epoch.
        # It keeps every row; the loader's drop_last drops the short batch.
        sampler = torch.utils.data.DistributedSampler(
            view, num_replicas=1, rank=0, shuffle=train, seed=seed, drop_last=False
        )
    loader: DataLoader[Any] = DataLoader(
        view,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        drop_last=drop_last,
        distributed=distributed,
        shuffle=train if distributed else None,
        seed=seed,
    )
    loader.set_epoch(epoch)
    return loader


def _read_config(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise FileNotFoundError(2, "dataset directory not found", str(root))
    path = root / "config.json"
    if not path.is_file():
        raise FileNotFoundError(2, "config.json not found in the dataset directory", str(path))
    with open(path) as f:
        config = json.load(f)
    if not isinstance(config, dict) or "fields" not in config:
        raise ValueError(f"{path}: needs a 'fields' key (a list of names or {{name: file}})")
    return config


def _field_files(root: Path, config: dict[str, Any]) -> dict[str, Path]:
    fields = config["fields"]
    out: dict[str, Path] = {}
    if isinstance(fields, dict):
        for name, rel in fields.items():
            path = root / rel
            if not path.is_file():
                raise FileNotFoundError(2, f"file of field {name!r} not found", str(path))
            out[str(name)] = path
    elif isinstance(fields, list) and fields:
        for name in fields:
            candidates = [root / f"{name}.npy", root / f"{name}.pt"]
            found = [p for p in candidates if p.is_file()]
            if not found:
                tried = " or ".join(str(p) for p in candidates)
                raise FileNotFoundError(2, f"file of field {name!r} not found", tried)
            out[str(name)] = found[0]
    else:
        raise ValueError(f"{root / 'config.json'}: 'fields' must be a non-empty list or a dict")
    return out


def _load_field(path: Path) -> np.ndarray | torch.Tensor | str:
    if path.suffix == ".pt":
        value = torch.load(path, weights_only=True, map_location="cpu")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: holds a {type(value).__name__}, not one tensor")
        return value
    return str(path)  # ArrayDataset memory-maps .npy paths


def _index_file(root: Path, split: str, config: dict[str, Any]) -> Path:
    splits = config.get("splits") or {}
    if split in splits:
        path = root / str(splits[split])
        if not path.is_file():
            raise FileNotFoundError(2, f"index file of split {split!r} not found", str(path))
        return path
    candidates = [root / f"{split}_idx.npy", root / f"{split}_idx.pt"]
    for path in candidates:
        if path.is_file():
            return path
    available = sorted({p.name.rsplit("_idx.", 1)[0] for p in root.glob("*_idx.*")} | set(splits))
    raise FileNotFoundError(
        2,
        f"index file of split {split!r} not found (splits here: {available})",
        " or ".join(str(p) for p in candidates),
    )


def _load_index(path: Path, num_rows: int) -> np.ndarray:
    if path.suffix == ".pt":
        value = torch.load(path, weights_only=True, map_location="cpu")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: holds a {type(value).__name__}, not a tensor of indices")
        idx = value.numpy()
    else:
        idx = np.load(path)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise ValueError(f"{path}: indices must be a 1-D integer array, got {idx.dtype}{idx.shape}")
    idx = idx.astype(np.int64)
    bad = (idx < 0) | (idx >= num_rows)
    if bad.any():
        pos = int(np.argmax(bad))
        raise IndexError(
            f"{path}: index {int(idx[pos])} (position {pos}) is out of range for {num_rows} rows"
        )
    return idx


class _RowView(IndexedDataset):
    """Rows `rows[i]` of a chute dataset as a dataset of len(rows).

    Index batches are mapped with one vectorised take and go to the base
    dataset's engine, so the view costs no per-sample Python and no copy of
    the data.
    """

    def __init__(self, base: IndexedDataset, rows: np.ndarray) -> None:
        self.base = base
        self.rows = rows
        self._init_indexed(None)

    def __len__(self) -> int:
        return int(self.rows.size)

    def field_names(self) -> list[str]:
        return self.base.field_names()

    def _map(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        idx = self._as_indices(indices)
        n = len(self)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            i = int(idx[int(np.argmax(bad))])
            raise IndexError(f"index {i} is out of range for a dataset of length {n}")
        mapped: np.ndarray = self.rows[idx]
        return mapped

    def read_batch(self, idx: np.ndarray) -> Batch:
        return self.base.read_batch(self._map(idx))

    def iter_batches(
        self,
        index_batches: Iterable[Sequence[int]],
        num_threads: int,
        prefetch: int,
        timeout: float = 0,
        pin_memory: bool = False,
    ) -> Iterator[Batch]:
        mapped = (self._map(b) for b in index_batches)
        # ndarrays of row numbers: what iter_batches accepts, typed as index sequences.
        return self.base.iter_batches(
            cast(Iterator[Sequence[int]], mapped), num_threads, prefetch, timeout, pin_memory
        )

    def stats(self) -> dict[str, Any]:
        return self.base.stats()

    def __repr__(self) -> str:
        return f"_RowView({self.rows.size} rows of {self.base!r})"
