"""`BatchCounts`: how many evaluation batches ran, per loop, for Lightning's ``batch_progress`` views.

The evaluation loop tells it when a run starts and when a batch ends; ``trainer.compat.loop_views`` reads it.
As Lightning 2.6 counts them: ``current`` is the batches of the run in progress (or the last run), ``total``
those of every run of that loop, except fit's validation, whose ``total`` counts the validation batches of the
current training epoch only (Lightning resets it when an epoch starts; the sanity check is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The loops counted: validation inside fit, validate(), test(), predict().
KEYS = ("fit_validate", "validate", "test", "predict")


@dataclass
class _Count:
    total: int = 0  # batches ended (their end hooks ran)
    current: int = 0
    running: bool = False  # a batch's step ran and its end hooks are running (Lightning: processed, not completed)
    last: bool = False
    epoch: int = 0  # fit's validation: the training epoch its total belongs to


@dataclass
class BatchCounts:
    """Evaluation batch counters per loop (``KEYS``), and ``predictions``: what the last ``predict`` returned."""

    counts: dict[str, _Count] = field(default_factory=lambda: {key: _Count() for key in KEYS})
    predictions: list[Any] = field(default_factory=list)

    def start_run(self, key: str, epoch: int) -> None:
        """A run of loop ``key`` begins (in training epoch ``epoch`` for fit's validation)."""
        count = self.counts[key]
        if key == "fit_validate" and count.epoch != epoch:
            count.total, count.epoch = 0, epoch
        count.current, count.last, count.running = 0, False, False

    def step_done(self, key: str) -> None:
        """A batch of loop ``key`` ran its step; its end hooks come next."""
        self.counts[key].running = True

    def batch_done(self, key: str) -> None:
        """A batch of loop ``key`` ended (its end hooks ran)."""
        count = self.counts[key]
        count.total += 1
        count.current += 1
        count.running = False

    def end_run(self, key: str) -> None:
        """The run of loop ``key`` drew its last batch (Lightning's ``is_last_batch``)."""
        self.counts[key].last = True

    def read(self, key: str, epoch: int | None = None) -> tuple[int, int, bool, bool]:
        """``(total, current, running, is_last_batch)`` of loop ``key`` (``running``: a batch is between its step
        and the end of its end hooks); for fit's validation, as seen in training epoch ``epoch`` (an epoch
        without validation so far has counted none in its total)."""
        if key not in self.counts:
            raise KeyError(f"BatchCounts has no loop {key!r}; expected one of {KEYS}.")
        count = self.counts[key]
        if key == "fit_validate" and epoch is not None and epoch != count.epoch:
            return 0, count.current, False, count.last
        return count.total, count.current, count.running, count.last
