"""The compiler from recorded stages to the description of a native pipeline.

The longest prefix of the chain that the engine understands (a shuffle of
encoded samples, one decode with an image spec, renames, ``to_tuple``, a
``batched`` with the default collation) becomes output fields with their
member extensions and decoders; the rest stays as Python stages, the slow
path. A pure function of the stages and the first sample's extensions: it
opens no shard and starts no engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chute.collate import default_collate
from chute.decoders import NativeDecode, native_decode_for
from chute.extensions import SAMPLE_FIELDS
from chute.handlers import Handler, reraise_exception
from chute.wds.native import ErrorHandlers
from chute.wds.stages import Stage

# A field decoded under the name of whichever member it holds (dict samples,
# and names no rename touched), as webdataset's Decoder sees each member.
MEMBER = "@member"


@dataclass
class OutputField:
    """One field of the native part's output, and where it comes from."""

    name: str
    extensions: list[str]  # member extensions, alternatives in order
    decode_name: str | None  # the name webdataset's decoder would see; None: not decoded
    required: bool = True  # False: a dict sample's member that later samples may lack
    native: NativeDecode | None = None


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
    position = 0
    shuffle: tuple[int, int, int] | None = None
    image_spec: str | None = None
    decode_opts: dict[str, Any] = {}
    decoded = False
    fields: list[OutputField] | None = None  # None: no stage has named fields yet
    renamed_away: set[str] = set()
    tuple_output = False
    batch_size: int | None = None
    partial = True
    decode_only: set[str] | None = None
    while position < len(stages):
        stage = stages[position]
        if stage.kind == "shuffle" and not decoded and fields is None and shuffle is None:
            size = int(stage.args[0])
            initial = min(int(stage.kwargs["initial"]), size)
            rng = stage.kwargs["rng"]
            if shuffle_seed is not None:
                chosen = shuffle_seed
            elif rng is not None:
                chosen = rng.getrandbits(63)
            elif stage.kwargs["seed"] is not None:
                chosen = int(stage.kwargs["seed"])
            else:
                chosen = seed
            shuffle = (size, initial, chosen)
        elif (
            stage.kind == "decode"
            and not decoded
            and batch_size is None
            and not tuple_output
            and all(isinstance(s, str) for s in stage.args)
            and len(stage.args) <= 1
            and stage.kwargs.get("pre") is None
            and stage.kwargs.get("post") is None
        ):
            decoded = True
            image_spec = stage.args[0].lower() if stage.args else None
            decode_opts = stage.kwargs
            decode_only = stage.kwargs.get("only")
            # Fields renamed before decoding are decoded under their new name,
            # as webdataset's Decoder sees it (often: not at all).
            for f in fields or []:
                f.decode_name = f.name
        elif (
            stage.kind == "rename"
            and batch_size is None
            and not tuple_output
            and stage.kwargs["keep"]
        ):
            fields = rename_fields(fields or [], stage.kwargs["names"], decoded, renamed_away)
        elif (
            stage.kind == "to_tuple"
            and batch_size is None
            and not tuple_output
            and stage.kwargs.get("missing_is_error", True)
            and stage.kwargs.get("none_is_error") in (None, True)
        ):
            fields = [resolve_field(spec, fields or [], decoded) for spec in stage.args]
            tuple_output = True
        elif (
            stage.kind == "batched"
            and batch_size is None
            and stage.kwargs["collation_fn"] is default_collate
        ):
            batch_size = int(stage.args[0])
            partial = bool(stage.kwargs["partial"])
        else:
            break
        position += 1

    if not tuple_output:
        # Dict samples: members nobody renamed keep their extension as name.
        present = {e for f in fields or [] for e in f.extensions}
        extra = [e for e in first_sample_extensions() if e not in present]
        fields = (fields or []) + [
            OutputField(e, [e], MEMBER if decoded else None, required=False) for e in extra
        ]
    assert fields is not None
    for f in fields:
        if decode_only is not None:
            restrict_to_only(f, decode_only)
        f.native = native_decoder(f, image_spec)
    return CompiledPipeline(
        fields=fields,
        tuple_output=tuple_output,
        keep_others=not tuple_output,
        renamed_away=renamed_away,
        decoded=decoded,
        image_spec=image_spec if decoded else None,
        batch_size=batch_size,
        partial=partial,
        python_stages=list(stages[position:]),
        shuffle=shuffle,
        decode_opts=dict(decode_opts),
        decode_only=decode_only,
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


def resolve_field(spec: str, fields: list[OutputField], decoded: bool) -> OutputField:
    """The output field for `spec` ("a;b" alternatives), built from earlier
    fields or, for names no stage has touched, from member extensions."""
    if spec in SAMPLE_FIELDS:
        return OutputField(spec, [], None)
    known = {f.name: f for f in fields}
    alternatives: list[str] = []
    decode_names: set[str | None] = set()
    for alt in spec.split(";"):
        if alt in known:
            alternatives.extend(known[alt].extensions)
            decode_names.add(known[alt].decode_name)
        else:
            alternatives.append(alt)
            decode_names.add(MEMBER if decoded else None)
    if len(decode_names) != 1:
        raise ValueError(f"alternatives in {spec!r} were decoded differently; list them separately")
    return OutputField(spec, alternatives, decode_names.pop())


def rename_fields(
    fields: list[OutputField],
    names: dict[str, str],
    decoded: bool,
    renamed_away: set[str],
) -> list[OutputField]:
    """The fields after ``rename(**names)``; adds the extensions it consumes
    to `renamed_away`."""
    renamed = []
    for new_name, spec in names.items():
        field_ = resolve_field(spec, fields, decoded)
        renamed.append(OutputField(new_name, field_.extensions, field_.decode_name))
        renamed_away.update(field_.extensions)
    consumed = {alt for spec in names.values() for alt in spec.split(";")}
    return [f for f in fields if f.name not in consumed and f.name not in names] + renamed


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
    member = default
    field_: Handler = reraise_exception
    for stage in native_stages:
        own = stage.kwargs.get("handler", reraise_exception)
        if own is reraise_exception:
            continue
        if stage.kind == "decode" and member is default:
            member = own
        elif stage.kind in ("to_tuple", "rename") and field_ is reraise_exception:
            field_ = own
    return ErrorHandlers(read=default, member=member, field=field_)
