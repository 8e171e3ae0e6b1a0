"""``LitLogger``: Lightning 2.6's calls into the ``litlogger`` package, against a stand-in package.

``litlogger`` is not installed here; as Lightning's own tests do (tests_pytorch/loggers/conftest.py's
``litlogger_mock``), a fake module in ``sys.modules`` records every call, and each test asserts the calls Lightning's
``LitLogger`` makes (read from its source in lightning 2.6.6, and what its tests_pytorch/loggers/test_litlogger.py
asserts).
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from tests.trainer.helpers import QUIET, Regressor, data
from trackers import LitLoggerTracker
from trainer import Trainer
from trainer.loggers import LitLogger
from trainer.loggers.neptune import NeptuneLogger

QUIET_LOGGER = {k: v for k, v in QUIET.items() if k != "log_with"}


@pytest.fixture
def litlogger(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``litlogger``: ``Experiment(...)`` returns one MagicMock whose ``experiment[key]`` is one series
    mock per key (kept in ``experiment.series``)."""
    experiment = mock.MagicMock(name="Experiment()")
    experiment.url = "https://lightning.ai/team/experiments/demo"
    experiment.name = "demo-experiment"
    experiment.series = {}
    experiment.__getitem__.side_effect = lambda key: experiment.series.setdefault(key, mock.MagicMock(name=key))
    module = types.ModuleType("litlogger")
    module.Experiment = mock.Mock(return_value=experiment)  # type: ignore[attr-defined]
    module.File = mock.Mock(name="File")  # type: ignore[attr-defined]
    module.Model = mock.Mock(name="Model")  # type: ignore[attr-defined]
    generator = types.ModuleType("litlogger.generator")
    generator._create_name = mock.Mock(return_value="generated-name")  # type: ignore[attr-defined]
    module.generator = generator  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "litlogger", module)
    monkeypatch.setitem(sys.modules, "litlogger.generator", generator)
    return module


def experiment_of(litlogger: types.ModuleType) -> Any:
    return litlogger.Experiment.return_value


def test_a_missing_litlogger_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "litlogger", None)  # what Python does for a package that cannot be imported
    with pytest.raises(ModuleNotFoundError, match=r"^LitLogger needs the `litlogger` package, which is not "
                                                  r"installed: pip install \"ember-train\[litlogger\]\"$"):
        LitLogger(name="demo")


