"""Lightning-named loggers as views over Ember's trackers: paths, versions, what each backend wrote, ranks."""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from engine.tracking.hub import TrackerHub
from tests.trackers.test_comet_tracker import QUIET, _messages, _metrics, comet_env  # noqa: F401 - fixture
from tests.trackers.test_wandb_tracker import wandb_offline  # noqa: F401 - fixture
from tests.trackers.wandb_reader import find_run_files, read_run
from trainer.loggers import (
    CometLogger,
    CSVLogger,
    DummyExperiment,
    Logger,
    MLFlowLogger,
    TensorBoardLogger,
    WandbLogger,
)
from trainer.utilities import rank_zero_only


def _rows(path: str) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture
def rank_one() -> Any:
    saved = rank_zero_only.rank
    rank_zero_only.rank = 1
    yield
    rank_zero_only.rank = saved


def test_csv_logger_versions_paths_and_files(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, name="exp")
    assert (first.version, first.name, first.save_dir) == (0, "exp", str(tmp_path))
    assert first.root_dir == str(tmp_path / "exp") and first.log_dir == str(tmp_path / "exp" / "version_0")
    first.log_hyperparams(argparse.Namespace(lr=0.1, depth=2))
    first.log_metrics({"loss": torch.tensor(0.5), "nested": {"acc": 1}}, step=3)
    # experiment: Lightning's ExperimentWriter (metrics_file_path, the rows since the last save).
    assert first.experiment.metrics_file_path == str(tmp_path / "exp" / "version_0" / "metrics.csv")
    assert first.experiment.metrics == [{"loss": 0.5, "nested/acc": 1, "step": 3}]
    assert sorted(os.listdir(first.log_dir)) == ["config.json", "hparams.yaml", "metrics.csv"]
    first.finalize("success")
    assert _rows(first.log_dir + "/metrics.csv") == [["step", "loss", "nested/acc"], ["3", "0.5", "1"]]
    assert json.loads(Path(first.log_dir, "config.json").read_text()) == {"lr": 0.1, "depth": 2}
    # The next logger takes the next version; a str version is the folder name itself; name="" has no folder.
    assert CSVLogger(tmp_path, name="exp").version == 1
    assert CSVLogger(tmp_path, name="exp", version="best").log_dir == str(tmp_path / "exp" / "best")
    assert CSVLogger(tmp_path, name="", version=4).log_dir == str(tmp_path / "version_4")
    # Logging after finalize reopens the same file and appends (as Lightning's logger keeps working).
    first.log_metrics({"loss": 0.25}, step=4)
    first.finalize("success")
    assert _rows(first.log_dir + "/metrics.csv")[-1] == ["4", "0.25", ""]


def test_logger_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"prefix='train'\) is not supported.*self.log\('train-loss'"):
        CSVLogger(tmp_path, prefix="train")
    with pytest.raises(ValueError, match="version=...\\) must be an int >= 0, a str, or None. Received: -1"):
        TensorBoardLogger(tmp_path, version=-1)
    with pytest.raises(ValueError, match="flush_logs_every_n_steps"):
        CSVLogger(tmp_path, flush_logs_every_n_steps=0)
    with pytest.raises(ValueError, match="log_model=True\\) is not supported"):
        WandbLogger(log_model=True)
    with pytest.raises(ValueError, match="log_model=True\\) is not supported"):
        MLFlowLogger(log_model=True, save_dir=str(tmp_path))
    with pytest.raises(ValueError, match="mode='get'.*experiment_key"):
        CometLogger(mode="get")
    with pytest.raises(TypeError, match="log_hyperparams takes a dict"):
        CSVLogger(tmp_path).log_hyperparams([1, 2])  # type: ignore[arg-type]


def test_other_ranks_get_a_dummy_experiment_and_write_nothing(tmp_path: Path, rank_one: None) -> None:
    logger = CSVLogger(tmp_path)
    assert isinstance(logger.experiment, DummyExperiment)
    logger.experiment.add_scalar("x", 1)  # any call does nothing
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_hyperparams({"lr": 1})
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.filterwarnings("ignore:`torch.jit.trace")  # add_graph traces the model: torch's own notice
def test_tensorboard_logger_writes_scalars_hparams_and_graph(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="tb", log_graph=True, sub_dir="sub")
    assert logger.log_dir == str(tmp_path / "tb" / "version_0" / "sub")
    assert type(logger.experiment).__name__ == "SummaryWriter"
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 0.5}, step=2)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)
            self.example_input_array = torch.zeros(1, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    logger.log_graph(Net())
    logger.finalize("success")
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("hp_metric")] == [(0, -1.0)]  # default_hp_metric
    assert events.Graph() is not None
    assert yaml.safe_load(Path(logger.log_dir, logger.NAME_HPARAMS_FILE).read_text()) == {"lr": 0.1}
    assert logger.hparams == {"lr": 0.1} and not Path(logger.log_dir, "hparams.json").exists()


