"""The rich parts of ``RichProgressBar``: its ``Progress`` and columns. This module imports ``rich``; the bar
imports it on first use (``callbacks.rich_progress``), so that ``import callbacks`` works without rich.

Tasks whose length is unknown (an iterable dataset) have ``total=None``: rich draws them as a pulsing bar with no
time left, and ``BatchesProcessedColumn`` shows ``--`` for the total.
"""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Any

from rich.console import RenderableType
from rich.live import Live, _RefreshThread
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID
from rich.style import Style
from rich.text import Text

# Lightning's name for the bar column; rich's own ``BarColumn`` already pulses while a task's total is unknown.
CustomBarColumn = BarColumn


class _WantedRefreshThread(_RefreshThread):
    """Redraws the live display at most ``refresh_per_second`` times a second, and only after a change was
    signalled: rich's own thread redraws every tick, which at Lightning's default of 100 a second costs a core's
    share even when nothing moved (and renders the table on every tick when the output is a file). A subclass of
    rich's thread, so ``Live`` stops it as its own."""

    def __init__(self, live: Live, refresh_per_second: float) -> None:
        super().__init__(live, refresh_per_second)
        self.wanted = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1 / self.refresh_per_second):
            if self.wanted.is_set():
                self.wanted.clear()
                with self.live._lock:
                    if not self.done.is_set():
                        self.live.refresh()


class CustomProgress(Progress):
    """rich's ``Progress`` that takes an infinite total (a loader without a length) and redraws only when told
    (``soft_refresh``), from its own thread."""

    def start(self) -> None:
        if not self.live.auto_refresh:
            super().start()
            return
        # Start the live display without rich's every-tick thread, then give it ours (Live.stop stops it).
        self.live.auto_refresh = False
        super().start()
        self.live.auto_refresh = True
        thread = _WantedRefreshThread(self.live, self.live.refresh_per_second)
        self.live._refresh_thread = thread
        thread.start()

    def stop(self) -> None:
        thread = self.live._refresh_thread
        super().stop()
        if thread is not None:  # stopped here too (idempotent); joined so no redraw follows the final one
            thread.stop()
            thread.join()

    def soft_refresh(self) -> None:
        """Ask the refresh thread to redraw at its next tick (a redraw now when there is no thread)."""
        thread = self.live._refresh_thread
        if isinstance(thread, _WantedRefreshThread):
            thread.wanted.set()
        else:
            self.refresh()

    def add_task(self, description: str, start: bool = True, total: float | None = 100.0, completed: int = 0,
                 visible: bool = True, **fields: Any) -> TaskID:
        if total is not None and not math.isfinite(total):
            total = None  # rich's "unknown length": a pulsing bar, no estimate of the time left
        return super().add_task(description, start=start, total=total, completed=completed, visible=visible,
                                **fields)


class CustomTimeColumn(ProgressColumn):
    """Elapsed and remaining time, ``0:00:04 • 0:00:12`` (``-:--:--`` when unknown)."""

    max_refresh = 0.5  # redrawn twice a second at most, so the seconds do not jitter

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        remaining = task.time_remaining
        shown = ["-:--:--" if t is None else str(timedelta(seconds=int(t))) for t in (elapsed, remaining)]
        return Text(" • ".join(shown), style=self.style)


class BatchesProcessedColumn(ProgressColumn):
    """Batches done of the total, ``3/10`` (``3/--`` when the length is unknown)."""

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    def render(self, task: Task) -> RenderableType:
        total = "--" if task.total is None or not math.isfinite(task.total) else task.total
        return Text(f"{int(task.completed)}/{total}", style=self.style)


class ProcessingSpeedColumn(ProgressColumn):
    """Batches per second, ``12.34it/s``."""

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    def render(self, task: Task) -> RenderableType:
        speed = task.speed
        return Text(f"{0.0 if speed is None else speed:.2f}it/s", style=self.style)


class MetricsTextColumn(ProgressColumn):
    """The bar's metrics (``name: value`` pairs), shown on the training bar only.

    The bar hands the metrics over with ``update`` in its hooks; ``render`` runs in rich's refresh thread and only
    reads them, so drawing never reads the trainer's (device) values itself.
    """

    def __init__(self, style: str | Style, text_delimiter: str, metrics_format: str) -> None:
        self._style = style
        self._text_delimiter = text_delimiter
        self._metrics_format = metrics_format
        self._metrics: dict[str, Any] = {}
        self.train_task_id: TaskID | None = None  # set by the bar when it adds its training task
        super().__init__()

    def update(self, metrics: dict[str, Any]) -> None:
        self._metrics = dict(metrics)

    def render(self, task: Task) -> Text:
        if self.train_task_id is None or task.id != self.train_task_id:
            return Text()
        pairs = (f"{name}: {self._format(value)}" for name, value in self._metrics.items())
        return Text(self._text_delimiter.join(pairs), justify="left", style=self._style)

    def _format(self, value: Any) -> str:
        if isinstance(value, str):
            return value
        try:
            return f"{value:{self._metrics_format}}"
        except (TypeError, ValueError):  # not a number (a dict, a version): as it prints
            return str(value)
