"""The parts of chute's worker processes that need no process: the shared
memory transport (arrays packed into one memfd arena, rebuilt exactly),
collation as a view, the socket protocol with descriptors, failures and
warnings carried across, the one-thread rule, and the engine's share of a
plan (deliver_stride) that makes every worker's batches the plan's."""

from __future__ import annotations

import collections
import gc
import os
import pickle
import socket
import threading
import warnings
import weakref
from typing import Any

import chute
import numpy as np
import pytest
import torch
from chute import _core
from chute.common.errors import MemberDecodeError
from chute.common.intraop import one_intraop_thread, single_threaded
from chute.common.torch_collate import collate_tensors, torch_collate
from chute.stream.compiler import compile_stages, error_handlers
from chute.stream.native import EngineSettings
from chute.workers.failures import Failure, caught_warnings
from chute.workers.transport import (
    ArenaMappings,
    ArenaPool,
    Channel,
    Packed,
    pack,
)
from conftest import assert_same_typed

Point = collections.namedtuple("Point", ["x", "label"])


def unpack(packed: Packed, fd: int, on_release: Any = None) -> list[Any]:
    """`packed` unpacked by a loader that has not seen its arena yet."""
    mappings = ArenaMappings(on_release)
    mappings.admit(packed, [fd] if fd >= 0 else [])
    return mappings.unpack(packed)


def roundtrip(items: list[Any]) -> list[Any]:
    arenas = ArenaPool()
    try:
        packed, fd = pack(items, arenas)
        data = pickle.dumps(packed)
        assert len(data) < 4096  # the arrays' bytes are in the arena, not the pickle
        received = os.dup(fd) if fd >= 0 else -1
    finally:
        arenas.close()
    return unpack(pickle.loads(data), received)


def test_items_come_back_exactly() -> None:
    rng = np.random.default_rng(0)
    items = [
        (
            torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) + i,
            i,
            f"key{i}",
            {"mask": torch.tensor([True, False, i % 2 == 0]), "n": np.int64(i)},
            [rng.standard_normal((3, 5)).astype(">f4"), np.arange(6).reshape(2, 3)[:, ::2]],
            Point(torch.full((2,), i, dtype=torch.bfloat16), b"raw"),
            torch.empty((0, 3), dtype=torch.int16),
            np.zeros((2, 0), dtype=np.uint8),
            torch.tensor(float(i)),  # zero-dimensional
            torch.arange(12).reshape(3, 4).t(),  # not contiguous
        )
        for i in range(5)
    ]
    back = roundtrip(items)
    assert_same_typed(back, items)
    # Every array of the same place of consecutive items lies back to back.
    assert back[1][0].storage_offset() == back[0][0].storage_offset() + 24


def test_what_the_arena_does_not_take_is_pickled() -> None:
    grad = torch.ones(3, requires_grad=True)
    sparse = torch.eye(3).to_sparse()
    objects = np.array(["a", None], dtype=object)
    back = roundtrip([(grad, sparse, objects, 1.5)])
    assert back[0][0].requires_grad and torch.equal(back[0][0], grad)
    assert torch.equal(back[0][1].to_dense(), torch.eye(3))
    assert list(back[0][2]) == ["a", None] and back[0][3] == 1.5


def test_collation_of_consecutive_rows_is_a_view() -> None:
    items = [(torch.rand(3, 8, 8), i) for i in range(6)]
    back = roundtrip(items)
    batch = torch_collate(back)
    expected = torch.utils.data.default_collate(items)
    assert_same_typed(batch, expected)
    assert batch[0].untyped_storage().data_ptr() == back[0][0].untyped_storage().data_ptr()
    # Rows from elsewhere, or out of order, are stacked as torch does.
    shuffled = [back[1][0], back[0][0]]
    stacked = collate_tensors(shuffled)
    assert torch.equal(stacked, torch.stack(shuffled))
    assert stacked.untyped_storage().data_ptr() != back[0][0].untyped_storage().data_ptr()
    assert torch.equal(
        collate_tensors([torch.ones(2), torch.zeros(2)]), torch.tensor([[1.0] * 2, [0.0] * 2])
    )


