"""chute.validate_batch / validate_first_batch: each rule passes good batches
and names field, rule, row and value for bad ones."""

from __future__ import annotations

import chute
import numpy as np
import pytest
import torch

SPEC = {
    "image": {"shape": (None, 3, 4, 4), "dtype": "uint8"},
    "voxels": {"dtype": "floating", "finite": True, "min": -5, "max": 5},
    "label": {"shape": (None,), "dtype": torch.int64, "ids": 10},
    "weight": {"required": False, "min": 0},
}


def good_batch(lib: str = "torch") -> dict[str, object]:
    batch = {
        "image": np.zeros((6, 3, 4, 4), np.uint8),
        "voxels": np.linspace(-5, 5, 6 * 8, dtype=np.float32).reshape(6, 8),
        "label": np.arange(6, dtype=np.int64),
    }
    if lib == "torch":
        return {k: torch.from_numpy(v) for k, v in batch.items()}
    return dict(batch)


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_good_batch_passes(lib):
    chute.validate_batch(good_batch(lib), SPEC)
    batch = good_batch(lib)
    batch["weight"] = np.ones(6) if lib == "numpy" else torch.ones(6)
    chute.validate_batch(batch, SPEC)


def expect(batch, spec, field, rule, row, message):
    with pytest.raises(chute.ValidationError, match=message) as info:
        chute.validate_batch(batch, spec)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.field, err.rule, err.row) == (field, rule, row)
    assert f"field {field!r}" in str(err) and f"rule {rule!r}" in str(err)
    if row is not None:
        assert f"at row {row}" in str(err)
    return err


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_each_rule_fails_with_location(lib):
    b = good_batch(lib)
    del b["label"]
    expect(b, SPEC, "label", "required", None, r"missing from the batch \(keys: \['image'")

    b = good_batch(lib)
    b["image"] = b["image"][:, :2]
    expect(
        b, SPEC, "image", "shape", None, r"shape \(6, 2, 4, 4\) does not match \('\*', 3, 4, 4\)"
    )

    b = good_batch(lib)
    b["image"] = b["image"][..., 0]
    expect(b, SPEC, "image", "shape", None, "does not match")

    b = good_batch(lib)
    b["label"] = b["label"].astype(np.int32) if lib == "numpy" else b["label"].int()
    expect(b, SPEC, "label", "dtype", None, "dtype int32 is not")

    b = good_batch(lib)
    b["voxels"][3, 2] = float("nan")
    b["voxels"][4, 0] = float("inf")
    err = expect(b, SPEC, "voxels", "finite", 3, "value nan is not finite")
    assert np.isnan(err.value)

    b = good_batch(lib)
    b["voxels"][2, 5] = -7.5
    err = expect(b, SPEC, "voxels", "min", 2, r"value -7.5 < min -5")
    assert err.value == -7.5

    b = good_batch(lib)
    b["voxels"][5, 1] = 6
    expect(b, SPEC, "voxels", "max", 5, r"value 6.0 > max 5")

    b = good_batch(lib)
    b["label"][4] = 10
    err = expect(b, SPEC, "label", "ids", 4, r"id 10 is outside \[0, 10\)")
    assert err.value == 10

    b = good_batch(lib)
    b["label"][1] = -1
    expect(b, SPEC, "label", "ids", 1, r"id -1 is outside")

    b = good_batch(lib)
    b["weight"] = np.array([1.0, 0, -2, 1, 1, 1]) if lib == "numpy" else torch.tensor([1, 0, -2.0])
    expect(b, SPEC, "weight", "min", 2, "value -2.0 < min 0")


def test_ids_needs_integers_and_dtype_forms():
    with pytest.raises(chute.ValidationError, match="ids must be integers, dtype is float32"):
        chute.validate_batch({"y": torch.zeros(3)}, {"y": {"ids": 5}})
    ok = {"x": torch.zeros(2, dtype=torch.bfloat16)}
    chute.validate_batch(ok, {"x": {"dtype": (torch.float32, torch.bfloat16), "finite": True}})
    chute.validate_batch(ok, {"x": {"dtype": "torch.bfloat16", "max": 0}})
    chute.validate_batch({"x": np.zeros(2, np.uint8)}, {"x": {"dtype": "integer"}})
    chute.validate_batch({"x": np.zeros(2, bool)}, {"x": {"dtype": np.bool_}})
    with pytest.raises(chute.ValidationError, match="rule 'dtype'"):
        chute.validate_batch({"x": np.zeros(2, np.uint8)}, {"x": {"dtype": "floating"}})
    # Integer rows never fail `finite`.
    chute.validate_batch({"x": torch.arange(3)}, {"x": {"finite": True}})


def test_tuple_batches_by_position():
    batch = (torch.zeros(4, 2), torch.tensor([0, 1, 2, 7]))
    spec = {0: {"shape": (4, 2)}, 1: {"ids": 8}}
    chute.validate_batch(batch, spec)
    chute.validate_batch(list(batch), spec)
    expect(batch, {1: {"ids": 7}}, 1, "ids", 3, "id 7")
    expect(batch, {2: {}}, 2, "required", None, "2 positions")
    chute.validate_batch(batch, {2: {"required": False, "ids": 1}})


def test_list_field_is_checked_row_by_row():
    batch = {"tokens": [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 99, 5])]}
    chute.validate_batch(batch, {"tokens": {"ids": 100, "shape": (None,)}})
    err = expect(batch, {"tokens": {"ids": 50}}, "tokens", "ids", 2, "id 99")
    assert err.value == 99
    expect(batch, {"tokens": {"shape": (2,)}}, "tokens", "shape", 1, r"shape \(1,\)")


def test_spec_errors():
    with pytest.raises(TypeError, match=r"unknown rule\(s\) \['maximum'\]"):
        chute.validate_batch({"x": torch.zeros(1)}, {"x": {"maximum": 1}})
    with pytest.raises(TypeError, match="must be a dict, tuple or list"):
        chute.validate_batch(torch.zeros(1), {"x": {}})
    with pytest.raises(chute.ValidationError, match="rule 'type'"):
        chute.validate_batch({"x": "text"}, {"x": {"min": 0}})


def test_validate_first_batch_on_a_chute_loader():
    ds = chute.ArrayDataset(
        x=np.arange(20, dtype=np.float32).reshape(10, 2), y=np.arange(10, dtype=np.int64)
    )
    loader = chute.DataLoader(ds, batch_size=4)
    batch = chute.validate_first_batch(loader, {"x": {"shape": (None, 2)}, "y": {"ids": 10}})
    assert batch["y"].tolist() == [0, 1, 2, 3]
    assert len(list(loader)) == 3  # the probe did not consume the loader
    with pytest.raises(chute.ValidationError) as info:
        chute.validate_first_batch(loader, {"y": {"max": 2}})
    assert (info.value.rule, info.value.row, info.value.value) == ("max", 3, 3)
    with pytest.raises(chute.ValidationError, match="no batch"):
        chute.validate_first_batch([], {})
