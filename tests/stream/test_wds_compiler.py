"""The compiler from recorded webdataset stages to a native pipeline
description, on its own: no shard is opened and no engine started."""

from __future__ import annotations

import random
from typing import Any

import chute
import pytest
from chute import _core
from chute.common.handlers import ignore_and_continue, reraise_exception, warn_and_continue
from chute.stream.compiler import (
    CompiledPipeline,
    compile_stages,
    error_handlers,
    native_torch_batch,
)
from chute.stream.fluent import Fluent
from chute.stream.stages import Stage

IMAGE, NPY, INT = _core.FieldDecoder.IMAGE, _core.FieldDecoder.NPY, _core.FieldDecoder.INT


class Chain(Fluent):
    """Records stages as WebDataset does, without shards."""

    def __init__(self) -> None:
        self.stages = []


def never_peeked() -> list[str]:
    raise AssertionError("a tuple pipeline needs no first sample")


def peek(*extensions: str) -> Any:
    calls: list[int] = []

    def first_sample_extensions() -> list[str]:
        calls.append(1)
        return list(extensions)

    first_sample_extensions.calls = calls  # type: ignore[attr-defined]
    return first_sample_extensions


def fields(c: CompiledPipeline) -> list[tuple[Any, ...]]:
    """(name, extensions, decode name, required, decoder, image spec) per field."""
    return [
        (
            f.name,
            f.extensions,
            f.decode_name,
            f.required,
            f.native.decoder if f.native else None,
            f.native.image_spec if f.native else None,
        )
        for f in c.fields
    ]


def kinds(stages: list[Stage]) -> list[str]:
    return [s.kind for s in stages]


def test_whole_chain_is_native() -> None:
    chain = (
        Chain()
        .shuffle(100, initial=10, seed=7)
        .decode("torchrgb8", size=(32, 48), crop="random", flip=True)
        .to_tuple("jpg;png", "cls", "__key__")
        .batched(32, partial=False)
    )
    c = compile_stages(chain.stages, never_peeked, seed=1)
    assert fields(c) == [
        ("jpg;png", ["jpg", "png"], "@member", True, IMAGE, "torchrgb8"),
        ("cls", ["cls"], "@member", True, INT, None),
        ("__key__", [], None, True, None, None),
    ]
    assert c.tuple_output and not c.keep_others and c.decoded
    assert c.image_spec == "torchrgb8"
    assert c.decode_opts == {
        "handler": reraise_exception,
        "size": (32, 48),
        "crop": "random",
        "flip": True,
        "resize": None,
        "scale": (0.08, 1.0),
        "ratio": (0.75, 4 / 3),
        "normalize": None,
        "dtype": None,
        "layout": None,
        "pre": None,
        "post": None,
        "only": None,
        "partial": False,
    }
    assert (c.batch_size, c.partial, c.shuffle) == (32, False, (100, 10, 7))
    assert c.python_stages == [] and c.ends_in_native_batches


def test_python_stage_ends_the_native_prefix() -> None:
    chain = Chain().decode().to_tuple("npy", "cls").map(lambda s: s).batched(8)
    c = compile_stages(chain.stages, never_peeked, seed=1)
    assert fields(c) == [
        ("npy", ["npy"], "@member", True, NPY, None),
        ("cls", ["cls"], "@member", True, INT, None),
    ]
    assert c.image_spec is None and c.batch_size is None
    assert kinds(c.python_stages) == ["map", "batched"]
    assert c.python_stages[1] is chain.stages[3]
    assert not c.ends_in_native_batches


def test_dict_samples_take_their_fields_from_the_first_sample() -> None:
    chain = Chain().decode("rgb8").rename(image="jpg;png", label="cls").batched(4)
    first = peek("jpg", "cls", "json", "npy")
    c = compile_stages(chain.stages, first, seed=1)
    assert first.calls == [1]
    assert fields(c) == [
        ("image", ["jpg", "png"], "@member", True, IMAGE, "rgb8"),
        ("label", ["cls"], "@member", True, INT, None),
        # Members nobody renamed keep their extension; later samples may lack them.
        ("json", ["json"], "@member", False, None, None),
        ("npy", ["npy"], "@member", False, NPY, None),
    ]
    assert not c.tuple_output and c.keep_others
    assert c.renamed_away == {"jpg", "png", "cls"}
    assert c.batch_size == 4 and c.python_stages == []


def test_undecoded_dict_samples_stay_bytes() -> None:
    c = compile_stages(Chain().stages, peek("jpg", "cls"), seed=1)
    assert fields(c) == [
        ("jpg", ["jpg"], None, False, None, None),
        ("cls", ["cls"], None, False, None, None),
    ]
    assert not c.decoded and c.image_spec is None and c.batch_size is None


def test_a_field_renamed_before_decoding_is_decoded_under_its_new_name() -> None:
    # webdataset's Decoder sees the key "img", which names no image type.
    chain = Chain().rename(img="jpg").decode("rgb8").to_tuple("img", "cls")
    c = compile_stages(chain.stages, never_peeked, seed=1)
    assert fields(c) == [
        ("img", ["jpg"], "img", True, None, None),
        ("cls", ["cls"], "@member", True, INT, None),
    ]


