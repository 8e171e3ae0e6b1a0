"""`Timer`: how long training, validation and testing took, and a training time limit (Lightning's ``Timer``)."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView

log = logging.getLogger(__name__)

_STAGES = ("train", "sanity_check", "validate", "test", "predict")
_DURATION = re.compile(r"^(\d+):(\d\d):(\d\d):(\d\d)$")


def parse_duration(duration: str | timedelta | dict[str, int] | None) -> float | None:
    """Seconds from ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of ``timedelta`` keywords (``None``: no limit).

    Example:
        >>> parse_duration("00:12:00:00"), parse_duration({"minutes": 2}), parse_duration(None)
        (43200.0, 120.0, None)
    """
    if duration is None:
        return None
    if isinstance(duration, str):
        match = _DURATION.match(duration.strip())
        if match is None:
            raise MisconfigurationException(f"`Timer(duration={duration!r})` is not a valid duration. Expected a "
                                            "string in the format DD:HH:MM:SS, e.g. '00:12:00:00' for 12 hours.")
        days, hours, minutes, seconds = (int(g) for g in match.groups())
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(duration, dict):
        duration = timedelta(**duration)
    if not isinstance(duration, timedelta):
        raise MisconfigurationException(f"Timer(duration=...) takes 'DD:HH:MM:SS', a timedelta, a dict of timedelta "
                                        f"keywords or None. Received: {duration!r}.")
    return duration.total_seconds()


class Timer(Callback):
    """Time each stage (``time_elapsed("train" | "validate" | "test")``) and stop training after ``duration``.

    The limit is checked after every training batch (``interval="step"``) or epoch (``"epoch"``), and once when
    fit starts (a resumed run whose time is already spent stops at once). The stop goes through
    ``trainer.should_stop``, so every process stops at the same step; ``min_epochs`` / ``min_steps`` still hold.
    The training time spent so far is saved in checkpoints and counted again after a resume.

    ``Trainer(max_time=...)`` is the Trainer's own clock (it also saves a checkpoint when the limit is hit); use
    this callback to read stage timings or to stop without that save.

    Args:
        duration: the training time limit: ``"DD:HH:MM:SS"``, a ``timedelta``, a dict of ``timedelta`` keywords,
            or ``None`` (no limit: only time the stages).
        interval: ``"step"`` or ``"epoch"``: when the limit is checked.
        verbose: log a line when the limit stops training.

    Example:
        >>> timer = Timer(duration="00:00:30:00", interval="epoch")
        >>> timer.time_remaining(), timer.time_elapsed("validate")
        (1800.0, 0.0)
    """

    def __init__(self, duration: str | timedelta | dict[str, int] | None = None, interval: str = "step",
                 verbose: bool = True) -> None:
        if interval not in ("step", "epoch"):
            raise MisconfigurationException(f"Unsupported parameter value `Timer(interval={interval!r})`. Possible "
                                            "choices are: 'step', 'epoch'.")
        self._duration = parse_duration(duration)
        self._interval = interval
        self._verbose = verbose
        self._start: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._end: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._offset = 0.0  # training time of the runs before a resume

    # -- reading the clocks ---------------------------------------------------------------------------------
    def start_time(self, stage: str = "train") -> float | None:
        """``time.monotonic()`` when ``stage`` last started (None: it has not run)."""
        return self._start[_stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        """``time.monotonic()`` when ``stage`` last ended (None: not yet)."""
        return self._end[_stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds ``stage`` ran in its last run (so far, while it runs); training includes earlier runs."""
        stage = _stage(stage)
        offset = self._offset if stage == "train" else 0.0
        start, end = self._start[stage], self._end[stage]
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of ``duration`` (negative once passed; None without a limit)."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # -- hooks ------------------------------------------------------------------------------------------------
    def _started(self, stage: str) -> None:
        self._start[stage], self._end[stage] = time.monotonic(), None

    def _ended(self, stage: str) -> None:
        self._end[stage] = time.monotonic()

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._started("train")

    def on_train_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._ended("train")

    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._started("validate")

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._ended("validate")

    def on_test_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._started("test")

    def on_test_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._ended("test")

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._duration is not None:  # after a resume the saved time may already be spent
            self._check(trainer)

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._interval == "step" and self._duration is not None:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._interval == "epoch" and self._duration is not None:
            self._check(trainer)

    def _check(self, trainer: TrainerView) -> None:
        assert self._duration is not None
        elapsed = self.time_elapsed()
        # Every process decides from its own clock; should_stop goes through the engine's trigger, so any one
        # process running out stops them all at the same step.
        if elapsed >= self._duration and not trainer.should_stop:
            trainer.should_stop = True
            if self._verbose and trainer.is_global_zero:
                log.info(f"Time limit reached. Elapsed time is {timedelta(seconds=int(elapsed))}. Signaling "
                         "Trainer to stop.")

    # -- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))


def _stage(stage: str) -> str:
    value = str(getattr(stage, "value", stage))
    if value not in _STAGES:
        raise ValueError(f"Timer: unknown stage {stage!r}. Use one of {list(_STAGES)}.")
    return value
