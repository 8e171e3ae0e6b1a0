"""`WandBTracker` offline: parse the run files wandb wrote (see wandb_reader); values, steps, config, resume.

Each ``wandb.init`` starts wandb's service process, so the assertions are grouped into one test with one fresh
run and one resumed run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.trackers.wandb_reader import find_run_files, read_run
from trackers import WandBTracker


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline, quiet wandb writing only under tmp_path (conftest restores the environment afterwards)."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                       "WANDB_CONFIG_DIR": str(tmp_path / "config"),
                       "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                       "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_DIR", raising=False)  # the tracker's logging_dir must decide where runs go
    return tmp_path / "logs"


def test_offline_run_values_config_and_resume(wandb_offline: Path) -> None:
    tracker = WandBTracker("proj", logging_dir=wandb_offline)
    tracker.start()
    tracker.store_init_configuration({"lr": 0.1, "model": {"width": 64}, "name": "mlp"})
    tracker.log({"loss": 1.5, "val/acc": 0.25, "note": "first"}, step=0)
    tracker.log({"loss": 0.75, "bad": math.nan}, step=1)
    tracker.log({"loss": 0.5}, step=2)
    state = tracker.state_dict()
    run_id = tracker.tracker.id
    tracker.finish()
    assert state == {"run_id": run_id, "project": "proj", "dir": str(wandb_offline)}

    resumed = WandBTracker("ignored_name", logging_dir=wandb_offline / "elsewhere")
    resumed.load_state_dict(state)
    resumed.start()
    assert resumed.tracker.id == run_id
    resumed.log({"loss": 0.25}, step=3)
    resumed.log({"loss": 0.125}, step=4)
    resumed.finish()

    files = find_run_files(str(wandb_offline), run_id)  # dir came from the logging_dir, and stayed on resume
    assert len(files) == 2, files
    first, second = read_run(files[0]), read_run(files[1])

    assert (first.run_id, first.project) == (run_id, "proj")
    assert first.config == {"lr": 0.1, "model": {"width": 64}, "name": "mlp"}
    assert first.steps == [0, 1, 2]
    rows = [{k: v for k, v in row.items() if k != "_step"} for row in first.history]
    assert rows[0] == {"loss": 1.5, "val/acc": 0.25, "note": "first"}
    assert math.isnan(rows[1].pop("bad"))  # a NaN is logged as NaN, not dropped
    assert rows[1] == {"loss": 0.75}
    assert rows[2] == {"loss": 0.5}

    assert (second.run_id, second.project) == (run_id, "proj")  # the same run, continued
    assert second.steps == [3, 4]
    assert [row["loss"] for row in second.history] == [0.25, 0.125]
    assert not (wandb_offline / "elsewhere").exists()
