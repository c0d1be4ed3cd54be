"""The engine's batches as webdataset would have produced them: columns typed
and collated by webdataset's rules (or torch's), or rows as sample dicts and
tuples. Members the engine hands over raw are decoded here (the slow path);
one that fails to decode is a ``DecodingError`` for the decode stage's
handler, which may drop its row."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from chute import _core
from chute.common.collate import combine_values, default_collate
from chute.common.errors import DecodingError
from chute.decoding.decoders import NativeDecode, python_decode
from chute.decoding.extensions import (
    IMAGE_EXTENSIONS,
    KEY_FIELD,
    NATIVE_IMAGE_EXTENSIONS,
    SAMPLE_FIELDS,
    URL_FIELD,
    last_extension,
)
from chute.decoding.image_options import has_transforms
from chute.sources.shards import local_path
from chute.stream.compiler import CompiledPipeline
from chute.stream.prefix import MEMBER, OutputField

# Told of a member that failed to decode in Python: True skips its sample,
# False ends the iteration after this batch; it may raise instead.
FailureHandler = Callable[[BaseException], bool]

# A row `rows` dropped (its sample failed to decode).
DROPPED = object()


class BatchConverter:
    """Turns the engine's columns into what webdataset would have produced."""

    def __init__(
        self, compiled: CompiledPipeline, urls: list[str], on_failure: FailureHandler
    ) -> None:
        self.compiled = compiled
        self.urls = urls
        self.on_failure = on_failure
        self.stopped = False  # a handler asked to end the iteration
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

    def _decode(self, name: str, payload: bytes, key: str, url: str) -> Any:
        """One member decoded in Python; its failure as webdataset reports it."""
        if self.transforms:
            refuse_python_image(name, self.compiled.image_spec)
        try:
            return python_decode(name, payload, self.compiled.image_spec)
        except Exception as exn:
            raise DecodingError(
                url=url,
                key=key,
                k=name,
                message=f"cannot decode member {name!r} of sample {key!r} in {url!r}: "
                f"{type(exn).__name__}: {exn}",
            ) from exn

    def _decode_field(self, f: OutputField, payload: bytes, key: str, url: str) -> Any:
        if f.decode_name is None:
            return payload
        # A raw "@member" field decodes under its member's extension (the
        # first alternative is the one known here).
        return self._decode(
            f.extensions[0] if f.decode_name == MEMBER else f.decode_name, payload, key, url
        )

    def _failed(self, error: BaseException) -> None:
        """Hands a failure to the handler: it skips the row (returns), ends
        the iteration (returns, `stopped` set) or raises."""
        if not self.on_failure(error):
            self.stopped = True

    def image_tensor(self, array: np.ndarray) -> torch.Tensor:
        """A native image row or column as a tensor of the decode's dtype."""
        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if self.bfloat16 else tensor

    def _item(self, native: NativeDecode, value: Any) -> Any:
        if native.decoder == _core.FieldDecoder.INT:
            return int(value)
        if native.decoder == _core.FieldDecoder.IMAGE and native.as_torch:
            return self.image_tensor(value)
        if native.decoder == _core.FieldDecoder.NPY and isinstance(value, np.generic):
            # A 0-d member's row of a stacked column: the 0-d array np.load gives.
            return np.asarray(value)
        return value

    def batch(self, batch: Any) -> Any | None:
        """One engine batch as one collated batch; None when every row was dropped."""
        c = self.compiled
        if not c.tuple_output:
            rows = [r for r in self.rows(batch) if r is not DROPPED]
            if not rows:
                return None
            collated = default_collate(rows)
            if c.torch_collate:
                # torch gathers a dict batch's values per key in a list.
                return {k: as_torch_column(v, list) for k, v in collated.items()}
            return collated
        keys = _core._batch_keys(batch) if c.fields and _needs_keys(c) else None
        sources = batch.source_indices()
        raw: list[Any] = []
        for f in c.fields:
            if f.name == KEY_FIELD:
                raw.append(keys)
            elif f.name == URL_FIELD:
                raw.append([self.urls[i] for i in sources])
            else:
                raw.append(batch.column(self.native_index[f.name]))
        dropped: set[int] = set()
        decoded: dict[int, list[Any]] = {}
        for j, f in enumerate(c.fields):
            if f.name in SAMPLE_FIELDS or f.native is not None or f.decode_name is None:
                continue
            values: list[Any] = []
            for i, payload in enumerate(raw[j]):
                if i in dropped:
                    values.append(None)
                    continue
                try:
                    values.append(
                        self._decode_field(
                            f, payload, keys[i] if keys else "", self.urls[sources[i]]
                        )
                    )
                except DecodingError as error:
                    self._failed(error)
                    dropped.add(i)
                    values.append(None)
            decoded[j] = values
        keep = [i for i in range(batch.size) if i not in dropped]
        if not keep:
            return None
        columns = []
        for j, f in enumerate(c.fields):
            column = decoded.get(j, raw[j])
            if dropped:
                column = _take(column, keep)
            columns.append(self._finish_column(f, column))
        out = tuple(columns)
        if c.torch_collate:
            # torch transposes a tuple batch with zip: its columns are tuples.
            return [as_torch_column(v, tuple) for v in out]
        return out

    def _finish_column(self, f: OutputField, column: Any) -> Any:
        if f.name in SAMPLE_FIELDS:
            return column
        native = f.native
        if native is None:
            return combine_values(column)
        if isinstance(column, np.ndarray):
            if native.decoder == _core.FieldDecoder.IMAGE and native.as_torch:
                return self.image_tensor(column)
            return column
        return combine_values([self._item(native, v) for v in column])

    def rows(self, batch: Any) -> Iterator[Any]:
        """One engine batch as its samples (dicts, or tuples after to_tuple),
        one item per engine row: a sample whose member fails to decode goes to
        the handler and is `DROPPED` (the iteration ends after it when the
        handler asks to stop)."""
        c = self.compiled
        n = batch.size
        keys = _core._batch_keys(batch) if _needs_keys(c) else None
        sources = batch.source_indices()
        columns: list[Any] = []
        for f in c.fields:
            if f.name == KEY_FIELD:
                columns.append(keys)
            elif f.name == URL_FIELD:
                columns.append([self.urls[i] for i in sources])
            else:
                columns.append(batch.column(self.native_index[f.name]))
        others = _core._batch_other_members(batch) if c.keep_others else None
        for i in range(n):
            key = keys[i] if keys else ""
            try:
                sample = self._row(i, key, sources[i], columns, others)
            except DecodingError as error:
                self._failed(error)
                if self.stopped:
                    return
                yield DROPPED
                continue
            yield sample

    def _row(
        self, i: int, key: str, source: int, columns: list[Any], others: list[Any] | None
    ) -> Any:
        c = self.compiled
        url = self.urls[source]
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
                values.append(self._decode_field(f, value, key, url))
            else:
                values.append(self._item(f.native, value))
        if c.tuple_output:
            return tuple(values)
        assert others is not None
        sample: dict[str, Any] = {KEY_FIELD: key, URL_FIELD: url}
        local = self.local_paths[source]
        if local is not None:
            sample["__local_path__"] = local
        for f, value, has in zip(c.fields, values, present, strict=True):
            if has:
                sample[f.name] = value
        for ext, payload in others[i].items():
            if ext in c.renamed_away:
                continue
            decode = c.decoded and (c.decode_only is None or ext in c.decode_only)
            sample[ext] = self._decode(ext, payload, key, url) if decode else payload
        return sample


def _needs_keys(c: CompiledPipeline) -> bool:
    """Whether the engine collected keys: dict samples and ``__key__`` fields."""
    return not c.tuple_output or any(f.name == KEY_FIELD for f in c.fields)


def _take(column: Any, keep: list[int]) -> Any:
    """The rows `keep` of a column (an array, a tensor or a list)."""
    if isinstance(column, np.ndarray):
        return column[keep]
    if isinstance(column, torch.Tensor):
        return column[torch.as_tensor(keep)]
    return [column[i] for i in keep]


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
