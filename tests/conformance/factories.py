"""One factory per data kind of the registry (``chute.kinds``), keyed by the
kind's name: what the conformance suite needs to run every invariant over
the kind. A kind may have variants (TokenDataset's two packings, mix per
sample and per batch); every registered kind must have one factory at
least (``test_every_kind_has_a_factory``).

A factory writes a small seeded data set with the real tools (webdataset's
``TarWriter``, h5py, pyarrow, numpy) in which every sample carries its id,
builds one rank's ``chute.DataLoader`` for a `Setting` (the rank and world
size come from ``RANK``/``WORLD_SIZE``, as the runner sets them), and
reads the ids back out of a batch. Its ``semantics`` says which documented
rule its epochs follow (docs/epochs.md):

- ``"map"``: a global order dealt to the ranks as ``DistributedSampler``
  deals it (padding to a multiple of the world size, or dropping the tail
  with ``drop_last``); ``global_order`` is that order, from the reference
  (torch's ``DistributedSampler`` for plain map-style datasets, the
  sampler's own single-rank draw for a mix or a curriculum).
- ``"stream"``: shards split by ``split_by_node``, counted per
  ``even_batches`` mode, or dealt exactly once with ``elastic=True``;
  ``shard_ids`` are each shard's ids in reading order.
- ``"batch-mix"``: whole batches taken from sources by a schedule, the epoch
  ending at the first source that runs out: no sample twice, the same batch
  count on every rank when its sources promise it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import chute
import chute.wds as wds
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.utils.data
import webdataset
from helpers import streaming_module

# Samples of every kind's data: prime, so that no world size or batch size
# of the suite divides it.
N = 37
# Shard (file, row group) counts the stream kinds are written in: some that
# divide the world sizes 1-4 and some that do not.
SHARD_COUNTS = (3, 4, 5, 8)
EVEN_MODES = ("off", "cap", "repeat")


@dataclass(frozen=True)
class Setting:
    """One loader's settings (every rank of a run shares them)."""

    world: int = 1
    threads: int = 0  # num_workers: native threads, or worker processes with `python`
    python: bool = False  # a Python stage (a map or a collate_fn): worker processes
    # A stream's Python stage maps its batches (after the engine's batching),
    # rather than its samples: what a mid-epoch state and elastic need.
    python_on_batches: bool = False
    batch: int = 4
    drop_last: bool = False
    shuffle: bool = True  # the sampler's shuffle, a stream's shard shuffle
    buffer: int = 0  # a stream's shuffle buffer (0: none)
    even: str = "off"  # a stream's even_batches
    elastic: bool = False  # a stream's elastic=True
    shards: int = 4
    seed: int = 0

    def replace(self, **changes: Any) -> Setting:
        return dataclasses.replace(self, **changes)


def python_stage(sample: Any) -> Any:
    """A Python stage that changes nothing (module level: worker processes
    import it); its presence makes the loader start worker processes."""
    return sample


def python_collate(rows: list[Any]) -> Any:
    """torch's default collation, as a user's collate_fn: a Python stage."""
    return torch.utils.data.default_collate(rows)


