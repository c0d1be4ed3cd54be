"""The compiler from recorded stages to the description of a native pipeline.

The longest prefix of the chain that the engine understands (a shuffle of
encoded samples, one decode with an image spec, renames, ``to_tuple``, a
``batched`` with the default collation) becomes output fields with their
member extensions and decoders; the rest stays as Python stages, the slow
path. Each stage says whether it joins the prefix (``Stage.compile``); the
compiler asks them in order and finishes the fields. A pure function of the
stages and the first sample's extensions: it opens no shard and starts no
engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chute.common.handlers import Handler, reraise_exception
from chute.decoding.decoders import NativeDecode, native_decode_for
from chute.stream.native import ErrorHandlers
from chute.stream.prefix import MEMBER, NativePrefix, OutputField
from chute.stream.stages import Stage


@dataclass
class CompiledPipeline:
    """What the engine runs and what Python does after it."""

    fields: list[OutputField]
    tuple_output: bool  # to_tuple reached natively
    keep_others: bool  # dict samples: members not named by a field come along
    renamed_away: set[str]  # dict samples: extensions consumed by a rename
    decoded: bool  # a decode stage ran natively
    image_spec: str | None
    batch_size: int | None  # batched natively
    partial: bool
    python_stages: list[Stage]
    shuffle: tuple[int, int, int] | None  # capacity, initial, seed
    decode_opts: dict[str, Any] = field(default_factory=dict)  # the decode stage's keywords
    torch_collate: bool = False  # batches shaped as torch's default collate makes them
    decode_only: set[str] | None = None  # the decode stage's `only`: members it decodes
    native_stages: list[Stage] = field(default_factory=list)  # the prefix the engine runs

    @property
    def ends_in_native_batches(self) -> bool:
        """The engine's batches are the pipeline's items, so it can count them."""
        return not self.python_stages and self.batch_size is not None


def compile_stages(
    stages: Sequence[Stage],
    first_sample_extensions: Callable[[], Sequence[str]],
    *,
    seed: int,
    shuffle_seed: int | None = None,
) -> CompiledPipeline:
    """Compiles `stages`. `first_sample_extensions` is called only for dict
    samples, whose native fields the first sample's members name (a later
    sample with other members still gets them, raw or decoded in Python).
    `seed` seeds a shuffle without its own seed or rng; `shuffle_seed`
    overrides every shuffle seed (a resumed iteration replays its order). A
    shuffle with an ``rng`` draws its seed from it."""
    prefix = NativePrefix(seed=seed, shuffle_seed=shuffle_seed)
    position = 0
    while position < len(stages) and stages[position].compile(prefix):
        position += 1

    fields = prefix.fields or []
    if not prefix.tuple_output:
        # Dict samples: members nobody renamed keep their extension as name.
        present = {e for f in fields for e in f.extensions}
        extra = [e for e in first_sample_extensions() if e not in present]
        fields = fields + [
            OutputField(e, [e], MEMBER if prefix.decoded else None, required=False) for e in extra
        ]
    for f in fields:
        if prefix.decode_only is not None:
            restrict_to_only(f, prefix.decode_only)
        f.native = native_decoder(f, prefix.image_spec)
    return CompiledPipeline(
        fields=fields,
        tuple_output=prefix.tuple_output,
        keep_others=not prefix.tuple_output,
        renamed_away=prefix.renamed_away,
        decoded=prefix.decoded,
        image_spec=prefix.image_spec if prefix.decoded else None,
        batch_size=prefix.batch_size,
        partial=prefix.partial,
        python_stages=list(stages[position:]),
        shuffle=prefix.shuffle,
        decode_opts=dict(prefix.decode_opts),
        decode_only=prefix.decode_only,
        native_stages=list(stages[:position]),
    )


def restrict_to_only(f: OutputField, only: set[str]) -> None:
    """Leaves `f` undecoded when the decode stage's `only` does not name it."""
    if f.decode_name is None:
        return
    names = f.extensions if f.decode_name == MEMBER else [f.decode_name]
    inside = {name in only for name in names}
    if inside == {False}:
        f.decode_name = None
    elif len(inside) > 1:
        raise ValueError(
            f"field {f.name!r}: decode(only=...) names some of its alternatives "
            f"({';'.join(f.extensions)}) but not all; list them separately"
        )


def native_decoder(f: OutputField, image_spec: str | None) -> NativeDecode | None:
    """How the engine decodes `f`, or None when it hands the bytes over."""
    if f.decode_name is None or not f.extensions:
        return None
    names = f.extensions if f.decode_name == MEMBER else [f.decode_name]
    choices = {native_decode_for(n, image_spec) for n in names}
    if len(choices) != 1:
        raise ValueError(
            f"field {f.name!r}: alternatives {';'.join(f.extensions)} decode differently; "
            "decode them in separate fields"
        )
    return choices.pop()


def native_torch_batch(
    compiled: CompiledPipeline, batch_size: int, drop_last: bool, *, single_pass: bool
) -> CompiledPipeline | None:
    """`compiled` with torch's default batching done by the engine, or None
    when a Python stage or a ``.batched`` comes first, or when an epoch makes
    several passes (torch's batches run on across them)."""
    if compiled.batch_size is not None or compiled.python_stages or not single_pass:
        return None
    return dataclasses.replace(
        compiled, batch_size=batch_size, partial=not drop_last, torch_collate=True
    )


def error_handlers(native_stages: Sequence[Stage], default: Handler) -> ErrorHandlers:
    """Who handles a failure in the native part, by webdataset's scopes: the
    dataset's handler for reading and tar structure; a decode stage's own
    handler for members that do not decode (a decode stage without one
    leaves them to the dataset's handler: chute's rule, documented); a
    ``to_tuple``/``rename`` stage's own handler for samples that lack a
    field, which raise, as webdataset's do, where that stage has none."""
    handlers = ErrorHandlers(read=default, member=default, field=reraise_exception)
    for stage in native_stages:
        handlers = stage.take_failures(handlers, default)
    return handlers
