"""A sampler over groups of a dataset's samples whose weights follow a
per-epoch schedule (``chute.Curriculum``)."""

from __future__ import annotations

from chute.kinds.registry import DataKind, register_kind


class CurriculumKind(DataKind):
    name = "Curriculum"
    summary = "a sampler whose per-group weights follow a per-epoch schedule"


register_kind(CurriculumKind())