class Factory:
    """What the suite needs of one kind (module doc)."""

    kind: ClassVar[str]  # the registry's name
    variant: ClassVar[str] = ""
    semantics: ClassVar[str]
    shard_counts: ClassVar[tuple[int, ...]] = (1,)
    # Whether a mid-epoch state resumes on another world size.
    elastic_resume: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return f"{self.kind}[{self.variant}]" if self.variant else self.kind

    def write(self, root: Path, shards: int) -> Any:
        """The data set (N samples with ids 0..N-1) in `shards` files."""
        raise NotImplementedError

    def loader(self, data: Any, s: Setting) -> chute.DataLoader[Any]:
        raise NotImplementedError

    def ids(self, batch: Any) -> list[int]:
        raise NotImplementedError

    def adapt(self, s: Setting) -> Setting:
        """The setting as this kind reads it (what it cannot vary is fixed)."""
        return s

    # "map"
    def global_order(self, data: Any, s: Setting, epoch: int) -> list[int]:
        raise NotImplementedError

    # "stream"
    def shard_ids(self, data: Any) -> list[list[int]]:
        raise NotImplementedError

    # lifecycle (None where the kind has no such case)
    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        """Data (as `write` with the default shards) with the samples of the
        returned ids damaged, so that reading them fails; None for a kind
        whose files are checked whole when opened (no sample can fail later)."""
        return None

    def objects(self, data: Any) -> dict[str, bytes] | None:
        """The data as objects of a server (name: bytes), for a kind that
        reads remote urls; None for one that does not."""
        return None

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        """The loader over the served objects (`urls`, in the order of
        `objects`), with `timeout`; `scratch` for its indexes and caches."""
        raise NotImplementedError


FACTORIES: dict[str, list[Factory]] = {}


def register(factory: type[Factory]) -> type[Factory]:
    FACTORIES.setdefault(factory.kind, []).append(factory())
    return factory


def all_factories() -> list[Factory]:
    return [f for group in FACTORIES.values() for f in group]


def torch_order(n: int, s: Setting, epoch: int) -> list[int]:
    """DistributedSampler's order of `n` indices on one rank: the reference
    of every map-style kind."""
    sampler = torch.utils.data.DistributedSampler(
        range(n), num_replicas=1, rank=0, shuffle=s.shuffle, seed=s.seed
    )
    sampler.set_epoch(epoch)
    return list(sampler)


class MapFactory(Factory):
    """A map-style dataset under ``chute.DataLoader(distributed=True)``."""

    semantics = "map"

    def dataset(self, data: Any) -> Any:
        raise NotImplementedError

    def adapt(self, s: Setting) -> Setting:
        return s.replace(buffer=0, even="off", elastic=False, shards=min(s.shards, 4))

    def loader(self, data: Any, s: Setting) -> chute.DataLoader[Any]:
        return chute.DataLoader(
            self.dataset(data),
            batch_size=s.batch,
            shuffle=s.shuffle,
            drop_last=s.drop_last,
            num_workers=s.threads,
            collate_fn=python_collate if s.python else None,
            distributed=True,
            seed=s.seed,
        )

    def global_order(self, data: Any, s: Setting, epoch: int) -> list[int]:
        return torch_order(N, s, epoch)


