"""Checks on a batch before training starts: keys, shapes, dtypes, values.

A spec maps each field to its rules::

    spec = {
        "image": {"shape": (None, 3, 224, 224), "dtype": "uint8"},
        "voxels": {"dtype": "floating", "finite": True, "min": -50, "max": 50},
        "label": {"shape": (None,), "ids": 1000},
        "weight": {"required": False, "min": 0},
    }

Fields are keys of a dict batch or positions (0, 1, ...) of a tuple/list
batch. Rules:

- `required` (default True): the field must be present; an optional field
  that is present is still checked.
- `shape`: the whole batch shape, batch dimension first; `None` matches any
  size (use it for the batch dimension unless it is fixed).
- `dtype`: a torch dtype, numpy dtype or name ("float32", "torch.int64"), a
  kind ("floating", "integer", "bool"), or a tuple of those.
- `min` / `max`: inclusive bounds on every value (NaN is not caught here:
  use `finite`).
- `finite`: no NaN or ±Inf.
- `ids`: n — integer values within [0, n) (class labels, token ids,
  embedding rows).

A failure raises `ValidationError` (a `ValueError`) naming the field, the
rule and, for value rules, the first offending row (index along the batch
dimension) and the first offending value in it. Torch tensors (any device)
and numpy arrays are accepted; a field that is a list of tensors (variable
shapes) is checked row by row, and its `shape` rule then excludes the batch
dimension.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

_RULES = ("required", "shape", "dtype", "min", "max", "finite", "ids")
_KINDS = {"floating": "f", "float": "f", "integer": "iu", "int": "iu", "bool": "b"}


class ValidationError(ValueError):
    """A batch broke a rule of its spec. `field`, `rule`, `row` (None for
    whole-batch rules) and `value` say where."""

    def __init__(
        self, field: Any, rule: str, detail: str, row: int | None = None, value: Any = None
    ) -> None:
        self.field = field
        self.rule = rule
        self.row = row
        self.value = value
        where = f" at row {row}" if row is not None else ""
        super().__init__(f"field {field!r}: rule {rule!r} failed{where}: {detail}")


def validate_batch(batch: Any, spec: Mapping[Any, Mapping[str, Any]]) -> None:
    """Raises `ValidationError` at the first rule `batch` breaks (fields in spec order)."""
    for field, rules in spec.items():
        unknown = sorted(set(rules) - set(_RULES))
        if unknown:
            raise TypeError(f"spec for field {field!r}: unknown rule(s) {unknown}; rules: {_RULES}")
        present, value = _lookup(batch, field)
        if not present:
            if rules.get("required", True):
                raise ValidationError(field, "required", f"missing from the batch ({_keys(batch)})")
            continue
        if isinstance(value, list | tuple) and value and _is_array(value[0]):
            for row, item in enumerate(value):
                _check_array(field, rules, item, row_offset=row, whole=False)
        else:
            _check_array(field, rules, value, row_offset=0, whole=True)


def validate_first_batch(loader: Iterable[Any], spec: Mapping[Any, Mapping[str, Any]]) -> Any:
    """Takes one batch from a fresh iterator of `loader`, validates it and returns it.

    The iterator is closed afterwards (a chute loader shuts its threads
    down), so the next `for batch in loader` starts the epoch from the top.
    """
    iterator = iter(loader)
    try:
        batch = next(iterator)
    except StopIteration:
        raise ValidationError("*", "non-empty", "the loader yielded no batch") from None
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()
    validate_batch(batch, spec)
    return batch


def _lookup(batch: Any, field: Any) -> tuple[bool, Any]:
    if isinstance(batch, Mapping):
        return (field in batch), batch.get(field)
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes):
        if isinstance(field, int) and -len(batch) <= field < len(batch):
            return True, batch[field]
        return False, None
    raise TypeError(f"validate_batch: a batch must be a dict, tuple or list, got {type(batch)}")


def _keys(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return f"keys: {list(batch)}"
    return f"{len(batch)} positions"


def _is_array(x: Any) -> bool:
    return isinstance(x, torch.Tensor | np.ndarray)


def _dtype_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    return np.asarray(value).dtype.name


def _dtype_kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            return "b"
        if value.dtype.is_floating_point:
            return "f"
        return "c" if value.dtype.is_complex else "i"
    return np.asarray(value).dtype.kind


def _dtype_matches(value: Any, expected: Any) -> bool:
    options = expected if isinstance(expected, tuple | list) else (expected,)
    name, kind = _dtype_name(value), _dtype_kind(value)
    for option in options:
        if isinstance(option, str) and option in _KINDS:
            if kind in _KINDS[option]:
                return True
            continue
        if isinstance(option, torch.dtype):
            want = str(option).removeprefix("torch.")
        elif isinstance(option, str) and option.startswith("torch."):
            want = option.removeprefix("torch.")
        else:
            want = np.dtype(option).name
        if name == want:
            return True
    return False


def _as_numpy(value: Any) -> np.ndarray:
    """A numpy view (or CPU copy) for the value rules; float types numpy lacks become float32."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype in (torch.bfloat16, torch.float16) or (
            t.dtype.is_floating_point and t.element_size() == 1
        ):
            t = t.float()
        return t.numpy()
    return np.asarray(value)