def test_names_and_folders(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(root_dir=tmp_path, name="demo", teamspace="team", metadata={"kind": "test"})
    assert (logger.name, logger.root_dir, logger.version) == ("demo", str(tmp_path), None)
    assert logger.log_dir == logger.save_dir == os.path.join(tmp_path, "demo")
    logger._sub_dir = "sub"
    assert logger.log_dir == os.path.join(tmp_path, "demo", "sub")
    assert LitLogger(root_dir=tmp_path).name == "generated-name"  # litlogger's generator, as Lightning's
    assert not litlogger.Experiment.called  # nothing opens before it is used
    with pytest.raises(ValueError, match="litlogger keeps its logs in a local folder"):
        LitLogger(root_dir="s3://bucket/logs", name="demo")


def test_the_experiment_opens_once_with_lightnings_arguments(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(root_dir=tmp_path, name="demo", teamspace="team", metadata={"n": 1}, save_logs=False)
    experiment = logger.experiment
    assert logger.experiment is experiment and litlogger.Experiment.call_count == 1
    version = logger.version
    assert version is not None and ":" not in version and version.endswith("+00-00")  # as Lightning's (observed)
    assert litlogger.Experiment.call_args == mock.call(
        name=f"demo-{version}", teamspace="team", metadata={"n": "1"}, store_step=True, store_created_at=True,
        log_dir=os.path.join(tmp_path, "demo"), save_logs=False)
    experiment.print_url.assert_called_once_with()
    assert logger.url == "https://lightning.ai/team/experiments/demo" and os.path.isdir(logger.log_dir)


def test_metrics_are_series_points(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(root_dir=tmp_path, name="demo")
    logger.log_metrics({"loss": torch.tensor(0.25), "count": torch.tensor(3), "lr": 0.1}, step=10)
    logger.log_metrics({"loss": 0.5})  # no step: the one after the last
    series = experiment_of(litlogger).series
    assert series["loss"].append.call_args_list == [mock.call(0.25, step=10), mock.call(0.5, step=11)]
    assert series["count"].append.call_args == mock.call(3, step=10)
    assert type(series["count"].append.call_args.args[0]) is int  # an integer tensor stays an int
    logger._prefix = "train"  # Lightning's private prefix, joined with "-"
    logger.log_metrics({"loss": 1.0}, step=12)
    assert series["train-loss"].append.call_args == mock.call(1.0, step=12)


def test_hyperparameters_are_tags_as_strings(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(root_dir=tmp_path, name="demo")
    logger.log_hyperparams(argparse.Namespace(lr=0.001, batch_size=32))
    logger.log_metadata({"data": "digits"})
    assert experiment_of(litlogger).__setitem__.call_args_list == [
        mock.call("lr", "0.001"), mock.call("batch_size", "32"), mock.call("data", "digits")]
    with pytest.warns(UserWarning, match="LitLogger does not support `log_graph`"):
        logger.log_graph(torch.nn.Linear(2, 2))


def test_finalize_ends_an_opened_experiment_only(litlogger: types.ModuleType, tmp_path: Path) -> None:
    unopened = LitLogger(root_dir=tmp_path, name="never")
    unopened.finalize("success")
    assert not litlogger.Experiment.called
    logger = LitLogger(root_dir=tmp_path, name="demo")
    _ = logger.experiment
    logger.finalize("success")
    experiment_of(litlogger).finalize.assert_called_once_with("success")


def test_files_and_models(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(root_dir=tmp_path, name="demo")
    experiment = experiment_of(litlogger)
    logger.log_file("config.yaml")
    litlogger.File.assert_called_once_with("config.yaml")
    experiment.__setitem__.assert_any_call("config.yaml", litlogger.File.return_value)
    assert logger.get_file("config.yaml") is experiment.series["config.yaml"].save.return_value
    experiment.series["config.yaml"].save.assert_called_once_with("config.yaml")
    model = torch.nn.Linear(2, 2)
    logger.log_model(model, staging_dir="/tmp/stage", version="v1", metadata={"epoch": 3})
    assert litlogger.Model.call_args == mock.call(model, version="v1", metadata={"epoch": 3}, staging_dir="/tmp/stage")
    experiment.__setitem__.assert_any_call(f"demo-{logger.version}", litlogger.Model.return_value)
    logger._step = 7  # no version given: the last step logged
    logger.log_model_artifact("/models/model.ckpt")
    assert litlogger.Model.call_args == mock.call("/models/model.ckpt", version="7")


def test_a_trainer_logs_through_the_experiment(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(root_dir=tmp_path, name="demo")
    trainer = Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, max_steps=2, log_every_n_steps=1, logger=logger)
    trainer.fit(Regressor(), data(n=8))
    experiment = experiment_of(litlogger)
    assert litlogger.Experiment.call_count == 1 and trainer.logger is logger
    assert [c.kwargs["step"] for c in experiment.series["train/loss"].append.call_args_list] == [1, 2]
    assert experiment.__setitem__.call_args_list == [mock.call("lr", "0.05"), mock.call("features", "3")]
    assert not experiment.finalize.called  # the engine keeps the experiment open for the trainer's next call


def test_a_failed_fit_finalizes_the_experiment_failed(litlogger: types.ModuleType, tmp_path: Path) -> None:
    class Failing(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("boom")

    trainer = Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, max_steps=2, log_every_n_steps=1,
                      logger=LitLogger(root_dir=tmp_path, name="demo"))
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Failing(), data(n=8))
    experiment_of(litlogger).finalize.assert_called_once_with("failed")  # Lightning's finalize("failed")


def _checkpointed_fit(litlogger: types.ModuleType, tmp_path: Path, save_top_k: int) -> tuple[Any, list[Any]]:
    """A 3-epoch fit with LitLogger(log_model=True); the Model(...) uploads seen at each checkpoint save."""
    logger = LitLogger(root_dir=tmp_path, name="demo", log_model=True)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="train/loss", save_top_k=save_top_k,
                                 every_n_epochs=1)
    uploads_at_save: list[Any] = []

    class Watch(Callback):  # the uploads made by the start of each epoch (the previous epoch's save included)
        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            uploads_at_save.append(litlogger.Model.call_count)

    trainer = Trainer(**{**QUIET_LOGGER, "enable_checkpointing": True}, default_root_dir=tmp_path, max_epochs=3,
                      log_every_n_steps=1, logger=logger, callbacks=[checkpoint, Watch()])
    trainer.fit(Regressor(), data(n=4))
    return checkpoint, uploads_at_save


def test_log_model_uploads_every_checkpoint_as_written_with_save_top_k_minus_one(
        litlogger: types.ModuleType, tmp_path: Path) -> None:
    checkpoint, uploads_at_save = _checkpointed_fit(litlogger, tmp_path, save_top_k=-1)
    assert uploads_at_save == [0, 1, 2]
    uploaded = [(c.args[0], c.kwargs["version"]) for c in litlogger.Model.call_args_list]
    assert uploaded == [(p, str(step)) for p, step in zip(sorted(checkpoint.best_k_models), (1, 2, 3), strict=True)]
    experiment_of(litlogger).__setitem__.assert_any_call("demo-experiment", litlogger.Model.return_value)


def test_log_model_uploads_the_kept_checkpoints_when_the_run_ends(litlogger: types.ModuleType, tmp_path: Path) -> None:
    checkpoint, uploads_at_save = _checkpointed_fit(litlogger, tmp_path, save_top_k=1)
    # Lightning defers them (an evicted top-k checkpoint is never uploaded) to finalize; Ember to the run's end.
    assert uploads_at_save == [0, 0, 0]
    assert [c.args[0] for c in litlogger.Model.call_args_list] == [checkpoint.best_model_path]


def test_the_tracker_reopens_the_same_experiment_on_resume(litlogger: types.ModuleType, tmp_path: Path) -> None:
    first = LitLoggerTracker("demo", tmp_path)
    first.start()
    first.log({"loss": 1.0}, step=4)
    state = first.state_dict()
    again = LitLoggerTracker("demo", tmp_path)
    again.load_state_dict(state)
    again.start()
    names = [c.kwargs["name"] for c in litlogger.Experiment.call_args_list]
    assert names[0] == names[1] == f"demo-{state['version']}" and again.step == 4


def test_neptune_logger_says_it_is_gone() -> None:
    with pytest.raises(RuntimeError, match="NeptuneLogger is no longer supported"):
        NeptuneLogger()
