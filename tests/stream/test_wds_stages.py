"""Stage kinds as classes (chute.stream.stages): a stage added as one class
runs in Python where its class says (in the loader or on worker processes),
counts and resumes as its class says, and takes part in a pipeline like the
stages chute ships; a kind names one class; every shipped kind is built
under webdataset's name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, ClassVar

import chute
import pytest
import webdataset
from chute import wds
from chute.sources.tarindex import write_index
from chute.stream.fluent import Fluent
from chute.stream.stages import STAGE_CLASSES, PythonRun, Stage
from conftest import tiny_samples, write_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """90 samples in 3 shards, with their sidecar indexes."""
    paths = write_shards(tmp_path_factory.mktemp("stages"), tiny_samples(90, seed=3), 30)
    for path in paths:
        write_index(path)
    return paths


class TaggedLabels(Stage):
    """A stage a user adds: each (array, label) tuple becomes (label * 10,
    the pid of the process that ran it), one item per item."""

    kind: ClassVar[str] = "test_tagged_labels"
    itemwise: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        for item in items:
            run.count(1)
            yield item[1] * 10, os.getpid()


class HeldTaggedLabels(TaggedLabels):
    """The same stage, declared to keep state across items: it stays in the
    loader's process, and a mid-epoch state refuses it."""

    kind: ClassVar[str] = "test_held_tagged_labels"
    itemwise: ClassVar[bool] = False
    keeps_state: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = False


def labels(shards: list[str]) -> list[int]:
    ds = chute.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    return [int(cls) * 10 for _, cls in ds]


def test_a_new_stage_class_runs_in_python_after_the_native_prefix(shards: list[str]) -> None:
    ds = chute.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    staged = ds.compose(TaggedLabels())
    got = list(staged)
    assert [label for label, _ in got] == labels(shards)
    assert {pid for _, pid in got} == {os.getpid()}
    assert staged.stats()["python_items"] == 90
    # Called on an iterator, as webdataset's filters are.
    assert list(TaggedLabels()(iter([("a", 1), ("b", 2)]))) == [
        (10, os.getpid()),
        (20, os.getpid()),
    ]


@pytest.mark.parametrize(
    ("stage", "on_workers"), [(TaggedLabels(), True), (HeldTaggedLabels(), False)]
)
def test_worker_processes_run_a_new_stage_when_its_class_says_itemwise(
    shards: list[str], stage: Stage, on_workers: bool
) -> None:
    ds = chute.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    loader = chute.DataLoader(ds.compose(stage), batch_size=None, num_workers=2)
    got = list(loader)
    assert [int(label) for label, _ in got] == labels(shards)
    pids = {int(pid) for _, pid in got}
    if on_workers:
        assert os.getpid() not in pids and len(pids) == 2
    else:
        assert pids == {os.getpid()}


def test_with_length_counts_through_a_new_stage_as_its_class_says(shards: list[str]) -> None:
    ds = chute.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    assert len(ds.compose(TaggedLabels()).batched(4).with_length()) == 23
    with pytest.raises(ValueError, match=r"after \.test_held_tagged_labels\(\) cannot be counted"):
        ds.compose(HeldTaggedLabels()).with_length()


def test_a_new_stage_resumes_as_its_class_says(shards: list[str]) -> None:
    ds = chute.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "cls")
    staged = ds.compose(TaggedLabels())
    it = iter(staged)
    first = [next(it) for _ in range(40)]
    state = staged.state_dict()
    assert "test_tagged_labels" in state["pipeline"]["stages"]
    resumed = ds.compose(TaggedLabels())
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [label for label, _ in first + rest] == labels(shards)
    # A state from the pipeline without the stage is another pipeline's.
    with pytest.raises(ValueError, match="from another pipeline"):
        ds.load_state_dict(state)

    held = ds.compose(HeldTaggedLabels())
    it = iter(held)
    next(it)
    with pytest.raises(ValueError, match=r"stages \['test_held_tagged_labels'\] run in Python"):
        held.state_dict()


def test_a_kind_names_one_class() -> None:
    with pytest.raises(TypeError, match="stage kind 'map' is taken by Map"):

        class AnotherMap(Stage):
            kind: ClassVar[str] = "map"

            def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
                return items

    assert STAGE_CLASSES["map"] is type(wds.map(str))

    def define() -> type[Stage]:
        class Redefined(TaggedLabels):
            kind: ClassVar[str] = "test_redefined"

        return Redefined

    # The same class defined again (a notebook cell run twice) takes over.
    first, second = define(), define()
    assert first is not second and STAGE_CLASSES["test_redefined"] is second


def test_every_shipped_kind_is_built_under_webdatasets_name() -> None:
    shipped = {k: c for k, c in STAGE_CLASSES.items() if c.__module__.startswith("chute.")}
    for kind in shipped:
        # compose is a method only (DataPipeline's); the rest are filters too.
        assert kind == "compose" or kind in wds.__all__, kind
        if hasattr(webdataset.compat.FluidInterface, kind):
            assert callable(getattr(Fluent, kind)), kind
    built = {
        "associate": wds.associate({}),
        "batched": wds.batched(4),
        "compose": _Chain().compose(list).stages[0],
        "decode": wds.decode(),
        "extract_keys": wds.extract_keys("npy"),
        "info": wds.info(),
        "log_keys": wds.log_keys(),
        "map": wds.map(str),
        "map_dict": wds.map_dict(npy=str),
        "map_tuple": wds.map_tuple(str),
        "rename": wds.rename(a="npy"),
        "rename_keys": wds.rename_keys(a="*.npy"),
        "rsample": wds.rsample(),
        "select": wds.select(bool),
        "shuffle": wds.shuffle(10),
        "slice": wds.slice(3),
        "to_tuple": wds.to_tuple("npy"),
        "unbatched": wds.unbatched(),
        "unlisted": wds.unlisted(),
        "xdecode": wds.xdecode(),
    }
    # Each kind chute ships, built under its name, is of its registered class.
    assert {kind: type(stage) for kind, stage in built.items()} == shipped


class _Chain(Fluent):
    def __init__(self) -> None:
        self.stages = []