def _split(n: int, parts: int) -> list[range]:
    """0..n-1 in `parts` consecutive runs of near-equal length."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def damage_row_group(path: str, group: int) -> set[int]:
    """Overwrites the pages of row group `group` of the Parquet file with
    garbage; returns the ids of its rows (its one int64 column's)."""
    meta = pq.ParquetFile(path).metadata
    ids = pq.read_table(path).column(0).to_pylist()
    start = sum(meta.row_group(g).num_rows for g in range(group))
    chunk = meta.row_group(group).column(0)
    offset = chunk.dictionary_page_offset or chunk.data_page_offset
    with open(path, "r+b") as out:
        out.seek(offset)
        out.write(bytes(range(1, 1 + chunk.total_compressed_size)))
    return set(ids[start : start + meta.row_group(group).num_rows])


def write_tar_shards(
    root: Path, shards: int, n: int = N, start: int = 0, bad: frozenset[int] = frozenset()
) -> list[str]:
    """Shards of samples ``{cls: id, npy: row}`` written by webdataset; the
    samples of `bad` get a ``.npy`` member that is no npy."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(shards)
    urls = []
    for k, part in enumerate(_split(n, shards)):
        path = root / f"shard-{k:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i in part:
                row: Any = rng.standard_normal(3).astype(np.float32)
                if start + i in bad:
                    row = b"not an npy member"
                sink.write({"__key__": f"s{start + i:06d}", "cls": start + i, "npy": row})
        urls.append(str(path))
    return urls


BAD_SAMPLE = 13  # the sample a damaged data set cannot give


@register
class TarDatasetFactory(MapFactory):
    kind = "TarDataset"
    shard_counts = (1, 3, 4)

    def write(self, root: Path, shards: int) -> Any:
        return write_tar_shards(root, shards)

    def dataset(self, data: Any) -> Any:
        return chute.TarDataset(data, decode="", fields={"id": "cls", "row": "npy"})

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]

    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        return write_tar_shards(root, 3, bad=frozenset({BAD_SAMPLE})), {BAD_SAMPLE}

    def objects(self, data: Any) -> dict[str, bytes] | None:
        return {Path(p).name: Path(p).read_bytes() for p in data}

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        ds = chute.TarDataset(urls, decode="", fields={"id": "cls"}, index=scratch)
        return chute.DataLoader(ds, batch_size=s.batch, num_workers=s.threads, timeout=timeout)


class IdFilesFactory(MapFactory):
    """Files of an `id` column in blocks of 5 rows (Parquet row groups,
    Arrow record batches), read by `dataset_class` locally and remotely;
    `damage(path, block)` spoils one block and returns its ids."""

    shard_counts = (1, 3)

    def dataset_class(self) -> Any:
        raise NotImplementedError

    def damage(self, path: str, block: int) -> set[int]:
        raise NotImplementedError

    def dataset(self, data: Any) -> Any:
        return self.dataset_class()(data, ["id"])

    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        (path,) = self.write(root, 1)
        return [path], self.damage(path, 2)

    def objects(self, data: Any) -> dict[str, bytes] | None:
        return {Path(p).name: Path(p).read_bytes() for p in data}

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        return chute.DataLoader(
            self.dataset_class()(urls, ["id"]),
            batch_size=s.batch,
            num_workers=s.threads,
            timeout=timeout,
        )

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]


@register
class ParquetDatasetFactory(IdFilesFactory):
    kind = "ParquetDataset"

    def write(self, root: Path, shards: int) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        paths = []
        for k, part in enumerate(_split(N, shards)):
            table = pa.table({"id": pa.array(list(part), pa.int64())})
            path = root / f"part-{k}.parquet"
            pq.write_table(table, path, row_group_size=5)  # several row groups a file
            paths.append(str(path))
        return paths

    def dataset_class(self) -> Any:
        return chute.ParquetDataset

    def damage(self, path: str, block: int) -> set[int]:
        return damage_row_group(path, block)


def write_arrow_files(root: Path, shards: int) -> list[str]:
    """Arrow IPC stream files (what ``save_to_disk`` writes) of ids, record
    batches of 5 rows, their buffers zstd-compressed (so that a damaged
    body fails when its batch is read, not when the file is opened)."""
    root.mkdir(parents=True, exist_ok=True)
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    paths = []
    for k, part in enumerate(_split(N, shards)):
        table = pa.table({"id": pa.array(list(part), pa.int64())})
        path = root / f"data-{k:05d}-of-{shards:05d}.arrow"
        with pa.ipc.new_stream(path, table.schema, options=options) as writer:
            for batch in table.to_batches(max_chunksize=5):
                writer.write_batch(batch)
        paths.append(str(path))
    return paths


def damage_record_batch(path: str, batch: int) -> set[int]:
    """Overwrites the end of record batch `batch`'s compressed body in the
    Arrow IPC stream file with garbage; returns the ids of its rows."""
    with pa.OSFile(path) as source:
        messages = pa.ipc.MessageReader.open_stream(source)
        ends = []
        for _ in range(batch + 2):  # the schema message, then the batches
            messages.read_next_message()
            ends.append(source.tell())
    with pa.memory_map(path) as source:
        rows = list(pa.ipc.open_stream(source))[batch].column(0).to_pylist()
    with open(path, "r+b") as out:
        out.seek(ends[batch + 1] - 16)
        out.write(bytes(range(1, 17)))
    return set(rows)


@register
class ArrowDatasetFactory(IdFilesFactory):
    kind = "ArrowDataset"

    def write(self, root: Path, shards: int) -> Any:
        return write_arrow_files(root, shards)

    def dataset_class(self) -> Any:
        return chute.ArrowDataset

    def damage(self, path: str, block: int) -> set[int]:
        return damage_record_batch(path, block)


def write_mds(directory: Path, ids: range, compression: str | None = None) -> str:
    """An MDS directory of `ids` (an ``int`` column and a ``bytes`` one),
    written by streaming's own ``MDSWriter``, several shards."""
    writer = streaming_module("streaming.base.format.mds.writer").MDSWriter
    columns = {"id": "int", "blob": "bytes"}
    with writer(
        out=str(directory), columns=columns, size_limit=600, compression=compression
    ) as sink:
        for i in ids:
            sink.write({"id": i, "blob": bytes([i % 251]) * 40})
    return str(directory)


@register
class MDSDatasetFactory(MapFactory):
    kind = "MDSDataset"
    shard_counts = (1, 3)

    def write(self, root: Path, shards: int) -> Any:
        # `shards` directories, each of several MDS shards of its own.
        root.mkdir(parents=True, exist_ok=True)
        return [
            write_mds(root / f"part-{k}", part, compression="zstd" if k % 2 else None)
            for k, part in enumerate(_split(N, shards))
        ]

    def dataset(self, data: Any) -> Any:
        return chute.MDSDataset(data, ["id"])

    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        directory = write_mds(root / "d", range(N), compression="zstd")
        index = json.loads((Path(directory) / "index.json").read_text())
        start = sum(s["samples"] for s in index["shards"][:1])
        damaged = index["shards"][1]
        shard = Path(directory) / damaged["zip_data"]["basename"]
        # The same length, so that only decompressing it fails.
        shard.write_bytes(bytes((b + 1) % 256 for b in shard.read_bytes()))
        return [directory], set(range(start, start + damaged["samples"]))

    def objects(self, data: Any) -> dict[str, bytes] | None:
        return {
            f"{Path(d).name}/{f.name}": f.read_bytes()
            for d in data
            for f in sorted(Path(d).iterdir())
        }

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        dirs = sorted({u.rsplit("/", 1)[0] for u in urls})
        return chute.DataLoader(
            chute.MDSDataset(dirs, ["id"]),
            batch_size=s.batch,
            num_workers=s.threads,
            timeout=timeout,
        )

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]


