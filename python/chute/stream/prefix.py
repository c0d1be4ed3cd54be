"""The native prefix of a pipeline while it is compiled: what the stages the
engine runs have asked of it so far (a shuffle, a decode, the output fields,
a batch size). Each stage class adds itself to it
(``chute.stream.stages.base.Stage.compile``); the compiler
(``chute.stream.compiler``) starts one and turns the finished one into the
engine's description.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chute.decoding.decoders import NativeDecode
from chute.decoding.extensions import SAMPLE_FIELDS

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
class NativePrefix:
    """The engine's part of a pipeline, as far as it has been compiled.
    `seed` seeds a shuffle without its own seed or rng; `shuffle_seed`
    overrides every shuffle seed (a resumed iteration replays its order)."""

    seed: int
    shuffle_seed: int | None = None
    shuffle: tuple[int, int, int] | None = None  # capacity, initial, seed
    decoded: bool = False  # a decode stage ran natively
    image_spec: str | None = None
    decode_opts: dict[str, Any] = field(default_factory=dict)  # the decode stage's keywords
    decode_only: set[str] | None = None  # the decode stage's `only`: members it decodes
    fields: list[OutputField] | None = None  # None: no stage has named fields yet
    renamed_away: set[str] = field(default_factory=set)  # extensions a rename consumed
    tuple_output: bool = False  # to_tuple reached natively
    batch_size: int | None = None  # batched natively
    partial: bool = True

    @property
    def samples_shaped(self) -> bool:
        """Whether a stage has already tupled or batched the samples (a
        rename, to_tuple or decode after that runs in Python)."""
        return self.batch_size is not None or self.tuple_output

    def resolve_field(self, spec: str) -> OutputField:
        """The output field for `spec` ("a;b" alternatives), built from the
        fields so far or, for names no stage has touched, from member
        extensions."""
        if spec in SAMPLE_FIELDS:
            return OutputField(spec, [], None)
        known = {f.name: f for f in self.fields or []}
        alternatives: list[str] = []
        decode_names: set[str | None] = set()
        for alt in spec.split(";"):
            if alt in known:
                alternatives.extend(known[alt].extensions)
                decode_names.add(known[alt].decode_name)
            else:
                alternatives.append(alt)
                decode_names.add(MEMBER if self.decoded else None)
        if len(decode_names) != 1:
            raise ValueError(
                f"alternatives in {spec!r} were decoded differently; list them separately"
            )
        return OutputField(spec, alternatives, decode_names.pop())

    def rename(self, names: dict[str, str]) -> None:
        """The fields after ``rename(**names)``; the extensions it consumes
        go to `renamed_away`."""
        renamed = []
        for new_name, spec in names.items():
            field_ = self.resolve_field(spec)
            renamed.append(OutputField(new_name, field_.extensions, field_.decode_name))
            self.renamed_away.update(field_.extensions)
        consumed = {alt for spec in names.values() for alt in spec.split(";")}
        kept = [f for f in self.fields or [] if f.name not in consumed and f.name not in names]
        self.fields = kept + renamed
