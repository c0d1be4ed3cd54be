"""What chute's loaders give the frameworks, checked without them: a
sampler ``set_epoch`` that reaches the order (Lightning calls nothing
else), a state taken between epochs giving way to the epoch told next, the
warnings for a loader without partition under several ranks and for a
chute dataset read by a foreign loader, and accelerate's
``_is_accelerate_prepared``."""

from __future__ import annotations

import warnings

import chute
import chute.loader.frameworks as frameworks
import chute.wds as wds
import numpy as np
import pytest
import torch
from chute import ForeignLoaderWarning, SameDataOnEveryRankWarning
from chute.loader.index_batches import array_index_batches
from torch.utils.data import RandomSampler


def arrays(n: int = 50) -> chute.ArrayDataset:
    return chute.ArrayDataset(id=np.arange(n, dtype=np.int64))


def map_loader(ds=None) -> chute.DataLoader:
    generator = torch.Generator().manual_seed(5)
    return chute.DataLoader(ds or arrays(), batch_size=8, shuffle=True, generator=generator)


def stream_loader(data, **options) -> chute.DataLoader:
    urls = [str(data / f"shard-{i:06d}.tar") for i in range(10)]
    ds = (
        chute.WebDataset(urls, shardshuffle=True, seed=1, even_batches="off", **options)
        .shuffle(20)
        .to_tuple("id.cls")
        .batched(50)
    )
    return chute.DataLoader(ds, batch_size=None)


def epochs_of(loader, epochs, tell=None) -> list[list[int]]:
    """The ids of each epoch; `tell(loader, e)` before epoch e."""
    out = []
    for epoch in epochs:
        if tell is not None:
            tell(loader, epoch)
        out.append([int(i) for b in loader for i in (b["id"] if isinstance(b, dict) else b[0])])
    return out


def lightning_tells(loader, epoch) -> None:
    """What Lightning's _set_sampler_epoch reaches: the sampler only."""
    loader.sampler.set_epoch(epoch)


def test_shuffle_with_a_generator_keeps_torchs_order():
    ds = arrays()
    reference = torch.utils.data.DataLoader(
        ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5)
    )
    loader = map_loader(ds)
    assert isinstance(loader.sampler, RandomSampler)
    for _ in range(3):
        assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in reference]


def test_a_fresh_map_loader_told_epoch_e_by_its_sampler_gives_epoch_e():
    uninterrupted = epochs_of(map_loader(), range(4), lightning_tells)
    assert uninterrupted == epochs_of(map_loader(), range(4))  # telling changes nothing
    assert epochs_of(map_loader(), [2, 3], lightning_tells) == uninterrupted[2:]
    assert epochs_of(map_loader(), [3, 1], lightning_tells) == [uninterrupted[3], uninterrupted[1]]


def test_a_fresh_stream_loader_told_epoch_e_by_its_sampler_gives_epoch_e(framework_data):
    uninterrupted = epochs_of(stream_loader(framework_data), range(3), lightning_tells)
    assert epochs_of(stream_loader(framework_data), [2], lightning_tells) == uninterrupted[2:]
    loader = stream_loader(framework_data)
    assert loader.batch_sampler is None or loader.batch_sampler.sampler is loader.sampler


