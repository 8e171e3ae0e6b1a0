"""``Trainer(max_time=...)`` shown as Lightning shows it: a ``Timer`` in ``trainer.callbacks``."""

from __future__ import annotations

from typing import Any

from callbacks import Callback, Timer
from callbacks.protocols import TrainerView
from trainer.utilities.rank_zero import rank_zero_info


class MaxTimeTimer(Timer):
    """The ``Timer`` Lightning adds for ``Trainer(max_time=...)``: it times the stages and reports
    ``time_remaining()`` against ``max_time``, but never stops training itself. The trainer's own clock
    (``StopController``) enforces ``max_time``: it counts the training time saved in checkpoints, stops every
    process at the same step and saves the resumable checkpoint; a second enforcement here could stop first,
    without that save."""

    def _check(self, trainer: TrainerView) -> None:
        return  # the trainer enforces max_time (see the class docstring)


def max_time_timer(config: Any, given: list[Callback]) -> Timer | None:
    """The ``Timer`` to add for ``config.max_time`` (seconds), or None: no limit, or a ``Timer`` was given (it keeps
    its own duration; the trainer still stops at ``max_time``, so the earlier of the two ends the run)."""
    if config.max_time is None:
        return None
    if any(isinstance(c, Timer) for c in given):
        rank_zero_info("callbacks list already contains a Timer: it stops training at its own duration; "
                       f"Trainer(max_time={config.max_time:g} s) is still enforced by the trainer, so the earlier "
                       "limit ends the run.")
        return None
    return MaxTimeTimer(duration={"seconds": config.max_time}, interval="step", verbose=False)