def test_mlflow_logger_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = MLFlowLogger("exp", run_name="r", save_dir=str(tmp_path / "mlruns"), tags={"k": "v"})
    assert logger.save_dir == str(tmp_path / "mlruns")
    client = logger.experiment
    assert type(client).__name__ == "MlflowClient"
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.log_metrics({"loss": 0.25}, step=2)
    logger.finalize("success")
    run = client.get_run(logger.run_id)
    assert (logger.name, logger.version) == (run.info.experiment_id, run.info.run_id)
    assert run.data.params == {"lr": "0.1"} and run.data.tags["k"] == "v" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "loss")] == [(1, 0.5), (2, 0.25)]
    assert (tmp_path / "mlruns" / run.info.experiment_id / run.info.run_id / "metrics" / "loss").exists()


def test_wandb_logger_offline(wandb_offline: Path) -> None:  # noqa: F811
    logger = WandbLogger(name="display", project="proj", save_dir=wandb_offline, offline=True)
    assert (logger.name, logger.version, logger.save_dir) == ("proj", None, str(wandb_offline))
    run = logger.experiment
    assert logger.version == run.id and run.name == "display"
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.finalize("success")
    (path,) = find_run_files(str(wandb_offline), run.id)
    offline = read_run(path)
    assert offline.project == "proj" and offline.config == {"lr": 0.1}
    # The step as Lightning's logger gives it: the metric trainer/global_step (wandb's own step counts the calls).
    assert [(row["trainer/global_step"], row["loss"]) for row in offline.history] == [(1, 0.5)]


def test_comet_logger_offline(comet_env: Path) -> None:  # noqa: F811
    logger = CometLogger(project="proj", online=False, offline_directory=str(comet_env), **QUIET)
    assert logger.name == "proj" and logger.version is None
    key = logger.experiment.get_key()
    assert logger.version == key
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.finalize("success")
    assert _metrics(_messages(comet_env / f"{key}.zip")) == [("loss", 0.5, 1)]


class Recording(Logger):
    """A user's own Lightning-style logger: only the Logger API, no tracker."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    @property
    def name(self) -> str:
        return "recording"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("hparams", dict(params)))

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        self.calls.append(("metrics", dict(metrics), step))

    def finalize(self, status: str) -> None:
        self.calls.append(("finalize", status))


def test_a_user_logger_is_driven_through_the_engine() -> None:
    logger = Recording()
    hub = TrackerHub([logger.tracker], None, is_main_process=True)
    hub.init("proj", config={"lr": 0.1})
    hub.log({"loss": torch.tensor(0.5)}, step=1)
    hub.finish()
    assert logger.calls == [("hparams", {"lr": 0.1}), ("metrics", {"loss": 0.5}, 1), ("finalize", "success")]

    class NoMetrics(Logger):
        pass

    with pytest.raises(TypeError, match="NoMetrics is a Logger that defines no log_metrics"):
        NoMetrics().tracker  # noqa: B018


def test_a_logger_opened_early_is_not_started_twice_by_the_engine(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"early": 1.0}, step=0)  # opens the run before the engine does
    hub = TrackerHub([logger.tracker], tmp_path, is_main_process=True)
    hub.init("proj")
    hub.log({"loss": 0.5}, step=1)
    hub.finish()
    assert _rows(logger.log_dir + "/metrics.csv") == [["step", "early", "loss"], ["0", "1.0", ""], ["1", "", "0.5"]]


@pytest.mark.parametrize("name", ["CSVLogger", "TensorBoardLogger"])
def test_file_loggers_refuse_a_url_instead_of_writing_a_local_folder_named_after_it(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning writes these through fsspec; os.path made a local folder named "memory:" (or "s3:").
    from trainer import loggers

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"save_dir='memory://runs'\): Ember's file loggers write to a local folder"):
        getattr(loggers, name)(save_dir="memory://runs")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_finalizes_the_given_loggers_as_failed_once(tmp_path: Path) -> None:
    """Lightning calls every logger's finalize("failed") when a run raises; Ember's built-in loggers included
    (their finalize closes the run, which stays readable)."""
    from unittest import mock

    from tests.trainer.helpers import Regressor, data
    from trainer import Trainer

    class Fails(Regressor):
        def on_fit_start(self) -> None:
            raise RuntimeError("boom")

    logger = TensorBoardLogger(tmp_path)
    finalize = mock.Mock(wraps=logger.finalize)
    logger.finalize = finalize  # type: ignore[method-assign]
    trainer = Trainer(logger=logger, max_epochs=1, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Fails(), data())
    finalize.assert_called_once_with("failed")
    assert logger.tracker.tracker is None  # closed, and not twice


def test_default_root_dir_expands_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trainer import Trainer

    monkeypatch.setenv("HOME", str(tmp_path))
    assert Trainer(default_root_dir="~/runs", logger=False).default_root_dir == str(tmp_path / "runs")
    assert Trainer(default_root_dir=Path("~/runs"), logger=False).default_root_dir == str(tmp_path / "runs")
    assert Trainer(project_dir="~/own", logger=False).default_root_dir == str(tmp_path / "own")


def test_the_dummy_logger_takes_any_arguments() -> None:
    from trainer.loggers import DummyLogger

    logger = DummyLogger()
    logger.log_hyperparams("1", 2, three="three")  # Lightning's DummyLogger accepts anything
    logger.log_metrics("1", 2, three="three")
