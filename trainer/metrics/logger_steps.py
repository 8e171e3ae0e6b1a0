"""`LoggerSteps`: the steps Lightning's Trainer passes to ``logger.log_metrics``, and its payloads.

Ember's own trackers (``log_with=``) log at the optimizer-step count after the step. Lightning's loggers are called
at other steps, which code written for Lightning relies on (a ``log_metrics`` mock, a dashboard's x axis):

- training values (each step's, each epoch's, a callback's) at ``_batches_that_stepped``: the batches that
  ended an accumulation window (every batch under manual optimisation) *before* the current one; it moves on when
  the next batch starts (so a batch's values, a validation inside the epoch and the epoch's values share a step),
  and between epochs and after ``fit`` it is the count itself;
- each evaluation batch's values at that loader's batch count in the loop (``fit``'s validation counts on over
  the epochs of one ``fit`` call; each ``validate`` / ``test`` starts at 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.state import TrainState


class LoggerSteps:
    """Lightning's logging steps for one trainer (see the module).

    Args:
        state: the trainer's state (its ``global_step`` / ``micro_step`` / ``epoch``).
        automatic: whether the module in the run uses automatic optimisation (asked each time: a trainer runs
            several modules).

    Example:
        >>> state = TrainState(stage="train")
        >>> steps = LoggerSteps(state, lambda: True)
        >>> steps.batch_started(); state.optimizer_stepped()
        >>> steps.current(), state.global_step  # the step the batch started at, until the next one starts
        (0, 1)
        >>> steps.eval_batch("validate", 0), steps.eval_batch("validate", 0), steps.eval_batch("validate", 1)
        (0, 1, 0)
    """

    def __init__(self, state: TrainState, automatic: Callable[[], bool]) -> None:
        self.state = state
        self.automatic = automatic
        self._at_batch: tuple[int, int] | None = None  # (epoch, count when its current batch started)
        self._eval_seen: dict[tuple[str, int], int] = {}

    def stepped_batches(self) -> int:
        """Lightning's ``_batches_that_stepped`` once the current batch is done: optimizer steps (one per window),
        or batches under manual optimisation (which may step any number of optimizers per batch)."""
        return self.state.global_step if self.automatic() else self.state.micro_step

    def batch_started(self) -> None:
        """A training batch starts: its values (and what runs before the next batch) log at today's count."""
        self._at_batch = (self.state.epoch, self.stepped_batches())

    def current(self) -> int:
        """The step Lightning logs training values at now (the module)."""
        # The epoch moves on after its end hooks: from then on (the next epoch's start, after fit) the count itself.
        if self._at_batch is not None and self._at_batch[0] == self.state.epoch and self.state.stage != "idle":
            return self._at_batch[1]
        return self.stepped_batches()

    def run_started(self, fn: str) -> None:
        """A ``fit`` / ``validate`` / ``test`` starts: its evaluation loop counts its batches from 0 (``fit``'s
        validation is the ``"fit_validate"`` loop); a ``fit`` has no batch yet."""
        loop = "fit_validate" if fn == "fit" else fn
        if fn == "fit":
            self._at_batch = None
        self._eval_seen = {key: n for key, n in self._eval_seen.items() if key[0] != loop}

    def eval_batch(self, loop: str, dataloader_idx: int) -> int:
        """The step of this evaluation batch's values: the loader's batches counted before it in ``loop``."""
        seen = self._eval_seen.get((loop, dataloader_idx), 0)
        self._eval_seen[(loop, dataloader_idx)] = seen + 1
        return seen


def lightning_payload(values: dict[str, Any], step: int | None, default_step: int,
                      epoch: int) -> tuple[dict[str, Any], int]:
    """What Lightning's logger connector passes to ``log_metrics``: with no ``step``, a logged ``"step"`` value is
    the step (and leaves the metrics), else the metrics get the ``epoch`` and log at ``default_step``.

    Example:
        >>> lightning_payload({"loss": 0.5}, None, 3, epoch=1)
        ({'loss': 0.5, 'epoch': 1}, 3)
        >>> lightning_payload({"loss": 0.5, "step": 7.0}, None, 3, epoch=1)
        ({'loss': 0.5}, 7)
        >>> lightning_payload({"loss": 0.5}, 2, 3, epoch=1)
        ({'loss': 0.5}, 2)
    """
    metrics = dict(values)
    if step is not None:
        return metrics, step
    logged_step = metrics.pop("step", None)
    if logged_step is not None:
        return metrics, int(logged_step)
    metrics.setdefault("epoch", epoch)
    return metrics, default_step