def _check_array(
    field: Any, rules: Mapping[str, Any], value: Any, row_offset: int, whole: bool
) -> None:
    # `whole`: value is the batch (dim 0 = rows). Otherwise value is one row
    # of a list field and every offending element is in row `row_offset`.
    row_of_whole = None if whole else row_offset
    if not _is_array(value):
        if isinstance(value, int | float | bool) or (
            isinstance(value, list | tuple) and all(isinstance(v, int | float) for v in value)
        ):
            value = np.asarray(value)
        else:
            raise ValidationError(
                field, "type", f"is a {type(value).__name__}, not a tensor or array", row_of_whole
            )
    shape = tuple(value.shape)
    if "shape" in rules:
        want = tuple(rules["shape"])
        ok = len(want) == len(shape) and all(
            w is None or w == s for w, s in zip(want, shape, strict=True)
        )
        if not ok:
            shown = tuple("*" if w is None else w for w in want)
            raise ValidationError(
                field, "shape", f"shape {shape} does not match {shown}", row_of_whole
            )
    if "dtype" in rules and not _dtype_matches(value, rules["dtype"]):
        raise ValidationError(
            field,
            "dtype",
            f"dtype {_dtype_name(value)} is not {rules['dtype']!r}",
            row_of_whole,
        )
    value_rules = [r for r in ("finite", "min", "max", "ids") if r in rules]
    if not value_rules:
        return
    a = _as_numpy(value)
    rows = a.reshape(1, -1) if (not whole or a.ndim == 0) else a.reshape(a.shape[0], -1)
    for rule in value_rules:
        if rule == "finite":
            if not rules["finite"] or a.dtype.kind not in "fc":
                continue
            bad = ~np.isfinite(rows)
            detail = "value {} is not finite"
        elif rule == "min":
            bad = rows < rules["min"]
            detail = "value {} < min " + str(rules["min"])
        elif rule == "max":
            bad = rows > rules["max"]
            detail = "value {} > max " + str(rules["max"])
        else:
            n = int(rules["ids"])
            if a.dtype.kind not in "iu":
                raise ValidationError(
                    field,
                    "ids",
                    f"ids must be integers, dtype is {_dtype_name(value)}",
                    row_of_whole,
                )
            bad = (rows < 0) | (rows >= n)
            detail = "id {} is outside [0, " + str(n) + ")"
        if bad.any():
            r = int(np.argmax(bad.any(axis=1)))
            item = rows[r][np.argmax(bad[r])].item()
            row = r + row_offset if whole else row_offset
            raise ValidationError(field, rule, detail.format(_show(item)), row, item)


def _show(x: Any) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return repr(x)
