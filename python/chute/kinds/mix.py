"""Weighted mixes of other datasets (``chute.mix``): per sample for
map-style sources (a ``MixedDataset`` that orders its own samples), per
batch for streams and ``TarDataset``s (a ``MixedStream``)."""

from __future__ import annotations

from chute.kinds.registry import DataKind, register_kind


class MixKind(DataKind):
    name = "mix"
    summary = "weighted mixes of other datasets with exact ratios, per sample or per batch"


register_kind(MixKind())
