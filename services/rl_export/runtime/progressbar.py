"""Progress bars for long command-line work: tqdm on stderr, drawn only when it is a terminal.

``bar(label, total=None, unit="lines")`` returns a tqdm bar (disabled, and silent, when stderr
is not a terminal, so pipes and logs stay clean). ``bar.update`` is the ``progress(n)``
callback ``produce`` and ``replay`` take; :func:`position_callback` turns a bar into the
``progress(done, total)`` callback of exports and stats.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tqdm import tqdm


def bar(label: str, total: int | None = None, unit: str = "lines") -> tqdm[Any]:
    """A progress bar on stderr, disabled unless stderr is a terminal."""
    return tqdm(
        total=total,
        desc=label,
        unit=unit,
        unit_scale=True,
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        dynamic_ncols=True,
        leave=True,
    )


def position_callback(progress: tqdm[Any]) -> Callable[[int, int | None], None]:
    """``progress(done, total)``: moves the bar to ``done`` and sets its total once known."""

    def update(done: int, total: int | None) -> None:
        if total is not None and progress.total != total:
            progress.total = total
            progress.refresh()
        if done > progress.n:
            progress.update(done - progress.n)

    return update
