"""``WebLoader``: torch's DataLoader with webdataset's fluent methods."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch.utils.data

from chute.wds.pystages import apply_python_stage
from chute.wds.stages import Fluent


class WebLoader(Fluent, torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """webdataset's WebLoader: torch's DataLoader with the fluent methods
    (``.batched``, ``.unbatched``, ``.shuffle``, ``.map``, ``.with_epoch``...)
    applied in Python to what it yields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stages = []
        self.epoch_items = -1

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        def repeated() -> Iterator[Any]:
            while True:
                count = 0
                for item in super(WebLoader, self).__iter__():
                    count += 1
                    yield item
                if count == 0 or self.epoch_items <= 0:
                    return

        items: Iterator[Any] = repeated()
        for stage in self.stages:
            items = apply_python_stage(stage, items, lambda n: None)
        if self.epoch_items > 0:
            items = islice(items, self.epoch_items)
        return items