@register
class H5DatasetFactory(MapFactory):
    kind = "H5Dataset"
    shard_counts = (1, 3)

    def write(self, root: Path, shards: int) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        paths = []
        for k, part in enumerate(_split(N, shards)):
            path = root / f"rows-{k}.h5"
            with h5py.File(path, "w") as f:
                f.create_dataset("id", data=np.array(part, dtype=np.int64), chunks=(4,))
                x = np.arange(len(part) * 2, dtype=np.float32).reshape(-1, 2)
                f.create_dataset("x", data=x, compression="gzip", chunks=(4, 2))
            paths.append(str(path))
        return paths

    def dataset(self, data: Any) -> Any:
        return chute.H5Dataset(data, ["id", "x"])

    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        (path,) = self.write(root, 1)
        with h5py.File(path, "r") as f:
            rows = f["x"].chunks[0]
            info = f["x"].id.get_chunk_info_by_coord((BAD_SAMPLE // rows * rows, 0))
        with open(path, "r+b") as out:  # the gzip stream of one chunk, garbled
            out.seek(info.byte_offset)
            out.write(bytes(range(7, 7 + info.size)))
        first = BAD_SAMPLE // rows * rows
        return [path], set(range(first, min(N, first + rows)))

    def objects(self, data: Any) -> dict[str, bytes] | None:
        return {Path(p).name: Path(p).read_bytes() for p in data}

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        return chute.DataLoader(
            chute.H5Dataset(urls, ["id", "x"]),
            batch_size=s.batch,
            num_workers=s.threads,
            timeout=timeout,
        )

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]


@register
class ArrayDatasetFactory(MapFactory):
    kind = "ArrayDataset"

    def write(self, root: Path, shards: int) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        ids = root / "ids.npy"
        np.save(ids, np.arange(N, dtype=np.int64))
        return {"id": str(ids), "x": torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)}

    def dataset(self, data: Any) -> Any:
        return chute.ArrayDataset(**data)

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]


