"""``decode``: members to values. With one image spec (or none) and the
default handler chain the engine decodes, with chute's image options; with
handler callables or pre/post handlers, webdataset's Decoder runs in Python
(chute.stream.autodecode)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chute.common.handlers import Handler, reraise_exception
from chute.decoding.image_options import has_transforms
from chute.stream.autodecode import DecodeHandler, decoder_of
from chute.stream.native import ErrorHandlers
from chute.stream.prefix import NativePrefix
from chute.stream.stages.base import PythonRun, Stage, own_handler


@dataclass(eq=False)
class Decode(Stage):
    """``decode(*specs, ...)``: `specs` are image specs and handler
    callables; `image_options` chute's canonical image options
    (chute.decoding.image_options)."""

    kind: ClassVar[str] = "decode"
    itemwise: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True

    specs: tuple[str | DecodeHandler, ...] = ()
    handler: Handler = reraise_exception
    image_options: dict[str, Any] = field(default_factory=dict)
    pre: list[DecodeHandler] | None = None
    post: list[DecodeHandler] | None = None
    only: set[str] | None = None
    partial: bool = False

    @property
    def options(self) -> dict[str, Any]:
        """Every keyword of the stage, as the engine's field plans read them."""
        return {
            "handler": self.handler,
            **self.image_options,
            "pre": self.pre,
            "post": self.post,
            "only": self.only,
            "partial": self.partial,
        }

    def compile(self, prefix: NativePrefix) -> bool:
        if (
            prefix.decoded
            or prefix.samples_shaped
            or not all(isinstance(s, str) for s in self.specs)
            or len(self.specs) > 1
            or self.pre is not None
            or self.post is not None
        ):
            return False
        prefix.decoded = True
        spec = self.specs[0] if self.specs else None
        prefix.image_spec = spec.lower() if isinstance(spec, str) else None
        prefix.decode_opts = self.options
        prefix.decode_only = self.only
        # Fields renamed before decoding are decoded under their new name, as
        # webdataset's Decoder sees it (often: not at all).
        for f in prefix.fields or []:
            f.decode_name = f.name
        return True

    def take_failures(self, handlers: ErrorHandlers, default: Handler) -> ErrorHandlers:
        # Members that do not decode go to the first decode stage with a
        # handler of its own; without one, to the dataset's.
        if self.handler is reraise_exception or handlers.member is not default:
            return handlers
        return dataclasses.replace(handlers, member=self.handler)

    def apply(self, items: Iterator[Any], run: PythonRun) -> Iterator[Any]:
        # Members that do not decode: as in the native part (take_failures).
        handler = own_handler(self.handler)
        if handler is reraise_exception:
            handler = run.default_handler
        refuse_python_transforms(self.options)
        decoder = decoder_of(
            self.specs, pre=self.pre, post=self.post, only=self.only, partial=bool(self.partial)
        )
        return run.guarded(items, decoder, handler)


def refuse_python_transforms(options: dict[str, Any]) -> None:
    """Raises for a decode stage that runs in Python and asks for image
    options, which the engine alone applies."""
    if has_transforms(options):
        raise ValueError(
            "decode's image options (size, crop, flip, normalize, dtype, layout) run in the "
            "engine only, and this decode runs in Python: it follows a Python stage (map, "
            "select, ...), has handler callables or pre/post handlers, belongs to a "
            "WebLoader or is called on an iterator; decode with one image spec before any "
            "Python stage of a WebDataset"
        )