@pytest.mark.parametrize(
    ("chain", "native_kinds", "python_kinds"),
    [
        # A shuffle of decoded samples is not the engine's (it shuffles encoded bytes).
        (Chain().decode().shuffle(50).to_tuple("npy"), ["decode"], ["shuffle", "to_tuple"]),
        # Decoders given as callables run in Python.
        (Chain().decode(lambda k, v: None).to_tuple("npy"), [], ["decode", "to_tuple"]),
        # A custom collation runs in Python, and so does all that follows.
        (
            Chain().to_tuple("npy").batched(4, collation_fn=list).batched(2),
            ["to_tuple"],
            ["batched", "batched"],
        ),
        # rename(keep=False) drops members the engine would otherwise carry.
        (Chain().rename(keep=False, a="npy").to_tuple("a"), [], ["rename", "to_tuple"]),
        (Chain().to_tuple("npy").batched(4).unbatched(), ["to_tuple", "batched"], ["unbatched"]),
    ],
)
def test_where_the_python_slow_path_starts(
    chain: Chain, native_kinds: list[str], python_kinds: list[str]
) -> None:
    c = compile_stages(chain.stages, peek("npy"), seed=1)
    assert kinds(chain.stages) == native_kinds + python_kinds
    assert kinds(c.python_stages) == python_kinds


def test_shuffle_seed_comes_from_the_stage_its_rng_or_the_dataset() -> None:
    def seed_of(chain: Chain, **kwargs: Any) -> int:
        shuffle = compile_stages(chain.stages, peek("npy"), seed=11, **kwargs).shuffle
        assert shuffle is not None
        return shuffle[2]

    assert seed_of(Chain().shuffle(10)) == 11
    assert seed_of(Chain().shuffle(10, seed=5)) == 5
    assert seed_of(Chain().shuffle(10, seed=5), shuffle_seed=99) == 99
    assert seed_of(Chain().shuffle(10, rng=random.Random(3))) == random.Random(3).getrandbits(63)
    assert compile_stages(Chain().shuffle(10, initial=500).stages, peek(), seed=0).shuffle == (
        10,
        10,
        0,
    )


def test_alternatives_that_decode_differently_are_refused() -> None:
    with pytest.raises(ValueError, match="decode differently"):
        compile_stages(Chain().decode("rgb8").to_tuple("jpg;npy").stages, never_peeked, seed=1)
    with pytest.raises(ValueError, match="decoded differently"):
        chain = Chain().rename(a="jpg").decode("rgb8").to_tuple("a;png")
        compile_stages(chain.stages, never_peeked, seed=1)


def test_torch_batching_goes_native_only_at_the_end_of_native_stages() -> None:
    c = compile_stages(Chain().decode().to_tuple("npy", "cls").stages, never_peeked, seed=1)
    batched = native_torch_batch(c, 16, True, single_pass=True)
    assert batched is not None and batched is not c
    assert (batched.batch_size, batched.partial, batched.torch_collate) == (16, False, True)
    assert (c.batch_size, c.torch_collate) == (None, False)
    # torch's batches run on across the passes of a repeating epoch.
    assert native_torch_batch(c, 16, True, single_pass=False) is None
    mapped = compile_stages(Chain().to_tuple("npy").map(str).stages, never_peeked, seed=1)
    assert native_torch_batch(mapped, 16, False, single_pass=True) is None
    rebatched = compile_stages(Chain().to_tuple("npy").batched(4).stages, never_peeked, seed=1)
    assert native_torch_batch(rebatched, 16, False, single_pass=True) is None


def test_each_failure_goes_to_the_handler_of_its_scope() -> None:
    plain = Chain().decode().to_tuple("npy")
    h = error_handlers(plain.stages, warn_and_continue)
    # A decode stage without a handler of its own leaves its failures to the
    # dataset's; a to_tuple/rename without one raises, as webdataset's does.
    assert (h.read, h.member, h.field) == (warn_and_continue, warn_and_continue, reraise_exception)
    own = Chain().decode(handler=warn_and_continue).to_tuple("npy", handler=ignore_and_continue)
    h = error_handlers(own.stages, reraise_exception)
    assert (h.read, h.member, h.field) == (
        reraise_exception,
        warn_and_continue,
        ignore_and_continue,
    )
    assert h.policy == _core.ErrorPolicy.SKIP
    assert error_handlers(plain.stages, reraise_exception).policy == _core.ErrorPolicy.RAISE
    # By the scope the engine set, whatever the message says.
    for scope, handler in [
        ("read", reraise_exception),
        ("member", warn_and_continue),
        ("field", ignore_and_continue),
        ("batch", reraise_exception),
        ("other", reraise_exception),
    ]:
        error = chute.DataError("truncated tar archive 'a.tar': field 'npy' not found")
        error.failure_scope = scope
        assert h.for_failure(error) is handler, scope
    # A failure that is not the engine's has no scope: the dataset's handler.
    assert h.for_failure(ValueError("member 'k.jpg' at offset 0: x")) is reraise_exception


def test_decode_only_leaves_the_other_members_undecoded() -> None:
    chain = Chain().decode("rgb8", only=["jpg", "png"]).to_tuple("jpg;png", "cls")
    c = compile_stages(chain.stages, never_peeked, seed=1)
    assert fields(c) == [
        ("jpg;png", ["jpg", "png"], "@member", True, IMAGE, "rgb8"),
        ("cls", ["cls"], None, True, None, None),
    ]
    with pytest.raises(ValueError, match="only"):
        compile_stages(
            Chain().decode("rgb8", only="jpg").to_tuple("jpg;png").stages, never_peeked, seed=1
        )


def test_custom_pre_or_post_handlers_decode_in_python() -> None:
    chain = Chain().decode("rgb8", post=[]).to_tuple("jpg")
    assert kinds(compile_stages(chain.stages, peek("jpg"), seed=1).python_stages) == [
        "decode",
        "to_tuple",
    ]