SEQ_LEN = 6


class TokenFactory(MapFactory):
    """Token files in which each packed sequence's first token names it:
    `write` maps those tokens to the sequence ids 0..N-1."""

    kind = "TokenDataset"
    shard_counts = (1, 3)

    def token_ids(self, data: Any) -> dict[int, int]:
        ds = self.dataset(data)
        assert len(ds) == N, (self.variant, len(ds))
        return {int(ds[i]["input_ids"][0]): i for i in range(N)}

    def ids(self, batch: Any) -> list[int]:
        return [self._ids[int(t)] for t in batch["input_ids"][:, 0]]

    def prepared(self, data: Any) -> Any:
        self._ids = self.token_ids(data)
        return data


@register
class TokenWindowsFactory(TokenFactory):
    """nanoGPT's windows: the files as one stream cut in windows."""

    variant = "windows"

    def write(self, root: Path, shards: int) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        # N windows of SEQ_LEN + 1 tokens, each starting where the last one's
        # labels end (its last token), spread over the files.
        total = N * SEQ_LEN + 1
        tokens = np.arange(total, dtype=np.uint16)
        paths = []
        for k, part in enumerate(_split(total, shards)):
            path = root / f"tokens-{k}.bin"
            tokens[part.start : part.stop].tofile(path)
            paths.append(str(path))
        return self.prepared(paths)

    def dataset(self, data: Any) -> Any:
        return chute.TokenDataset(data, SEQ_LEN, dtype="uint16", pack="windows")