def test_an_arena_is_reused_only_once_nothing_views_it() -> None:
    arenas = ArenaPool(keep=2)
    released: list[int] = []
    mappings = ArenaMappings(released.append)

    def send(items: list[Any]) -> tuple[Packed, list[Any]]:
        packed, fd = pack(items, arenas)
        mappings.admit(packed, [os.dup(fd)] if fd >= 0 else [])
        return packed, mappings.unpack(packed)

    packed_a, got_a = send([torch.full((100_000,), 1.0)])
    packed_b, got_b = send([torch.full((100_000,), 2.0)])  # `a` is still viewed: a new arena
    assert packed_b.arena_id != packed_a.arena_id and arenas.created == 2
    view = got_a[0][10:20]  # a view keeps the arena as well as the batch does
    del got_a
    assert released == []
    del view  # released at once, not at the garbage collector's next run
    assert released == [packed_a.arena_id]
    arenas.release(released)
    packed_c, got_c = send([torch.full((90_000,), 3.0)])  # the pages of `a`, rewritten
    assert packed_c.arena_id == packed_a.arena_id and arenas.created == 2
    assert torch.equal(got_c[0], torch.full((90_000,), 3.0))
    assert torch.equal(got_b[0], torch.full((100_000,), 2.0))
    # One twice as large does not fit a released arena; a much smaller one
    # does not take a large arena.
    del got_b, got_c
    arenas.release(released)
    assert arenas.free == 2
    packed_d, _ = send([torch.zeros(400_000)])
    packed_e, _ = send([torch.zeros(10_000)])
    assert {packed_d.arena_id, packed_e.arena_id}.isdisjoint({packed_a.arena_id, packed_b.arena_id})
    assert arenas.free == 2
    arenas.release([packed_d.arena_id, packed_e.arena_id, 12345])  # an unknown id is ignored
    assert arenas.free == 2  # at most `keep` wait; the others are closed
    arenas.close()


def test_packing_keeps_no_item_alive() -> None:
    """Items are freed as soon as the caller drops them, without waiting for
    the garbage collector (a reference cycle would keep a chunk's arrays)."""
    arenas = ArenaPool()
    gc.disable()
    try:
        item = (torch.ones(1000), {"x": np.ones(10)})
        tensor, array = weakref.ref(item[0]), weakref.finalize(item[1]["x"], lambda: None)
        packed, fd = pack([item], arenas)
        del item
        assert tensor() is None and not array.alive
        got = unpack(packed, os.dup(fd))
        view = weakref.ref(got[0][0])
        del got
        assert view() is None
    finally:
        gc.enable()
        arenas.close()


def test_an_arena_pool_forgets_its_oldest_lent_arenas() -> None:
    arenas = ArenaPool(max_lent=3)
    before = len(os.listdir("/proc/self/fd"))
    kept = [pack([torch.full((10,), float(i))], arenas) for i in range(3)]
    with_three = len(os.listdir("/proc/self/fd"))
    assert with_three > before
    kept += [pack([torch.full((10,), float(i))], arenas) for i in range(3, 10)]
    assert len(os.listdir("/proc/self/fd")) == with_three
    arenas.release([packed.arena_id for packed, _ in kept])  # the forgotten ones are ignored
    assert arenas.free == 2
    arenas.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_channel_carries_messages_and_descriptors() -> None:
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    items = [torch.arange(100_000, dtype=torch.int64), {"x": np.ones(3)}]
    arenas = ArenaPool()
    packed, fd = pack(items, arenas)
    left.send(("chunk", 1, packed), [fd])
    arenas.close()
    big = b"x" * 3_000_000  # larger than the socket's buffer: sent while read
    sender = threading.Thread(target=left.send, args=(("raw", 2, big),))
    sender.start()
    assert right.poll(10)
    message, fds = right.recv()
    assert message[:2] == ("chunk", 1) and len(fds) == 1
    assert_same_typed(unpack(message[2], fds[0]), items)
    message, fds = right.recv()
    sender.join(30)
    assert message == ("raw", 2, big) and fds == []
    left.close()
    with pytest.raises(EOFError):
        right.recv()
    right.close()


