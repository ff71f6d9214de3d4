"""Progress bars for calibration: tqdm if installed, else rich, else none.

Both are optional (``pip install quanta[progress]`` brings tqdm); without
either, calibration runs silently.

>>> bar = make_bar(3, enabled=False)
>>> bar.advance(); bar.advance(); bar.count
2
>>> bar.close()
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

from torch import nn

__all__ = ["make_bar", "progress_bar"]


class _Bar:
    """Counts steps and forwards them to a tqdm or rich bar (or to nothing)."""

    def __init__(self, total: int | None, enabled: bool, desc: str, unit: str = "batch") -> None:
        self.count = 0
        self._tqdm = None
        self._rich = None
        if not enabled:
            return
        if importlib.util.find_spec("tqdm") is not None:
            from tqdm.auto import tqdm

            self._tqdm = tqdm(total=total, desc=desc, unit=unit, leave=False)
        elif importlib.util.find_spec("rich") is not None:
            from rich.progress import Progress

            self._rich = Progress(transient=True)
            self._rich.start()
            self._task = self._rich.add_task(desc, total=total)

    def advance(self) -> None:
        self.count += 1
        if self._tqdm is not None:
            self._tqdm.update(1)
        elif self._rich is not None:
            self._rich.advance(self._task)

    def set_description(self, desc: str) -> None:
        if self._tqdm is not None:
            self._tqdm.set_description(desc)
        elif self._rich is not None:
            self._rich.update(self._task, description=desc)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._rich is not None:
            self._rich.stop()


def make_bar(total: int | None, *, enabled: bool = True, desc: str = "", unit: str = "batch") -> _Bar:
    """A bar of ``total`` steps (None: unknown) counted in ``unit``; ``enabled=False`` only counts."""
    return _Bar(total, enabled, desc, unit)


@contextlib.contextmanager
def progress_bar(model: nn.Module, total: int | None, *, enabled: bool = True, desc: str = "") -> Iterator[_Bar]:
    """Advance a bar once per ``model`` forward call made inside the block."""
    bar = _Bar(total, enabled, desc)
    handle = model.register_forward_pre_hook(lambda module, args: bar.advance())
    try:
        yield bar
    finally:
        handle.remove()
        bar.close()
