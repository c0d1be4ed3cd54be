"""The DataLoader's progress bar (``progress=True``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

# The bottleneck is worked out again at most this often (it reads the stats).
STATUS_SECONDS = 1.0


def with_progress(
    items: Iterator[Any], total: int | None, status: Callable[[], str] | None = None
) -> Iterator[Any]:
    """A progress bar counting batches and samples/s (tqdm when installed,
    else a line on stderr every second), and `status()` (the current
    bottleneck) once a second."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, unit="batch", dynamic_ncols=True)
        samples = 0
        start = checked = time.perf_counter()
        bound = ""
        try:
            for item in items:
                samples += _batch_rows(item)
                bar.update(1)
                now = time.perf_counter()
                if status is not None and now - checked >= STATUS_SECONDS:
                    checked = now
                    bound = status()
                postfix = {"samples_per_s": f"{samples / max(now - start, 1e-9):,.0f}"}
                if bound:
                    postfix["bound"] = bound
                bar.set_postfix(**postfix)
                yield item
        finally:
            bar.close()
        return
    # On a terminal the line is redrawn in place; elsewhere (a log file, a
    # pipe) each update is a line of its own.
    redraw = sys.stderr.isatty()
    count = samples = 0
    start = last = time.perf_counter()

    def show() -> None:
        of = f"/{total}" if total is not None else ""
        rate = samples / max(time.perf_counter() - start, 1e-9)
        line = f"chute: {count}{of} batches, {rate:,.0f} samples/s"
        bound = status() if status is not None and count else ""
        if bound:
            line += f", {bound}-bound"
        print(f"\r{line}" if redraw else line, end="" if redraw else "\n", file=sys.stderr)

    try:
        for item in items:
            count += 1
            samples += _batch_rows(item)
            now = time.perf_counter()
            if now - last >= 1.0:
                last = now
                show()
            yield item
    finally:
        # The last figures, however the iteration ended: the count the
        # epoch really reached, not the last one a second's tick showed.
        show()
        if redraw:
            print(file=sys.stderr)


def _batch_rows(batch: Any) -> int:
    """Rows in a batch: the first dimension of its first tensor or array."""
    values = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, (list, tuple))
        else [batch]
    )
    for value in values:
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
        if isinstance(value, list):
            return len(value)
    return 1