def test_failures_travel_as_themselves_or_as_torch_words_them() -> None:
    try:
        raise MemberDecodeError(
            "shard 's', member 'k.jpg' at offset 0: bad", url="s", key="k", k="jpg"
        )
    except MemberDecodeError as exc:
        failure = Failure.capture(exc, "chute DataLoader worker 3 (pid 1)")
    failure = pickle.loads(pickle.dumps(failure))
    with pytest.raises(MemberDecodeError) as info:
        failure.reraise()
    assert str(info.value) == "shard 's', member 'k.jpg' at offset 0: bad"
    assert info.value.key == "k" and "worker 3" in info.value.__notes__[0]

    class Local(Exception):  # its class does not pickle
        pass

    try:
        raise Local("inside")
    except Local as exc:
        failure = Failure.capture(exc, "chute DataLoader worker 0 (pid 1)")
    with pytest.raises(RuntimeError, match="Caught Local in chute DataLoader worker 0"):
        pickle.loads(pickle.dumps(failure)).reraise()


def test_warnings_are_reissued_where_the_filters_apply() -> None:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        warnings.warn("skipped img7", chute.SkippedSampleWarning, stacklevel=1)
    caught = pickle.loads(pickle.dumps(caught_warnings(records)))
    with pytest.warns(chute.SkippedSampleWarning, match="skipped img7"):
        caught[0].reissue()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(chute.SkippedSampleWarning):
            caught[0].reissue()


def test_one_intraop_thread_restores_the_callers_count() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_intraop_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2

        def items() -> Any:
            yield torch.get_num_threads()
            raise ValueError("inside")

        it = single_threaded(items())
        assert next(it) == 1 and torch.get_num_threads() == 2
        with pytest.raises(ValueError):
            next(it)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def _engine_batches(ds: chute.WebDataset, stride: int, offset: int, skip: int = 0) -> list[Any]:
    compiled = compile_stages(ds.stages, lambda: [], seed=ds.seed)
    handlers = error_handlers(compiled.native_stages, ds.handler)
    plan = ds.make_plan(compiled, ds.urls, 0, 0, 0, 0, EngineSettings(2, None, 0.0), handlers)
    plan.deliver_stride = stride
    plan.deliver_offset = offset
    plan.skip_batches = skip
    engine = _core.StreamEngine(plan)
    out = []
    while (batch := engine.next(30.0)) is not None:
        out.append([bytes(v) for v in batch.column(0)])
    engine.close()
    return out


