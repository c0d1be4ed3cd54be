"""The engine's batches as webdataset would have produced them: columns typed
and collated by webdataset's rules (or torch's), or rows as sample dicts and
tuples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.collate import combine_values, default_collate
from chute.decoders import NativeDecode, python_decode
from chute.extensions import (
    IMAGE_EXTENSIONS,
    KEY_FIELD,
    NATIVE_IMAGE_EXTENSIONS,
    SAMPLE_FIELDS,
    URL_FIELD,
    last_extension,
)
from chute.image_options import has_transforms
from chute.shards import local_path
from chute.wds.compiler import MEMBER, CompiledPipeline, OutputField


class BatchConverter:
    """Turns the engine's columns into what webdataset would have produced."""

    def __init__(self, compiled: CompiledPipeline, urls: list[str]) -> None:
        self.compiled = compiled
        self.urls = urls
        self.local_paths = [local_path(u) for u in urls]
        # Image options apply to the natively decoded images only; bfloat16
        # rows come from the engine as their uint16 bits.
        self.transforms = has_transforms(compiled.decode_opts)
        self.bfloat16 = compiled.decode_opts.get("dtype") == "bfloat16"
        self.native_index = {}
        index = 0
        for f in compiled.fields:
            if f.extensions:
                self.native_index[f.name] = index
                index += 1

    def _decode_python(self, f: OutputField, name: str, payload: bytes) -> Any:
        if f.decode_name is None:
            return payload
        decode_as = name if f.decode_name == MEMBER else f.decode_name
        if self.transforms:
            refuse_python_image(decode_as, self.compiled.image_spec)
        return python_decode(decode_as, payload, self.compiled.image_spec)

    def _column(self, f: OutputField, batch: Any) -> Any:
        if f.name == KEY_FIELD:
            return batch.keys()
        if f.name == URL_FIELD:
            return [self.urls[i] for i in batch.source_indices()]
        column = batch.column(self.native_index[f.name])
        native = f.native
        if native is None:
            # Raw column: decoded in Python (the member's own extension decides
            # for "@member" fields; the first alternative is what we know).
            return combine_values([self._decode_python(f, f.extensions[0], p) for p in column])
        if isinstance(column, np.ndarray):
            if native.decoder == _core.FieldDecoder.IMAGE and native.as_torch:
                return self._image_tensor(column)
            return column
        return combine_values([self._item(native, v) for v in column])

    def _image_tensor(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if self.bfloat16 else tensor

    def _item(self, native: NativeDecode, value: Any) -> Any:
        if native.decoder == _core.FieldDecoder.INT:
            return int(value)
        if native.decoder == _core.FieldDecoder.IMAGE and native.as_torch:
            return self._image_tensor(value)
        return value

    def batch(self, batch: Any) -> Any:
        """One engine batch as one collated batch."""
        c = self.compiled
        if c.tuple_output:
            columns = tuple(self._column(f, batch) for f in c.fields)
            if c.torch_collate:
                # torch transposes a tuple batch with zip: its columns are tuples.
                return [as_torch_column(v, tuple) for v in columns]
            return columns
        rows = list(self.rows(batch))
        if not rows:
            return {}
        collated = default_collate(rows)
        if c.torch_collate:
            # torch gathers a dict batch's values per key in a list.
            return {k: as_torch_column(v, list) for k, v in collated.items()}
        return collated

    def rows(self, batch: Any) -> Iterator[Any]:
        """One engine batch as its samples (dicts, or tuples after to_tuple)."""
        c = self.compiled
        n = batch.size
        columns: list[Any] = []
        for f in c.fields:
            if f.name == KEY_FIELD:
                columns.append(batch.keys())
            elif f.name == URL_FIELD:
                columns.append([self.urls[i] for i in batch.source_indices()])
            else:
                columns.append(batch.column(self.native_index[f.name]))
        others = batch.other_members() if c.keep_others else None
        keys = batch.keys() if not c.tuple_output else None
        sources = batch.source_indices() if not c.tuple_output else None
        for i in range(n):
            values: list[Any] = []
            present: list[bool] = []
            for f, column in zip(c.fields, columns, strict=True):
                value = column[i]
                if value is None:
                    values.append(None)
                    present.append(False)
                    continue
                present.append(True)
                if f.name in SAMPLE_FIELDS:
                    values.append(value)
                elif f.native is None:
                    values.append(self._decode_python(f, f.extensions[0], value))
                else:
                    values.append(self._item(f.native, value))
            if c.tuple_output:
                yield tuple(values)
                continue
            assert keys is not None and sources is not None and others is not None
            url = self.urls[sources[i]]
            sample: dict[str, Any] = {KEY_FIELD: keys[i], URL_FIELD: url}
            local = self.local_paths[sources[i]]
            if local is not None:
                sample["__local_path__"] = local
            for f, value, has in zip(c.fields, values, present, strict=True):
                if has:
                    sample[f.name] = value
            for ext, payload in others[i].items():
                if ext in c.renamed_away:
                    continue
                if c.decoded and self.transforms:
                    refuse_python_image(ext, c.image_spec)
                sample[ext] = python_decode(ext, payload, c.image_spec) if c.decoded else payload
            yield sample


def refuse_python_image(name: str, image_spec: str | None) -> None:
    """Raises for an image that only Python can decode (a format the engine
    does not read) when the decode stage asks for image options, which the
    engine alone applies: its row would silently lack them."""
    if image_spec is not None and last_extension(name).lower() in IMAGE_EXTENSIONS:
        raise ValueError(
            f"{name!r}: decode's image options (size, crop, flip, normalize, dtype, layout) "
            f"apply to {', '.join(sorted(NATIVE_IMAGE_EXTENSIONS))} members only"
        )


def as_torch_column(column: Any, container: type) -> Any:
    """A column collated by webdataset's rules, as torch's default collate
    would have made it: arrays become tensors (sharing memory), other values
    go through torch's collate in the container torch would have built."""
    if isinstance(column, np.ndarray):
        return torch.from_numpy(column)
    if isinstance(column, torch.Tensor):
        return column
    return torch.utils.data.default_collate(container(column))


def pin_copy(value: Any) -> Any:
    """`value` with every tensor in it copied to page-locked memory."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, tuple):
        return tuple(pin_copy(v) for v in value)
    if isinstance(value, list):
        return [pin_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: pin_copy(v) for k, v in value.items()}
    return value