@pytest.mark.parametrize("kind", ["map", "distributed", "stream"])
def test_a_state_between_epochs_gives_way_to_the_epoch_told(kind, framework_data):
    def make():
        if kind == "distributed":  # one rank: DistributedSampler's order by (seed, epoch)
            return chute.DataLoader(arrays(), batch_size=8, distributed=True, seed=3)
        return map_loader() if kind == "map" else stream_loader(framework_data)

    uninterrupted = epochs_of(make(), range(2), chute.set_epoch)
    first = make()
    epochs_of(first, [0], chute.set_epoch)
    resumed = make()
    resumed.load_state_dict(first.state_dict())  # after epoch 0 ran out
    assert epochs_of(resumed, [1], chute.set_epoch) == uninterrupted[1:]


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_state_mid_epoch_refuses_another_epoch_told(kind, framework_data):
    loader = map_loader() if kind == "map" else stream_loader(framework_data)
    loader.set_epoch(0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    fresh = map_loader() if kind == "map" else stream_loader(framework_data)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    with pytest.raises(ValueError, match=r"into epoch 0, but set_epoch\(1\)"):
        next(iter(fresh))


@pytest.fixture
def two_ranks(monkeypatch):
    """A process group of 2 as chute's checks see it (this is rank 0)."""
    monkeypatch.setattr(frameworks, "process_group_size", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")


def caught(fn) -> list[type]:
    with warnings.catch_warnings(record=True) as found:
        warnings.simplefilter("always")
        fn()
    return [w.category for w in found if w.category.__module__.startswith("chute")]


def test_a_loader_without_partition_warns_once_under_several_ranks(two_ranks, framework_data):
    loader = chute.DataLoader(arrays(), batch_size=10)
    assert caught(lambda: [list(loader) for _ in range(2)]) == [SameDataOnEveryRankWarning]
    unsplit = stream_loader(framework_data, nodesplitter=None)
    assert caught(lambda: list(unsplit)) == [SameDataOnEveryRankWarning]
    split = stream_loader(framework_data, nodesplitter=wds.split_by_node)
    distributed = chute.DataLoader(arrays(), batch_size=10, distributed=True)
    assert caught(lambda: (list(split), list(distributed))) == []


def test_no_warning_in_one_process():
    assert caught(lambda: list(chute.DataLoader(arrays(), batch_size=10))) == []


def test_a_chute_dataset_read_by_a_foreign_loader_under_several_ranks_warns(
    two_ranks, framework_data
):
    torch_loader = torch.utils.data.DataLoader(arrays(), batch_size=10)
    assert caught(lambda: (list(torch_loader), list(torch_loader))) == [ForeignLoaderWarning]
    stream = stream_loader(framework_data, nodesplitter=None)
    assert caught(lambda: next(iter(stream.dataset))) == [ForeignLoaderWarning]
    # A stream iterated directly, no chute loader over it: webdataset's way.
    alone = stream_loader(framework_data, nodesplitter=wds.split_by_node).dataset
    assert caught(lambda: next(iter(alone))) == []


def test_a_chute_dataset_read_by_torchs_loader_in_one_process_is_fine():
    ds = arrays()
    chute_loader = chute.DataLoader(ds, batch_size=10)
    torch_loader = torch.utils.data.DataLoader(ds, batch_size=10)
    assert caught(lambda: (list(chute_loader), list(torch_loader))) == []


def test_a_foreign_loader_over_a_partitioned_chute_loader_raises(two_ranks):
    ds = arrays()
    chute_loader = chute.DataLoader(ds, batch_size=10, distributed=True)
    # accelerate's skip_first_batches rebuilds it so.
    rebuilt = torch.utils.data.DataLoader(ds, batch_sampler=chute_loader.batch_sampler)
    with pytest.raises(ValueError, match="a part of a part"):
        next(iter(rebuilt))


def test_a_foreign_loader_over_a_partitioned_parquet_loader_raises(two_ranks, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(50, dtype=np.int64)}), path, row_group_size=10)
    ds = chute.ParquetDataset(path)
    chute_loader = chute.DataLoader(ds, batch_size=10, distributed=True)
    rebuilt = torch.utils.data.DataLoader(
        ds, batch_sampler=chute_loader.batch_sampler, collate_fn=list
    )
    with pytest.raises(ValueError, match="a part of a part"):
        next(iter(rebuilt))


def test_a_foreign_loader_over_a_partitioned_mix_raises(two_ranks, framework_data):
    def split():
        return stream_loader(framework_data, nodesplitter=wds.split_by_node).dataset

    mix = chute.MixedStream({"a": split(), "b": split()}, weights={"a": 1, "b": 1})
    chute_loader = chute.DataLoader(mix, batch_size=None)
    assert caught(lambda: next(iter(chute_loader))) == []
    rebuilt = torch.utils.data.DataLoader(mix, batch_size=None)
    with pytest.raises(ValueError, match="MixedStream is read through __iter__.*a part of a part"):
        next(iter(rebuilt))


def test_accelerate_keeps_a_loader_that_partitions_itself(two_ranks, framework_data):
    assert chute.DataLoader(arrays(), batch_size=10, distributed=True)._is_accelerate_prepared
    split = stream_loader(framework_data, nodesplitter=wds.split_by_node)
    assert split._is_accelerate_prepared
    plain = chute.DataLoader(arrays(), batch_size=10)
    with pytest.warns(ForeignLoaderWarning, match="accelerate rebuilds"):
        assert not plain._is_accelerate_prepared
    not_chute = chute.DataLoader(list(range(10)), batch_size=10)
    assert caught(lambda: not_chute._is_accelerate_prepared) == []
    assert not not_chute._is_accelerate_prepared
    plain._is_accelerate_prepared = True  # accelerate marks what it prepared
    assert plain._is_accelerate_prepared


def test_accelerate_keeps_any_chute_loader_in_one_process():
    assert chute.DataLoader(arrays(), batch_size=10)._is_accelerate_prepared


def test_the_epoch_sampler_keeps_the_array_fast_path():
    # chute cuts RandomSampler's index batches from one array per pass.
    assert array_index_batches(map_loader()._index_sampler) is not None


def test_looking_for_lightning_keeps_no_caller_alive(monkeypatch) -> None:
    """With Lightning imported, each iterator looks for its fetcher up the
    stack; the frames it passes (the caller's, holding the dataset) must
    keep nothing once the caller drops it, even with the collector off."""
    import gc
    import sys
    import types
    import weakref

    monkeypatch.setitem(sys.modules, "lightning.pytorch", types.ModuleType("lightning.pytorch"))
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ds = arrays()
        gone = weakref.ref(ds)
        loader = chute.DataLoader(ds, batch_size=8)
        next(iter(loader))
        del loader, ds
        assert gone() is None, "the dataset outlived its last reference"
    finally:
        if was_enabled:
            gc.enable()
