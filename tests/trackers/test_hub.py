"""`engine.tracking.hub.TrackerHub`: validation of log_with, call order, ranks, get(), run identities."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from engine.tracking.hub import TrackerHub
from trackers import CSVTracker, GeneralTracker, available_trackers


class Recording(GeneralTracker):
    """Records every call it gets, in order (the hub creates it, so the record lives on the instance)."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = [("init", run_name, kwargs)]
        self.identity: dict[str, Any] = {}

    @property
    def tracker(self) -> str:
        return "the run object"

    def start(self) -> None:
        self.calls.append(("start", dict(self.identity)))

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.calls.append(("config", values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", values, step, kwargs))

    def finish(self) -> None:
        self.calls.append(("finish",))

    def state_dict(self) -> dict[str, Any]:
        return {"run": "r1"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls.append(("load_state_dict", state))
        self.identity = dict(state)


class EveryRank(Recording):
    name = "every_rank"
    main_process_only: ClassVar[bool] = False


class FailingFinish(Recording):
    name = "failing_finish"

    def finish(self) -> None:
        raise OSError("disk full")


def _csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_call_order_kwargs_and_normalised_values() -> None:
    hub = TrackerHub(Recording, None, is_main_process=True)
    hub.init("proj", config={"lr": 0.1}, init_kwargs={"recording": {"tag": "a"}, "wandb": {"entity": "x"}})
    hub.log({"loss": torch.tensor(0.5), "val": {"acc": np.float32(0.25)}}, step=np.int64(3),
            log_kwargs={"recording": {"commit": False}})
    hub.finish()
    hub.finish()  # idempotent: trackers are finished once
    (tracker,) = hub.trackers
    assert tracker.calls == [
        ("init", "proj", {"tag": "a"}),
        ("start", {}),
        ("config", {"lr": 0.1}),
        ("log", {"loss": 0.5, "val/acc": 0.25}, 3, {"commit": False}),
        ("finish",),
    ]
    assert type(tracker.calls[3][2]) is int


def test_log_with_forms_duplicates_and_all(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # "all" includes wandb only where it can run
    assert TrackerHub(None, None, True).names == []
    assert TrackerHub("csv", tmp_path, True).names == ["csv"]
    instance = Recording("mine")
    hub = TrackerHub(["csv", CSVTracker, "CSV", instance, Recording], tmp_path, True)
    assert hub.names == ["csv", "recording"]  # first of each name wins
    assert TrackerHub(["all", instance], tmp_path, True).names == [*available_trackers(), "recording"]
    assert TrackerHub("all", tmp_path, True).names == ["csv", "tensorboard", "wandb", "comet_ml", "mlflow"]
    # A user-built instance is used as it is (init_kwargs do not apply to it).
    hub = TrackerHub([instance], None, True)
    hub.init("proj")
    assert hub.trackers == [instance] and instance.calls[-1] == ("start", {})


def test_validation_errors_are_eager_and_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # "all" includes wandb only where it can run
    with pytest.raises(ValueError, match=r"Unknown tracker 'tensorbord'. Known trackers: \['csv', 'tensorb"):
        TrackerHub(["csv", "tensorbord"], "/tmp", True)
    with pytest.raises(ValueError, match=r"Logging with \['csv', 'tensorboard'\] requires a logging "
                                         r"directory.*pass `project_dir=...`"):
        TrackerHub(["csv", "tensorboard", "wandb"], None, True)
    # As Accelerate, "all" makes no directory check: without one it leaves out the trackers that need one.
    assert TrackerHub("all", None, True).names == [n for n in available_trackers() if n not in ("csv", "tensorboard")]
    with pytest.raises(TypeError, match=r"log_with entries must be tracker names, GeneralTracker "
                                        r"subclasses or instances. Received: 3 \(int\)"):
        TrackerHub(["csv", 3], "/tmp", True)
    hub = TrackerHub(Recording, None, True)
    with pytest.raises(ValueError, match=r"init_kwargs has an entry for 'recordin', which is not a tracker"):
        hub.init("proj", init_kwargs={"recordin": {}})
    with pytest.raises(ValueError, match=r"non-empty project_name"):
        hub.init("")


def test_log_misuse() -> None:
    TrackerHub(None, None, True).log({"loss": 1.0}, step=0)  # no trackers configured: a no-op (Accelerate)
    hub = TrackerHub(Recording, None, True)
    with pytest.raises(RuntimeError, match=r"log\(\) before init_trackers\(\): trackers \['recording'\]"):
        hub.log({"loss": 1.0})
    hub.init("proj")
    with pytest.raises(TypeError, match=r"step must be an int .* Received: '3' \(str\)"):
        hub.log({"loss": 1.0}, step="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"step must be an int .* Received: 1.5 \(float\)"):
        hub.log({"loss": 1.0}, step=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Cannot log 'loss'"):
        hub.log({"loss": [1.0]})
    with pytest.raises(ValueError, match=r"log_kwargs has an entry for 'csvv'"):
        hub.log({"loss": 1.0}, log_kwargs={"csvv": {}})
    with pytest.raises(RuntimeError, match=r"init_trackers\(\) was already called"):
        hub.init("proj")
    hub.finish()
    with pytest.raises(RuntimeError, match=r"log\(\) after end_training\(\)"):
        hub.log({"loss": 1.0})


def test_non_main_rank_gets_blank_trackers_and_still_validates(tmp_path: Path) -> None:
    hub = TrackerHub(["csv", Recording], tmp_path, is_main_process=False)
    hub.init("proj", config={"lr": 0.1})
    assert hub.trackers == [] and not (tmp_path / "proj").exists()
    for name in ("csv", "recording", "anything"):
        blank = hub.get(name, unwrap=True)  # any name, unwrap ignored
        assert type(blank) is GeneralTracker and blank.tracker is None
    hub.log({"loss": torch.tensor(1.0)}, step=0)
    with pytest.raises(TypeError, match=r"Cannot log 'loss': got a Tensor of shape \(2,\)"):
        hub.log({"loss": torch.ones(2)}, step=0)  # the same error as on the main rank: no rank runs on alone
    hub.finish()


def test_main_process_only_false_runs_on_every_rank(tmp_path: Path) -> None:
    hub = TrackerHub(["csv", EveryRank], tmp_path, is_main_process=False)
    hub.init("proj")
    assert [t.name for t in hub.trackers] == ["every_rank"]
    with pytest.raises(ValueError, match=r"'csv' is not an available tracker stored inside the accelerator. "
                                         r"Available: \['every_rank'\]"):
        hub.get("csv")
    assert hub.get("every_rank", unwrap=True) == "the run object"
    hub.finish()


def test_get_on_main(tmp_path: Path) -> None:
    hub = TrackerHub(["csv", Recording], tmp_path, is_main_process=True)
    assert type(hub.get("csv")) is GeneralTracker  # before init this process has no trackers yet
    hub.init("proj")
    assert isinstance(hub.get("csv"), CSVTracker) and hub.get("recording", unwrap=True) == "the run object"
    assert hub.get("csv", unwrap=True) is hub.get("csv").tracker  # the open metrics.csv file
    with pytest.raises(ValueError, match=r"'wandb' is not an available tracker .* \['csv', 'recording'\]"):
        hub.get("wandb")
    hub.finish()


def test_run_identities_are_applied_before_start_and_kept(tmp_path: Path) -> None:
    first = TrackerHub(["csv", Recording], tmp_path, True)
    first.init("proj")
    first.log({"loss": 1.0}, step=0)
    saved = first.state_dict()
    first.finish()
    run_dir = "proj/version_0"  # relative to the logging directory: a moved run folder resumes into itself
    assert saved == {"csv": {"run": run_dir, "step": 0, "rows": 1, "columns": 2, "row_step": 0, "row": {"loss": 1.0}},
                     "recording": {"run": "r1"}}

    # The checkpoint also holds a wandb identity; this resume does not use wandb, but the identity is kept.
    resumed = TrackerHub(["csv", Recording], tmp_path, True)
    resumed.load_state_dict({**saved, "wandb": {"run_id": "abc"}})
    resumed.init("proj", config={"lr": 0.1})
    recording = resumed.get("recording")
    assert recording.calls[1:3] == [("load_state_dict", {"run": "r1"}), ("start", {"run": "r1"})]
    resumed.log({"loss": 0.5}, step=1)
    assert resumed.state_dict() == {"csv": {"run": run_dir, "step": 1, "rows": 2, "columns": 2, "row_step": 1,
                                            "row": {"loss": 0.5}}, "recording": {"run": "r1"},
                                    "wandb": {"run_id": "abc"}}
    with pytest.raises(RuntimeError, match=r"must be loaded before init_trackers\(\)"):
        resumed.load_state_dict(saved)
    resumed.finish()
    assert _csv_rows(tmp_path / "proj" / "version_0" / "metrics.csv") == [["step", "loss"], ["0", "1.0"],
                                                                         ["1", "0.5"]]
    with pytest.raises(TypeError, match=r"dict of tracker name -> state dict"):
        TrackerHub("csv", tmp_path, True).load_state_dict({"csv": "version_0"})  # type: ignore[dict-item]


def test_finish_finishes_every_tracker_even_if_one_fails() -> None:
    hub = TrackerHub([FailingFinish, Recording], None, True)
    hub.init("proj")
    with pytest.raises(OSError, match="disk full"):
        hub.finish()
    assert hub.get("recording").calls[-1] == ("finish",)


def test_all_skips_wandb_without_a_login_saying_how_to_log_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no ~/.config/wandb/settings
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    hub = TrackerHub("all", tmp_path, True)
    assert "wandb" not in hub.names and "csv" in hub.names
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "wandb is installed but not logged in" in lines[0] and "WANDB_MODE=offline" in lines[0]
    assert TrackerHub("all", tmp_path, False).names == hub.names and capsys.readouterr().err == ""  # main only

    monkeypatch.setenv("WANDB_MODE", "offline")
    assert "wandb" in TrackerHub("all", tmp_path, True).names
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert "wandb" in TrackerHub("all", tmp_path, True).names  # `wandb login` wrote the key there
    assert "wandb" in TrackerHub("wandb", tmp_path, True).names  # named explicitly: never skipped
