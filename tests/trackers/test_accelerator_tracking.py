"""The Accelerator's tracking API end to end: one process, and two gloo processes where only rank 0 writes."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from engine import Accelerator, ProjectConfiguration
from trackers import CSVTracker, GeneralTracker


def _csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_single_process_init_log_get_end(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True, log_with=["csv", "tensorboard"], project_dir=tmp_path)
    accelerator.init_trackers("proj", config={"lr": 0.5, "model": {"width": 8}})
    for step in range(3):
        accelerator.log({"loss": torch.tensor(1.0 / 2 ** step), "lr": 0.5}, step=step)
    assert [t.name for t in accelerator.trackers] == ["csv", "tensorboard"]
    assert isinstance(accelerator.get_tracker("csv"), CSVTracker)
    writer = accelerator.get_tracker("tensorboard", unwrap=True)
    assert type(writer).__name__ == "SummaryWriter"
    with pytest.raises(ValueError, match=r"'wandb' is not an available tracker"):
        accelerator.get_tracker("wandb")
    accelerator.end_training()

    assert _csv_rows(tmp_path / "proj" / "version_0" / "metrics.csv") == [
        ["step", "loss", "lr"], ["0", "1.0", "0.5"], ["1", "0.5", "0.5"], ["2", "0.25", "0.5"]]
    events = EventAccumulator(str(tmp_path / "proj"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    # As Accelerate's add_hparams: the configuration in a sub-run named by the time, hparams.yml in another.
    sub_runs = sorted(p for p in (tmp_path / "proj").iterdir() if p.name[0].isdigit())
    hparams = EventAccumulator(str(sub_runs[0]))
    hparams.Reload()
    assert "_hparams_/session_start_info" in hparams.PluginTagToContent("hparams")
    assert [p.name for p in sub_runs[1].iterdir()] == ["hparams.yml"]


def test_logging_dir_checks_happen_in_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['tensorboard'\] requires a logging directory.*project_dir=..."):
        Accelerator(cpu=True, log_with="tensorboard")
    with pytest.raises(ValueError, match=r"Unknown tracker 'tensorbord'"):
        Accelerator(cpu=True, log_with="tensorbord", project_dir=tmp_path)
    # ProjectConfiguration(logging_dir=...) decides where trackers write.
    accelerator = Accelerator(cpu=True, log_with="csv",
                              project_config=ProjectConfiguration(project_dir=str(tmp_path / "p"),
                                                                  logging_dir=str(tmp_path / "logs")))
    accelerator.init_trackers("proj")
    accelerator.log({"x": 1}, step=0)
    accelerator.end_training()
    assert _csv_rows(tmp_path / "logs" / "proj" / "version_0" / "metrics.csv") == [["step", "x"], ["0", "1"]]


def _two_ranks(root: str) -> dict[str, Any]:
    """Both ranks configure csv + tensorboard; rank 0 must be the only writer."""
    accelerator = Accelerator(cpu=True, log_with=["csv", "tensorboard"], project_dir=root)
    rank = accelerator.process_index
    accelerator.init_trackers("proj", config={"lr": 0.1})
    accelerator.log({"loss": torch.tensor(float(rank + 1)), "rank": rank}, step=0)
    accelerator.log({"loss": torch.tensor(float(rank + 1) / 2)}, step=1)
    result: dict[str, Any] = {"rank": rank, "trackers": [t.name for t in accelerator.trackers]}
    if rank == 0:
        result["csv_type"] = type(accelerator.get_tracker("csv")).__name__
        try:
            accelerator.get_tracker("wandb")
        except ValueError as exc:
            result["error"] = str(exc)
    else:
        blanks = [accelerator.get_tracker(name, unwrap=unwrap) for name in ("csv", "tensorboard", "nope")
                  for unwrap in (False, True)]
        result["blank"] = all(type(b) is GeneralTracker and b.tracker is None for b in blanks)
        try:
            accelerator.log({"loss": [1.0]}, step=2)  # bad values fail on the rank that does not log, too
        except TypeError as exc:
            result["error"] = str(exc)
    accelerator.end_training()
    return result


def test_two_processes_only_rank0_writes(tmp_path: Path, run_distributed: Callable[..., list[Any]]) -> None:
    rank0, rank1 = run_distributed(_two_ranks, 2, str(tmp_path))
    assert rank0["trackers"] == ["csv", "tensorboard"] and rank0["csv_type"] == "CSVTracker"
    assert "'wandb' is not an available tracker" in rank0["error"]
    assert rank1["trackers"] == [] and rank1["blank"] is True
    assert "Cannot log 'loss'" in rank1["error"]

    # One run folder, one event file (and Accelerate's two timestamped hparams folders), rank 0's values only.
    *times, events, csv_folder = sorted(p.name for p in (tmp_path / "proj").iterdir())
    assert events.startswith("events.out.tfevents.") and csv_folder == "version_0" and len(times) == 2, times
    assert _csv_rows(tmp_path / "proj" / "version_0" / "metrics.csv") == [
        ["step", "loss", "rank"], ["0", "1.0", "0"], ["1", "0.5", ""]]
