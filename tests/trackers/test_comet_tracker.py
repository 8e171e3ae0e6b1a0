"""`CometMLTracker` offline: read back the archives comet_ml wrote (``messages.json``: JSON lines)."""

from __future__ import annotations

import json
import math
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

from trackers import CometMLTracker

# Comet's automatic logging (code, git, environment, stdout, argv) is slow and irrelevant here.
QUIET = {"log_code": False, "log_graph": False, "auto_param_logging": False, "auto_metric_logging": False,
         "parse_args": False, "auto_output_logging": False, "log_env_details": False,
         "log_git_metadata": False, "log_git_patch": False, "display_summary_level": 0}


@pytest.fixture
def comet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No API key, no user config: the environment of a machine where Comet was never set up."""
    monkeypatch.setenv("COMET_CONFIG", str(tmp_path / "no_such.comet.config"))
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # else comet reports errors over the network
    for name in ("COMET_API_KEY", "COMET_OFFLINE", "COMET_START_ONLINE", "COMET_OFFLINE_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "logs"


def _messages(archive: Path) -> list[dict[str, Any]]:
    with zipfile.ZipFile(archive) as zf:
        return [json.loads(line) for line in zf.read("messages.json").decode().splitlines() if line.strip()]


def _metrics(messages: list[dict[str, Any]]) -> list[tuple[str, Any, int | None]]:
    found = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    return [(m["metricName"], m["metricValue"], m["step"]) for m in found
            if m["metricName"] != "process duration"]


def _experiment_key(archive: Path) -> str:
    with zipfile.ZipFile(archive) as zf:
        return json.loads(zf.read("experiment.json"))["offline_id"]


def test_offline_archive_metrics_parameters_and_resume(comet_env: Path) -> None:
    tracker = CometMLTracker("proj", logging_dir=comet_env, **QUIET)
    with pytest.warns(UserWarning, match=r"No Comet API key is configured, so comet_ml logs offline"):
        tracker.start()
    key = tracker.tracker.get_key()
    tracker.store_init_configuration({"lr": 0.125, "layers": 3, "model": {"name": "mlp"}})
    tracker.log({"loss": 1.5, "val/acc": 0.25, "note": "first"}, step=0)
    tracker.log({"loss": 0.75, "bad": math.nan}, step=1)
    state = tracker.state_dict()
    tracker.finish()
    archive_dir = comet_env / "proj" / "comet_ml"
    assert state == {"experiment_key": key, "offline": True, "project_name": "proj",
                     "offline_directory": str(archive_dir)}

    first = archive_dir / f"{key}.zip"
    messages = _messages(first)
    assert _metrics(messages) == [("loss", 1.5, 0), ("val/acc", 0.25, 0), ("loss", 0.75, 1),
                                  ("bad", "NaN", 1)]  # NaN is logged (comet spells it "NaN"), not dropped
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"] for m in messages
              if m["type"] == "parameter_msg" and m["payload"]["param"]["source"] == "manual"}
    assert params == {"lr": 0.125, "layers": 3, "model|name": "mlp"}
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["note"] == "first"

    # Resume: the saved key reopens the same experiment (offline: a second archive for that key).
    resumed = CometMLTracker("other_name", **QUIET)
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        resumed.start()  # no "no API key" warning: the saved identity says offline
    assert resumed.tracker.get_key() == key
    resumed.log({"loss": 0.5}, step=2)
    resumed.log({"loss": 0.25}, step=3)
    resumed.finish()
    archives = sorted(archive_dir.glob("*.zip"))
    assert len(archives) == 2 and {_experiment_key(a) for a in archives} == {key}
    (second,) = [a for a in archives if a != first]
    assert _metrics(_messages(second)) == [("loss", 0.5, 2), ("loss", 0.25, 3)]


def test_offline_false_without_api_key_is_an_error(comet_env: Path) -> None:
    tracker = CometMLTracker("proj", logging_dir=comet_env, offline=False, **QUIET)
    with pytest.raises(ValueError, match=r"offline=False\) needs a Comet API key.*COMET_API_KEY"):
        tracker.start()
    with pytest.raises(TypeError, match=r"offline=\) must be True, False or None. Received: 'yes'"):
        CometMLTracker("proj", offline="yes")  # type: ignore[arg-type]


def test_comet_settings_choose_offline_and_the_archive_directory(comet_env: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMET_OFFLINE", "true")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "archives"))
    tracker = CometMLTracker("proj", logging_dir=comet_env, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tracker.start()  # offline from comet's own setting: no "no API key" warning
    tracker.log({"loss": 2.0}, step=7)
    tracker.finish()
    (archive,) = (tmp_path / "archives").glob("*.zip")
    assert _metrics(_messages(archive)) == [("loss", 2.0, 7)]
    assert not (comet_env / "proj").exists()
