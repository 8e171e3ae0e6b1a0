"""`MLflowTracker` against the real mlflow package, offline: a file store in the run folder, read back as files."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from trackers import MLflowTracker


def _metric_lines(run_dir: Path, key: str) -> list[tuple[float, int]]:
    # The file store writes one "timestamp value step" line per logged point to metrics/<key>.
    lines = (run_dir / "metrics" / key).read_text().split("\n")
    return [(float(line.split()[1]), int(line.split()[2])) for line in lines if line.strip()]


def test_file_store_metrics_params_tags_status_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    tracker = MLflowTracker("proj", tmp_path, mlflow_run_name="first", tags={"team": "ember"})
    assert tracker.tracker is None and tracker.store_uri == "file:" + str(tmp_path / "mlruns")
    tracker.start()
    tracker.store_init_configuration({"lr": 0.1, "model": {"width": 64}})
    tracker.log({"loss": 1.5, "val/acc": 0.25, "note": "first"}, step=0)
    tracker.log({"loss": 0.75, "bad": math.nan}, step=1)
    with pytest.warns(RuntimeWarning, match="'a:b' is logged as 'ab'"):
        tracker.log({"a:b": 2.0}, step=1)
    state = tracker.state_dict()
    tracker.finish()

    run_dir = tmp_path / "mlruns" / state["experiment_id"] / state["run_id"]
    assert _metric_lines(run_dir, "loss") == [(1.5, 0), (0.75, 1)]
    assert _metric_lines(run_dir, "val/acc") == [(0.25, 0)]
    assert math.isnan(_metric_lines(run_dir, "bad")[0][0])
    assert (run_dir / "params" / "lr").read_text() == "0.1"
    assert (run_dir / "params" / "model" / "width").read_text() == "64"
    assert (run_dir / "tags" / "note").read_text() == "first"
    assert (run_dir / "tags" / "team").read_text() == "ember"
    assert (run_dir / "tags" / "mlflow.runName").read_text() == "first"
    meta = (run_dir / "meta.yaml").read_text()
    assert "status: 3" in meta  # RunStatus.FINISHED
    assert (tmp_path / "mlruns" / state["experiment_id"] / "meta.yaml").read_text().count("name: proj") == 1

    resumed = MLflowTracker("proj", tmp_path)
    resumed.load_state_dict(state)
    resumed.start()
    assert resumed.run_id == state["run_id"] and "status: 1" in (run_dir / "meta.yaml").read_text()  # RUNNING
    resumed.log({"loss": 0.5}, step=2)
    resumed.finish()
    assert _metric_lines(run_dir, "loss")[-1] == (0.5, 2)
    # A second new run lands in the same experiment, not a new one.
    again = MLflowTracker("proj", tmp_path)
    again.start()
    assert again.experiment_id == state["experiment_id"] and again.run_id != state["run_id"]
    again.finish()


def test_misuse_errors(tmp_path: Path) -> None:
    tracker = MLflowTracker("proj", tmp_path)
    with pytest.raises(RuntimeError, match="before start"):
        tracker.log({"x": 1.0})
    with pytest.raises(ValueError, match="needs a 'run_id'"):
        tracker.load_state_dict({})
    with pytest.raises(TypeError, match="takes a dict"):
        MLflowTracker("proj", tmp_path, tags=["a"])  # type: ignore[arg-type]
    assert os.fspath(tmp_path) == tracker.logging_dir
