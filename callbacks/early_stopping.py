"""`EarlyStopping`: stop ``fit`` when a monitored metric stops improving, on every process at the same step."""

from __future__ import annotations

import math
import warnings
from enum import Enum
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView
from engine.keywords import suggest_keywords


class EarlyStoppingReason(Enum):
    """Why ``EarlyStopping`` stopped the run (``early_stopping.stopping_reason``); Lightning's names and values.

    Example:
        >>> EarlyStoppingReason(3)
        <EarlyStoppingReason.PATIENCE_EXHAUSTED: 3>
    """

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


@suggest_keywords
class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks.

    Each process decides from its own ``trainer.callback_metrics`` (the reduced value for metrics logged with
    ``sync_dist=True``); a stop decided on any process sets ``trainer.should_stop``, which goes through the
    engine's trigger, so every process stops at the same step.

    Args:
        monitor: the metric name, as logged.
        min_delta: the smallest change that counts as an improvement (>= 0; its direction follows ``mode``).
        patience: checks without improvement before stopping.
        mode: ``"min"`` (lower is better) or ``"max"``.
        strict: raise when ``monitor`` is missing at a check (else warn once and skip the check).
        check_finite: stop when the metric becomes NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this.
        divergence_threshold: stop as soon as the metric is worse than this.
        check_on_train_epoch_end: check at the training epoch's end (``True``) or after each validation run
            (``False``); ``None``: at the epoch end when validation runs once per epoch or not at all.
        log_rank_zero_only: with ``verbose``, print the messages on global rank 0 only.

    After a stop, ``stopping_reason`` says why (an ``EarlyStoppingReason``; ``NOT_STOPPED`` otherwise),
    ``stopping_reason_message`` in words, and ``stopped_epoch`` when; all three are saved in checkpoints.

    Example:
        >>> stop = EarlyStopping(monitor="val/loss", patience=2)
        >>> [stop._evaluate(v)[0] for v in (1.0, 0.5, 0.6, 0.55)]
        [False, False, False, True]
        >>> stop.stopping_reason
        <EarlyStoppingReason.PATIENCE_EXHAUSTED: 3>
    """

    epoch_end_after_module = True  # it ranks / compares what the module logged at the epoch end

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"EarlyStopping(monitor=...) must be a logged metric name. Received: {monitor!r}.")
        if mode not in ("min", "max"):
            raise MisconfigurationException(f"EarlyStopping(mode={mode!r}): `mode` can be min, max, got {mode}. "
                                            "Pass mode='min' (lower is better) or mode='max'.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping(patience=...) must be an int >= 0. Received: {patience!r}.")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or min_delta < 0:
            raise ValueError(f"EarlyStopping(min_delta=...) must be a number >= 0 (mode={mode!r} sets the direction). "
                             f"Received: {min_delta!r}.")
        for name, value in (("stopping_threshold", stopping_threshold), ("divergence_threshold", divergence_threshold)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"EarlyStopping({name}=...) must be a number or None. Received: {value!r}.")
        self.monitor = monitor
        self.min_delta = float(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self._fitting = False
        self._check_at_epoch_end = False
        self._warned_missing = False
        self._restored_stop = False  # set by load_state_dict: the checkpoint was written after this stopped the run

    @property
    def state_key(self) -> str:
        # The class's own name, as Lightning's (a subclass saves under its name).
        return f"{type(self).__qualname__}{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        self._fitting = stage == "fit" and not trainer.fast_dev_run  # as Lightning: no checks in fast_dev_run
        if self.check_on_train_epoch_end is not None:
            self._check_at_epoch_end = self.check_on_train_epoch_end
        else:
            interval = trainer.val_check_interval
            once_per_epoch = isinstance(interval, float) and interval == 1.0 and trainer.check_val_every_n_epoch == 1
            self._check_at_epoch_end = once_per_epoch or not trainer.num_val_batches  # no validation loaders

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._fitting and not trainer.sanity_checking and not self._check_at_epoch_end:
            self._run_early_stopping_check(trainer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._fitting and self._check_at_epoch_end:
            self._run_early_stopping_check(trainer)

    def _run_early_stopping_check(self, trainer: TrainerView) -> None:
        """One check of the monitored metric (Lightning's name: subclasses written for it override this)."""
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (f"EarlyStopping(monitor={self.monitor!r}) found no such metric. Logged metrics: "
                       f"{sorted(metrics)}. Log it with self.log({self.monitor!r}, ...) or change monitor")
            if self.strict:
                raise RuntimeError(message + " (or pass strict=False to skip checks without it).")
            if not self._warned_missing:
                self._warned_missing = True
                warnings.warn(message + "; skipping the check.", UserWarning, stacklevel=2)
            return
        value = metrics[self.monitor]
        current = float(value.item() if isinstance(value, torch.Tensor) else value)
        stop, reason = self._evaluate(current)
        if stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
            trainer.should_stop = True  # through the engine's trigger: every process stops at the same step
        if reason and self.verbose and (trainer.is_global_zero or not self.log_rank_zero_only):
            print(f"[rank {trainer.global_rank}] EarlyStopping: {reason}")

    def _evaluate(self, current: float) -> tuple[bool, str | None]:
        """(stop?, why) for the metric's new value; updates ``best_score``, ``wait_count`` and
        ``stopping_reason``. The messages hold Lightning's phrases, so a log search written for it still finds them."""
        better = (lambda a, b: a < b) if self.mode == "min" else (lambda a, b: a > b)
        delta = -self.min_delta if self.mode == "min" else self.min_delta
        best = self.best_score
        if self.check_finite and not math.isfinite(current):
            return self._stop(EarlyStoppingReason.NON_FINITE_METRIC, f"Monitored metric {self.monitor} = {current} "
                              f"is not finite. Previous best value was {best:.3f}. Signaling Trainer to stop.")
        if self.stopping_threshold is not None and better(current, self.stopping_threshold):
            sign = "<" if self.mode == "min" else ">"
            return self._stop(EarlyStoppingReason.STOPPING_THRESHOLD, f"Stopping threshold reached: {self.monitor} = "
                              f"{current} {sign} {self.stopping_threshold}. Signaling Trainer to stop.")
        if self.divergence_threshold is not None and better(self.divergence_threshold, current):
            sign = ">" if self.mode == "min" else "<"
            return self._stop(EarlyStoppingReason.DIVERGENCE_THRESHOLD, f"Divergence threshold reached: "
                              f"{self.monitor} = {current} {sign} {self.divergence_threshold}. Signaling Trainer "
                              "to stop.")
        if better(current, best + delta) and math.isfinite(current):
            self.best_score, self.wait_count = current, 0
            if not math.isfinite(best):
                return False, f"Metric {self.monitor} improved. New best score: {current:.3f}"
            return False, (f"Metric {self.monitor} improved by {abs(best - current):.3f} >= min_delta = "
                           f"{self.min_delta}. New best score: {current:.3f}")
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return self._stop(EarlyStoppingReason.PATIENCE_EXHAUSTED, f"Monitored metric {self.monitor} did not "
                              f"improve in the last {self.wait_count} records. Best score: {best:.3f}. Signaling "
                              "Trainer to stop.")
        return False, None

    def _stop(self, reason: EarlyStoppingReason, message: str) -> tuple[bool, str]:
        self.stopping_reason = reason
        return True, message

    def state_dict(self) -> dict[str, Any]:
        # best_score as a tensor, as Lightning keeps it (its EarlyStopping reads an Ember .ckpt's state); float64:
        # the very value, so a resume compares as the run did.
        best = torch.tensor(self.best_score, dtype=torch.float64)
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": best,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = int(state_dict["wait_count"])
        self.stopped_epoch = int(state_dict["stopped_epoch"])
        self.best_score = float(state_dict["best_score"])
        self.patience = int(state_dict["patience"])
        # Checkpoints written before the reason was recorded have neither key: not stopped.
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", 0))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")
        self._restored_stop = self.stopping_reason is not EarlyStoppingReason.NOT_STOPPED

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        # A fit resumed from a checkpoint written after this callback stopped the run continues a finished run:
        # the uninterrupted one ended there, so this one stops before its first batch too (Lightning trains on
        # until the next check stops it again: one more epoch, a run that is no longer the one it resumed).
        restored, self._restored_stop = self._restored_stop, False
        if restored and self._fitting:
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"EarlyStopping stopped this run at epoch {self.stopped_epoch} ({self.stopping_reason_message}); "
                      "the resumed fit has nothing to train. To train further anyway, resume without this "
                      "EarlyStopping (or with one of another monitor or mode).")