@register
class TokenDocumentsFactory(TokenFactory):
    """Whole documents packed into sequences, ended by an end token."""

    variant = "documents"
    EOD = 0

    def write(self, root: Path, shards: int) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        # One document per sequence (longer than half of one, so no two
        # share a sequence), its first token unique: the sequence's name.
        rng = np.random.default_rng(7)
        docs = []
        for i in range(N):
            length = int(rng.integers(SEQ_LEN // 2 + 1, SEQ_LEN + 1))
            docs.append([1000 + i, *rng.integers(1, 900, length - 2).tolist(), self.EOD])
        paths = []
        for k, part in enumerate(_split(N, shards)):
            path = root / f"docs-{k}.npy"
            np.save(path, np.array([t for i in part for t in docs[i]], dtype=np.uint16))
            paths.append(str(path))
        return self.prepared(paths)

    def dataset(self, data: Any) -> Any:
        return chute.TokenDataset(data, SEQ_LEN, pack="documents", eod_id=self.EOD)


@register
class SampleMixFactory(MapFactory):
    """``chute.mix`` of two map-style datasets, per sample, with exact ratios."""

    kind = "mix"
    variant = "sample"
    WEIGHTS = (0.7, 0.3)

    def write(self, root: Path, shards: int) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        path = root / "b.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("id", data=np.arange(100, 100 + N, dtype=np.int64), chunks=(4,))
        return {"a": np.arange(N, dtype=np.int64), "b": str(path)}

    def mixed(self, data: Any, s: Setting) -> Any:
        a = chute.ArrayDataset(id=data["a"])
        b = chute.H5Dataset(data["b"], ["id"])
        return chute.mix([a, b], weights=list(self.WEIGHTS), seed=s.seed, shuffle=s.shuffle)

    def loader(self, data: Any, s: Setting) -> chute.DataLoader[Any]:
        return chute.DataLoader(
            self.mixed(data, s),
            batch_size=s.batch,
            drop_last=s.drop_last,
            num_workers=s.threads,
            collate_fn=python_collate if s.python else None,
            distributed=True,
        )

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]

    def global_order(self, data: Any, s: Setting, epoch: int) -> list[int]:
        mixed = self.mixed(data, s)
        ids = np.concatenate([data["a"], np.arange(100, 100 + N)])
        order = [int(ids[i]) for i in mixed.global_order(epoch)]
        # The reference's own check: the documented counts of each source.
        counts = list(mixed.counts(epoch).values())
        assert [sum(1 for i in order if (i >= 100) == bool(k)) for k in range(2)] == counts
        return order


@register
class CurriculumFactory(MapFactory):
    """A ``Curriculum`` sampler over an ArrayDataset's two groups."""

    kind = "Curriculum"
    SCHEDULE = ({"easy": 0.75, "hard": 0.25}, {"easy": 0.5, "hard": 0.5})

    def write(self, root: Path, shards: int) -> Any:
        return np.arange(N, dtype=np.int64)

    def curriculum(
        self, s: Setting, world: int | None = None, rank: int | None = None
    ) -> chute.Curriculum:
        groups = {"easy": np.arange(0, 20), "hard": np.arange(20, N)}
        return chute.Curriculum(
            groups,
            list(self.SCHEDULE),
            num_samples=24,
            replacement=False,
            seed=s.seed,
            num_replicas=world,
            rank=rank,
            drop_last=s.drop_last,
        )

    def loader(self, data: Any, s: Setting) -> chute.DataLoader[Any]:
        # The rank and world size from RANK/WORLD_SIZE, as the runner sets them.
        return chute.DataLoader(
            chute.ArrayDataset(id=data),
            batch_size=s.batch,
            drop_last=s.drop_last,
            num_workers=s.threads,
            collate_fn=python_collate if s.python else None,
            sampler=self.curriculum(s),
        )

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch["id"]]

    def global_order(self, data: Any, s: Setting, epoch: int) -> list[int]:
        one = self.curriculum(s.replace(drop_last=False), 1, 0)
        one.set_epoch(epoch)
        return list(one)


class StreamFactory(Factory):
    """A stream split across ranks by shards."""

    semantics = "stream"
    shard_counts = SHARD_COUNTS

    def adapt(self, s: Setting) -> Setting:
        if s.elastic:  # elastic streams ignore even_batches and need one pass
            s = s.replace(even="off")
        if s.even != "off":
            # Which shards a rank reads must be known to count its samples:
            # the split of the shards in their order.
            s = s.replace(shuffle=False)
        return s

    def pipeline(self, ds: Any, s: Setting, fields: tuple[str, ...], decode: bool) -> Any:
        """`ds` shuffled (`s.buffer`), decoded, as tuples of `fields` (the
        id first), with the Python stage, batched."""
        if s.buffer:
            ds = ds.shuffle(s.buffer)
        if decode:
            ds = ds.decode()
        ds = ds.to_tuple(*fields)
        on_batches = s.python_on_batches or s.elastic
        if s.python and not on_batches:
            ds = ds.map(python_stage)
        ds = ds.batched(s.batch, partial=not s.drop_last)
        return ds.map(python_stage) if s.python and on_batches else ds

    def loader(self, data: Any, s: Setting) -> chute.DataLoader[Any]:
        return chute.DataLoader(self.stream(data, s), batch_size=None, num_workers=s.threads)

    def stream(self, data: Any, s: Setting) -> Any:
        raise NotImplementedError

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch[0]]


