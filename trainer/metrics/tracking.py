"""`TrackerLink`: starts, feeds and finishes the engine's trackers for the trainer, once per trainer, and tells the
Lightning-style logger objects it drives where each run starts and ends (their metrics at Lightning's steps); the
warning when an epoch is shorter than the logging interval."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from callbacks.warnings import PossibleUserWarning
from engine import Accelerator
from trainer.loggers.adapter import LoggerTracker, RunListener
from trainer.metrics.logger import to_python
from trainer.metrics.logger_steps import LoggerSteps, lightning_payload
from trainer.state import TrainState

_OWN_ROW: dict[str, dict[str, Any]] = {"csv": {"new_row": True}}  # CSVTracker.log's option; other trackers keep one point per name and step


class TrackerLink:
    """The trainer's side of the engine's trackers: the run configuration, metric payloads, the end.

    Trackers start at the first run that logs (never under ``fast_dev_run``) and finish once; a failed run
    finishes them too, so their files are complete. Trackers that are ``RunListener``s (a ``LoggerTracker``, which
    makes Lightning's per-run logger calls; ``LitLogger``'s) are told, on the main process, where each ``fit`` /
    ``validate`` / ``test`` starts (``run_started``) and where any run ends (``run_ended``).

    Args:
        automatic: whether the module in the run uses automatic optimisation (for Lightning's logging steps).
    """

    def __init__(self, accelerator: Accelerator, state: TrainState, project_name: str, enabled: bool,
                 autolog: bool = True, automatic: Callable[[], bool] = lambda: True) -> None:
        self.accelerator = accelerator
        self.autolog = autolog  # Lightning's enable_autolog_hparams: hyperparameters as the run configuration
        self.state = state
        self.steps = LoggerSteps(state, automatic)  # the steps the logger objects get (Lightning's)
        self.project_name = project_name
        self.enabled = enabled and bool(accelerator.log_with)
        self.started = self.finished = False
        given = accelerator.log_with if isinstance(accelerator.log_with, (list, tuple)) else [accelerator.log_with]
        self.listeners = [t for t in given if isinstance(t, RunListener)] if self.enabled else []

    def hyperparameters(self, owners: tuple[Any, ...]) -> dict[str, Any]:
        """The hyper-parameters of ``owners`` (the module and data module) that are logged, as first saved
        (``hparams_initial``: later edits to ``hparams`` are the run's, not its configuration), merged.

        Raises:
            RuntimeError: both log a name with different values (Lightning's error: neither may silently win).
        """
        config: dict[str, Any] = {}
        logged = [o for o in owners if self.autolog and o is not None and o.__dict__.get("_log_hyperparams", True)]
        for owner in logged:
            initial = owner.hparams_initial
            clashes = [key for key in config.keys() & initial.keys() if key != "_class_path"
                       and not _same_value(config[key], initial[key])]
            if clashes:
                raise RuntimeError(f"Error while merging hparams: the keys {clashes} are present in both the "
                                   f"{type(logged[0]).__name__}'s and {type(owner).__name__}'s hparams but have "
                                   "different values. Give them the same values, rename one, or pass "
                                   "save_hyperparameters(logger=False) on one of them.")
            config.update(initial)
        config.pop("_class_path", None)  # LightningCLI's own entry, never logged
        return config

    def start(self, owners: tuple[Any, ...]) -> None:
        """Start the trackers (at the first run) with the hyperparameters of ``owners`` (the module and data module)
        as config, then tell the listening trackers a run starts (a later run sends them the hyperparameters again)."""
        self.steps.run_started(str(self.state.fn))
        if not self.enabled:
            return
        config = self.hyperparameters(owners)
        sent = not self.started and bool(config)  # as the run configuration, just now
        if not self.started:
            self.accelerator.init_trackers(self.project_name, config=config or None)
            self.started = True
        if self.accelerator.is_main_process:
            for tracker in self.listeners:
                tracker.run_started(owners[0], None if sent else config)

    def run_ended(self, status: str) -> None:
        """Lightning's ``finalize(status)`` to the listening trackers at the end of every run (``"success"`` or
        ``"failed"``), on the main process; Ember's own trackers stay open for the next run."""
        if self.accelerator.is_main_process and not self.finished:
            for tracker in self.listeners:
                tracker.run_ended(status)

    def log(self, values: dict[str, Any], step: int | None = None, new_row: bool = False,
            logger_step: int | None = None) -> None:
        """Send ``values`` at ``step`` (default: the global step), with the epoch; a no-op when not running.

        ``new_row``: the values are not the training step's (a ``validate`` / ``test`` run outside ``fit``
        logs at the last training step): the csv tracker gives them a row of their own instead of adding them
        to that step's training row.

        The logger objects (``LoggerTracker``) get Lightning's payload instead, through the engine's per-tracker
        ``log_kwargs``: at ``logger_step`` as they are, or (``None``) at a logged ``"step"`` value or Lightning's
        training step with the epoch (``trainer.metrics.logger_steps``).
        """
        # Only a process that runs trackers converts the tensors (the one device sync of logging).
        if values and self.started and not self.finished and self.accelerator.trackers:
            payload = to_python(values)
            log_kwargs: dict[str, dict[str, Any]] = dict(_OWN_ROW) if new_row else {}
            loggers = [t.name for t in self.accelerator.trackers if isinstance(t, LoggerTracker)]
            if loggers:
                lightning = lightning_payload(payload, logger_step, self.steps.current(), self.state.epoch)
                log_kwargs.update({name: {"lightning": lightning} for name in loggers})
            payload.setdefault("epoch", self.state.epoch)
            self.accelerator.log(payload, step=self.state.global_step if step is None else step,
                                 log_kwargs=log_kwargs or None)

    def end_failed_run(self) -> None:
        """A run raised: ``finalize("failed")`` to the listening trackers (Lightning's call), then finish every tracker
        (even if a logger's ``finalize`` raised), so their files are complete."""
        try:
            self.run_ended("failed")
        finally:
            self.finish()

    def state_dict(self) -> dict[str, Any]:
        """The trackers' run identities, for a checkpoint (a resumed run reopens the same runs)."""
        return self.accelerator.tracker_state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Reopen the runs ``state`` names when the trackers start; a second fit keeps the runs already open."""
        if not self.started:
            self.accelerator.load_tracker_state_dict(state)

    def finish(self) -> None:
        if self.started and not self.finished:
            self.finished = True
            self.accelerator.finish_trackers()


def _same_value(first: Any, second: Any) -> bool:
    """Lightning's test of one name logged by both: same type, and equal (tensors: the same object)."""
    if type(first) is not type(second):
        return False
    if isinstance(first, torch.Tensor):
        return first is second
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 - a comparison that cannot be made counts as a clash
        return False


def warn_log_interval(num_batches: int | None, every: int, logs: bool) -> None:
    """Lightning's warning when an epoch has fewer batches than ``log_every_n_steps`` (``logs``: this process
    writes to running trackers)."""
    if logs and num_batches is not None and 0 < num_batches < every:
        warnings.warn(f"The number of training batches ({num_batches}) is smaller than the logging interval "
                      f"Trainer(log_every_n_steps={every}). Set a lower value for log_every_n_steps if you want to "
                      "see logs for the training epoch.", PossibleUserWarning, stacklevel=4)
