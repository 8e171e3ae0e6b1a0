"""Trainers and loggers pickle, as Lightning's do: a Trainer as its keywords and counters, a logger without its
open run (the copy writes on into the same version folder)."""

from __future__ import annotations

import copy
import csv
import pickle
from typing import Any

import pytest

from callbacks import Callback, EarlyStopping
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger


@pytest.mark.parametrize("logger_class", [CSVLogger, TensorBoardLogger])
def test_a_used_logger_and_its_trainer_pickle(tmp_path: Any, logger_class: type) -> None:
    logger = logger_class(str(tmp_path))
    _ = logger.experiment  # an open run: files and locks the pickle must leave out
    logger.log_metrics({"a": 1.0})
    logger.save()
    pickle.dumps(logger)
    trainer = Trainer(max_epochs=1, logger=logger, enable_progress_bar=False)
    again = pickle.loads(pickle.dumps(trainer))
    again.logger.log_metrics({"acc": 1.0})
    assert (again.logger.name, again.logger.save_dir, again.logger.log_dir) == (logger.name, logger.save_dir,
                                                                                logger.log_dir)
    if logger_class is CSVLogger:  # the copy appended to the same metrics file
        with open(f"{logger.log_dir}/metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert [r["a"] for r in rows] == ["1.0", ""] and rows[1]["acc"] == "1.0"


def test_a_trainer_copy_keeps_its_keywords_callbacks_and_counters() -> None:
    stopper = EarlyStopping(monitor="val/loss", patience=7)
    trainer = Trainer(**{**QUIET, "max_epochs": 2, "accumulate_grad_batches": 2, "callbacks": [stopper]})
    trainer.fit(Regressor(), data(), data())
    for clone in (pickle.loads(pickle.dumps(trainer)), copy.deepcopy(trainer)):
        assert (clone.max_epochs, clone.accumulate_grad_batches) == (2, 2)
        assert (clone.global_step, clone.current_epoch) == (trainer.global_step, trainer.current_epoch) == (4, 2)
        clones = [c for c in clone.callbacks if isinstance(c, EarlyStopping)]
        assert len(clones) == 1 and clones[0] is not stopper and clones[0].patience == 7


def test_a_running_trainer_refuses_to_pickle() -> None:
    errors: list[Exception] = []

    class Pickler(Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            try:
                pickle.dumps(trainer)
            except pickle.PicklingError as error:
                errors.append(error)

    Trainer(**{**QUIET, "max_steps": 1, "callbacks": [Pickler()]}).fit(Regressor(), data())
    assert len(errors) == 1 and "between runs" in str(errors[0])