@register
class WebDatasetFactory(StreamFactory):
    kind = "WebDataset"

    def write(self, root: Path, shards: int) -> Any:
        return write_tar_shards(root, shards)

    def stream(self, data: Any, s: Setting) -> Any:
        ds = wds.WebDataset(
            data,
            shardshuffle=100 if s.shuffle else False,
            seed=s.seed,
            nodesplitter=wds.split_by_node,
            # A rank left without a shard (more ranks than shards) reads none.
            empty_check=False,
            even_batches=s.even,
            elastic=s.elastic,
        )
        return self.pipeline(ds, s, ("cls", "npy"), decode=True)

    def shard_ids(self, data: Any) -> list[list[int]]:
        return [list(part) for part in _split(N, len(data))]

    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        return write_tar_shards(root, 3, bad=frozenset({BAD_SAMPLE})), {BAD_SAMPLE}

    def objects(self, data: Any) -> dict[str, bytes] | None:
        return {Path(p).name: Path(p).read_bytes() for p in data}

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        return chute.DataLoader(
            self.stream(urls, s), batch_size=None, num_workers=s.threads, timeout=timeout
        )


@register
class ParquetStreamFactory(StreamFactory):
    kind = "ParquetStream"

    def write(self, root: Path, shards: int) -> Any:
        # One file of `shards` row groups: the stream's shards.
        root.mkdir(parents=True, exist_ok=True)
        parts = _split(N, shards)
        path = root / "rows.parquet"
        schema = pa.schema([("cls", pa.int64())])
        with pq.ParquetWriter(path, schema) as writer:
            for part in parts:
                writer.write_table(pa.table({"cls": pa.array(list(part), pa.int64())}))
        return {"path": str(path), "parts": [list(p) for p in parts]}

    def stream(self, data: Any, s: Setting) -> Any:
        ds = wds.ParquetStream(
            data["path"],
            ["cls"],
            shardshuffle=100 if s.shuffle else False,
            seed=s.seed,
            empty_check=False,
            even_batches=s.even,
            elastic=s.elastic,
        )
        return self.pipeline(ds, s, ("cls",), decode=False)

    def shard_ids(self, data: Any) -> list[list[int]]:
        return [list(p) for p in data["parts"]]

    def corrupt(self, root: Path) -> tuple[Any, set[int]] | None:
        data = self.write(root, 4)
        return data, damage_row_group(data["path"], 1)

    def objects(self, data: Any) -> dict[str, bytes] | None:
        return {"rows.parquet": Path(data["path"]).read_bytes()}

    def remote_loader(
        self, urls: list[str], s: Setting, timeout: float, scratch: Path
    ) -> chute.DataLoader[Any]:
        stream = self.stream({"path": urls[0]}, s)
        return chute.DataLoader(stream, batch_size=None, num_workers=s.threads, timeout=timeout)


@register
class BatchMixFactory(Factory):
    """``chute.mix`` of two elastic streams, per batch."""

    kind = "mix"
    variant = "batch"
    semantics = "batch-mix"
    WEIGHTS = (0.6, 0.4)

    def adapt(self, s: Setting) -> Setting:
        return s.replace(elastic=True, even="off", shards=4)

    def write(self, root: Path, shards: int) -> Any:
        return {
            "a": write_tar_shards(root / "a", shards),
            "b": write_tar_shards(root / "b", shards, start=100),
        }

    def loader(self, data: Any, s: Setting) -> chute.DataLoader[Any]:
        sources = [
            WebDatasetFactory().stream(data[name], s.replace(seed=s.seed + k))
            for k, name in enumerate(("a", "b"))
        ]
        mixed = chute.mix(sources, weights=list(self.WEIGHTS))
        return chute.DataLoader(mixed, batch_size=None, num_workers=s.threads)

    def ids(self, batch: Any) -> list[int]:
        return [int(i) for i in batch[0]]


def kinds_without_a_factory(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - set(FACTORIES))


Loader = Callable[[], chute.DataLoader[Any]]
