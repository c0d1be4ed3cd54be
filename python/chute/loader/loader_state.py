"""A ``chute.DataLoader`` state's layout and its checks: the version it is
written in, whose position it holds, and what a loaded state must match
(its dataset, settings and generator) before a loader resumes from it."""

from __future__ import annotations

from typing import Any

import torch

from chute.loader.protocol import EngineDataset

# The layout of the states `DataLoader.state_dict()` writes; a state of
# another version is refused rather than read as if it were this one.
STATE_VERSION = 1


def state_kind(native: EngineDataset | None) -> str | None:
    """The tag of a loader's state dict: whose position it holds."""
    if native is None:
        return None
    return "indexed" if native.index_driven else "stream"


def check_loader_fingerprint(recorded: Any, expected: dict[str, Any]) -> None:
    """A state's ``"loader"`` record against this loader's fingerprint
    (rows, fields, batch size, drop_last, dataset, epoch order): ValueError
    naming the first that differs."""
    if recorded is None:
        raise ValueError(
            "loader state has no 'loader' record of the dataset and settings it was taken "
            "over, so it cannot be checked against this loader (a state of an older chute, "
            "or altered)"
        )
    if not isinstance(recorded, dict):
        raise ValueError(f"loader state: 'loader' must be a dict, not {recorded!r}")
    for key in ("rows", "fields", "batch_size", "drop_last"):
        if key in recorded and key in expected and recorded[key] != expected[key]:
            what = {
                "rows": "another dataset (its row count)",
                "fields": "another dataset (its fields)",
                "batch_size": "another batch size",
                "drop_last": "another drop_last",
            }[key]
            raise ValueError(
                f"loader state is from {what}: {key}={recorded[key]!r} in the state, "
                f"{expected[key]!r} in this loader"
            )
    # After the plain counts, whose messages say more than the identity's.
    if "dataset" in expected:
        check_dataset_identity(recorded.get("dataset"), expected["dataset"])
    if "epoch" in expected and recorded.get("epoch") != expected["epoch"]:
        raise ValueError(
            "loader state was taken over another order of its epoch (the sampler's sources or "
            f"groups, in order, and their weights that epoch): {recorded.get('epoch')!r} in the "
            f"state, {expected['epoch']!r} in this loader (reordered, or the weights changed)"
        )


def check_state_version(state: dict[str, Any]) -> None:
    """ValueError unless `state` was written in `STATE_VERSION`'s layout."""
    if "version" not in state:
        raise ValueError(
            "loader state has no 'version': it was not written by chute.DataLoader.state_dict() "
            f"of this chute (which writes version {STATE_VERSION})"
        )
    version = state["version"]
    if isinstance(version, bool) or version != STATE_VERSION:
        raise ValueError(
            f"loader state has version {version!r}; this chute reads version {STATE_VERSION} "
            "(the state was written by another chute, or altered)"
        )


def check_batches_within(batches: int, epoch_batches: int | None) -> None:
    """ValueError when a state is further into its epoch than the epoch is long."""
    if epoch_batches is not None and batches > epoch_batches:
        raise ValueError(
            f"loader state is {batches} batches into its epoch, but this loader's epoch has "
            f"{epoch_batches} batches: the state was taken over another dataset or sampler"
        )


def check_dataset_identity(recorded: Any, expected: dict[str, Any]) -> None:
    """A state's record of its dataset (the dataset's ``state_identity()``)
    against this loader's dataset: ValueError naming what differs."""
    if not isinstance(recorded, dict):
        raise ValueError(
            "loader state carries no identity of its dataset (its 'loader' has no 'dataset' "
            f"entry with {', '.join(map(repr, expected))}): it cannot be checked against "
            "this loader's dataset"
        )
    for key, value in expected.items():
        if recorded.get(key) != value:
            raise ValueError(
                "loader state is from another dataset (its files, arrays or sources): "
                f"the state was taken over {key} "
                f"{recorded.get(key)!r} but this loader reads {value!r}"
            )


def check_indexed_state(state: dict[str, Any], generator: torch.Generator | None) -> None:
    """An index-driven loader's state: its batch count, sampler epoch and
    generator state well formed, else ValueError."""
    batches = state.get("batches")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
        raise ValueError(f"loader state: 'batches' must be a count (an int >= 0), not {batches!r}")
    epoch = state.get("sampler_epoch")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
        raise ValueError(f"loader state: 'sampler_epoch' must be an int or None, not {epoch!r}")
    rng = state.get("rng_state")
    expected = get_rng_state(generator)
    if (
        not isinstance(rng, torch.Tensor)
        or rng.dtype != expected.dtype
        or rng.shape != expected.shape
    ):
        raise ValueError(
            "loader state: 'rng_state' must be the generator state a state_dict() recorded "
            f"(a {expected.dtype} tensor of shape {tuple(expected.shape)})"
        )


def get_rng_state(generator: torch.Generator | None) -> torch.Tensor:
    """The state of the generator the sampler draws from."""
    # Without a generator, torch's samplers seed themselves from the global RNG.
    return generator.get_state() if generator is not None else torch.get_rng_state()


def set_rng_state(generator: torch.Generator | None, state: torch.Tensor) -> None:
    """Restores what `get_rng_state` returned."""
    if generator is not None:
        generator.set_state(state)
    else:
        torch.set_rng_state(state)
