"""Ember's loggers are driven through their own methods, at Lightning's steps and with Lightning's payloads.

A subclass that overrides ``log_metrics`` / ``log_hyperparams``, or a ``mock.patch`` of the class method, sees every
call Lightning 2.6 makes (steps recorded from Lightning, see tests/trainer/test_duck_loggers.py), while the
``log_with=`` trackers keep the optimizer-step count, and the logger's own files still resume exactly.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any
from unittest import mock
from unittest.mock import ANY, call

import torch

from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data
from trainer import Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger
from trainer.metrics.logger_steps import LoggerSteps
from trainer.state import TrainState

QUIET_LOGGER = {k: v for k, v in QUIET.items() if k != "log_with"}


class Recorded(TensorBoardLogger):
    """A user's subclass of a built-in logger (Lightning style: it overrides the methods it wants)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[Any, ...]] = []

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        self.calls.append(("metrics", dict(metrics), step))
        super().log_metrics(metrics, step)

    def log_hyperparams(self, params: Any = None, metrics: Any = None, step: int | None = None) -> None:
        self.calls.append(("hparams", dict(params)))
        super().log_hyperparams(params, metrics, step)


class StepLogging(Regressor):
    """Logs one value per training step and per validation batch, and one per validation epoch."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log("val/batch", float(batch_idx), on_step=True, on_epoch=False)
        self.log("val/mean", float(batch_idx), on_step=False, on_epoch=True)


def test_a_subclass_of_a_built_in_logger_gets_every_call_at_lightnings_steps(tmp_path: Path) -> None:
    logger = Recorded(tmp_path)
    trainer = Trainer(**QUIET_LOGGER, logger=logger, max_epochs=2, log_every_n_steps=1)
    trainer.fit(StepLogging(), data(n=8), data(n=8))
    assert logger.calls[:2] == [("hparams", {"lr": 0.05, "features": 3}), ("metrics", {"hp_metric": -1}, None)]
    steps = [(sorted(c[1]), c[2]) for c in logger.calls[2:]]
    assert steps == [
        (["epoch", "train/loss"], 0), (["epoch", "train/loss"], 1),
        (["val/batch"], 0), (["val/batch"], 1),  # each validation batch at its count, no epoch
        (["epoch", "val/mean"], 1),  # the epoch's values at the step its last batch started at
        (["epoch", "train/loss"], 2), (["epoch", "train/loss"], 3),
        (["val/batch"], 2), (["val/batch"], 3),  # fit's validation counts on over the epochs
        (["epoch", "val/mean"], 3),
    ]
    assert trainer.validate(StepLogging(), data(n=8), verbose=False)
    assert [(sorted(c[1]), c[2]) for c in logger.calls if c[0] == "metrics"][-3:] == [
        (["val/batch"], 0), (["val/batch"], 1), (["epoch", "val/mean"], 4)]  # a new loop; after fit: the count
    # The values reached the logger's own files through its methods.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2, 3]


def test_a_patched_log_metrics_of_the_class_sees_the_calls_and_the_trackers_keep_theirs(tmp_path: Path) -> None:
    memory = MemoryTracker()
    with mock.patch.object(CSVLogger, "log_metrics") as patched:
        trainer = Trainer(**QUIET_LOGGER, logger=CSVLogger(tmp_path), max_steps=2, log_every_n_steps=1)
        trainer.fit(Regressor(), data(n=8))
    assert patched.mock_calls == [call(metrics={"train/loss": ANY, "epoch": 0}, step=0),
                                  call(metrics={"train/loss": ANY, "epoch": 0}, step=1)]
    # log_with= trackers are fed as before: at the optimizer-step count after the step.
    Trainer(**QUIET_LOGGER, log_with=[memory], max_steps=2, log_every_n_steps=1).fit(Regressor(), data(n=8))
    assert [step for step, values in memory.rows if "train/loss" in values] == [1, 2]


def test_a_logged_step_value_is_the_loggers_step_as_in_lightning(tmp_path: Path) -> None:
    class LogsStep(Regressor):
        def on_train_epoch_end(self) -> None:
            self.log("step", 40.0)
            self.log("score", 1.0)

    logger = Recorded(tmp_path, default_hp_metric=False)
    Trainer(**QUIET_LOGGER, logger=logger, max_epochs=1, log_every_n_steps=50).fit(LogsStep(), data(n=8))
    assert [c for c in logger.calls if c[0] == "metrics"] == [("metrics", {"score": 1.0}, 40)]


def test_a_callbacks_trainer_log_metrics_reaches_the_loggers_as_lightnings_connector(tmp_path: Path) -> None:
    from callbacks import Callback

    class Reports(Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            trainer.log_metrics({"custom": 1.0})
            trainer.log_metrics({"given": 2.0}, step=7)

    logger = Recorded(tmp_path, default_hp_metric=False)
    trainer = Trainer(**QUIET_LOGGER, logger=logger, max_steps=2, log_every_n_steps=50, callbacks=[Reports()])
    trainer.fit(Regressor(), data(n=8))
    assert [(c[1], c[2]) for c in logger.calls if c[0] == "metrics"] == [
        ({"custom": 1.0, "epoch": 0}, 0), ({"given": 2.0}, 7), ({"custom": 1.0, "epoch": 0}, 1), ({"given": 2.0}, 7)]


def test_lightnings_step_counts_batches_under_manual_optimisation() -> None:
    state, automatic = TrainState(), [True]
    steps = LoggerSteps(state, lambda: automatic[0])
    steps.run_started("fit")
    state.stage = "train"
    steps.batch_started()
    state.optimizer_stepped()
    state.optimizer_stepped()  # two optimizers stepped in one batch
    state.finish_batch(0, samples=4)
    assert steps.current() == 0
    state.finish_epoch()
    assert steps.current() == 2  # automatic: the steps themselves (one per batch there)
    automatic[0] = False
    assert steps.current() == 1  # manual: Lightning counts the batch once, whatever its optimizers did


def test_finalize_success_keeps_a_run_the_trainer_holds_open_and_closes_ones_own(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="own")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert logger.tracker.tracker is None  # opened by the logger itself: closed
    held = CSVLogger(tmp_path, name="held")
    trainer = Trainer(**QUIET_LOGGER, logger=held, max_steps=2, log_every_n_steps=1)
    trainer.fit(Regressor(), data(n=8))  # finalize("success") at the end of the call
    assert held.tracker.tracker is not None
    trainer.test(Regressor(), data(n=8), verbose=False)  # same run, same file
    with open(os.path.join(held.log_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows if r["train/loss"]] == ["0", "1"] and rows[-1]["test/loss"]


def test_a_resumed_fit_continues_the_loggers_files_exactly(tmp_path: Path) -> None:
    def run(folder: Path, stop_after: int | None) -> list[dict[str, str]]:
        torch.manual_seed(0)
        logger = CSVLogger(folder, name="exp", version=0)
        trainer = Trainer(**{**QUIET_LOGGER, "enable_checkpointing": True}, logger=logger, max_epochs=2,
                          log_every_n_steps=1, default_root_dir=folder, max_steps=stop_after or -1)
        trainer.fit(Regressor(), data(n=8))
        if stop_after is not None:  # go on from its last checkpoint, in a new trainer
            torch.manual_seed(0)
            logger = CSVLogger(folder, name="exp", version=0)
            resumed = Trainer(**{**QUIET_LOGGER, "enable_checkpointing": True}, logger=logger, max_epochs=2,
                              log_every_n_steps=1, default_root_dir=folder)
            resumed.fit(Regressor(), data(n=8), ckpt_path="last")
        with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as f:
            return [{k: v for k, v in row.items() if k != "train/loss"} for row in csv.DictReader(f)]

    whole = run(tmp_path / "whole", None)
    assert run(tmp_path / "resumed", 2) == whole
    assert [r["step"] for r in whole] == ["0", "1", "2", "3"]