def test_an_engine_delivers_its_share_of_the_plans_batches(tiny_shards: list[str]) -> None:
    ds = chute.WebDataset(tiny_shards, shardshuffle=True, seed=3).shuffle(100).to_tuple("cls")
    ds = ds.batched(48)
    whole = _engine_batches(ds, 1, 0)
    assert len(whole) == 21
    shares = [_engine_batches(ds, 3, k) for k in range(3)]
    assert [b for i in range(len(whole)) for b in [shares[i % 3][i // 3]]] == whole
    # Resumed: batches before `skip` are formed, not delivered.
    assert _engine_batches(ds, 3, 2, skip=7) == whole[8::3]
    with pytest.raises(ValueError, match="deliver_offset"):
        _engine_batches(ds, 2, 2)


class RecordingCudart:
    """Records cudaHostRegister/Unregister (this machine may have no CUDA)."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.registrations = 0
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        assert ptr not in self.live and flags == 0
        self.live[ptr] = size
        self.registrations += 1
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802 - CUDA's name
        del self.live[ptr]
        self.unregistered.append(ptr)
        return 0


def test_the_loader_maps_and_pins_an_arena_once_until_its_worker_retires_it() -> None:
    arenas = ArenaPool(keep=1)
    released: list[int] = []
    mappings = ArenaMappings(released.append)
    cudart = RecordingCudart()

    def send(value: float) -> tuple[Packed, int, list[Any]]:
        packed, fd = pack([torch.full((1000,), value)], arenas)
        mappings.admit(packed, [os.dup(fd)] if fd >= 0 else [])
        return packed, fd, mappings.unpack(packed, cudart)

    first, fd, got = send(1.0)
    assert fd >= 0 and cudart.registrations == 1
    del got
    arenas.release(released)
    released.clear()
    again, fd, got = send(2.0)
    # The same arena again: no descriptor, no new mapping, no new registration.
    assert again.arena_id == first.arena_id and fd == -1 and cudart.registrations == 1
    assert torch.equal(got[0], torch.full((1000,), 2.0))
    other, fd, got_other = send(3.0)  # the first is still viewed: a second arena
    assert other.arena_id != first.arena_id and fd >= 0 and cudart.registrations == 2
    del got, got_other
    arenas.release(released)  # keep=1: one of the two is retired, not closed yet
    released.clear()
    assert arenas.free == 1 and arenas.retiring == 1 and cudart.unregistered == []
    last, _, got = send(4.0)
    assert len(last.retired) == 1
    # The loader let go of the retired arena at once (nothing viewed it):
    # unregistered, unmapped, and the worker told so (its id negated).
    assert len(cudart.unregistered) == 1 and released == [-last.retired[0]]
    arenas.release(released)
    assert arenas.retiring == 0  # closed by the worker only now
    del got
    mappings.close()
    assert cudart.live == {}  # unregistered right before each mapping was unmapped
    arenas.close()


def test_a_ctrl_c_taken_while_a_batch_is_released_is_raised_by_the_next_unpack() -> None:
    # A KeyboardInterrupt inside __del__ is printed and dropped by Python: a
    # Ctrl-C that lands while the previous batch dies must still end the loop.
    arenas = ArenaPool(keep=2)
    interrupt = [True]

    def on_release(arena_id: int) -> None:
        if interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt

    mappings = ArenaMappings(on_release)

    def send(items: list[Any]) -> tuple[Packed, list[Any]]:
        packed, fd = pack(items, arenas)
        mappings.admit(packed, [os.dup(fd)] if fd >= 0 else [])
        return packed, mappings.unpack(packed)

    _, got = send([torch.full((100_000,), 1.0)])
    del got  # its lease's release is "interrupted"
    packed, fd = pack([torch.full((100_000,), 2.0)], arenas)
    mappings.admit(packed, [os.dup(fd)] if fd >= 0 else [])
    with pytest.raises(KeyboardInterrupt):
        mappings.unpack(packed)
    assert torch.equal(mappings.unpack(packed)[0], torch.full((100_000,), 2.0))


def test_a_ctrl_c_taken_while_an_arena_is_unmapped_is_raised_by_the_next_unpack() -> None:
    # As above, for the __del__ that unmaps an arena its worker retired.
    arenas = ArenaPool(keep=1)
    released: list[int] = []
    interrupt = [True]

    def on_release(arena_id: int) -> None:
        if arena_id < 0 and interrupt[0]:  # the first arena unmapped: the Ctrl-C lands here
            interrupt[0] = False
            raise KeyboardInterrupt
        released.append(arena_id)

    mappings = ArenaMappings(on_release)

    def send(value: float) -> tuple[Packed, list[Any]]:
        packed, fd = pack([torch.full((1000,), value)], arenas)
        mappings.admit(packed, [os.dup(fd)] if fd >= 0 else [])
        return packed, mappings.unpack(packed)

    _, first = send(1.0)
    _, second = send(2.0)  # the first is still viewed: a second arena
    del first, second
    arenas.release(released)  # keep=1: one of the two is retired
    released.clear()
    packed, fd = pack([torch.full((1000,), 3.0)], arenas)
    assert len(packed.retired) == 1
    mappings.admit(packed, [os.dup(fd)] if fd >= 0 else [])  # unmaps the retired arena
    with pytest.raises(KeyboardInterrupt):
        mappings.unpack(packed)
    assert torch.equal(mappings.unpack(packed)[0], torch.full((1000,), 3.0))
    mappings.close()
    arenas.close()
