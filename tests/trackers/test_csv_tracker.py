"""`CSVTracker`: exact file contents, widening, versioned run folders, per-row flush and resume."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest

from trackers import CSVTracker


def _rows(path: str | Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_exact_contents_widening_and_config(tmp_path: Path) -> None:
    tracker = CSVTracker("proj", tmp_path)
    tracker.start()
    assert tracker.run_dir == str(tmp_path / "proj" / "version_0")
    tracker.store_init_configuration({"lr": 0.1, "model": {"width": 64}, "path": tmp_path})
    tracker.log({"loss": 0.5}, step=0)
    tracker.log({"loss": 0.25, "acc": 1.0}, step=1)  # a new name widens the file
    tracker.log({"note": "a, \"quoted\" value", "nan": math.nan, "flag": True})  # no step: empty cell
    tracker.log({"acc": 0.75}, step=2)
    tracker.finish()

    assert (tmp_path / "proj" / "version_0" / "metrics.csv").read_text() == (
        "step,loss,acc,note,nan,flag\n"
        "0,0.5,,,,\n"
        "1,0.25,1.0,,,\n"
        ',,,"a, ""quoted"" value",nan,True\n'
        "2,,0.75,,,\n"
    )
    config = json.loads((tmp_path / "proj" / "version_0" / "config.json").read_text())
    assert config == {"lr": 0.1, "model": {"width": 64}, "path": str(tmp_path)}
    assert tracker.state_dict() == {"run": "proj/version_0", "step": 2, "rows": 4, "columns": 6, "row_step": 2,
                                    "row": {"acc": 0.75}}


def test_rows_are_flushed_and_file_rewritten_only_when_columns_grow(tmp_path: Path) -> None:
    tracker = CSVTracker("proj", tmp_path)
    tracker.start()
    path = tracker.metrics_path
    tracker.log({"loss": 1.0}, step=0)
    inode = os.stat(path).st_ino
    for step in range(1, 4):
        tracker.log({"loss": 1.0 / (step + 1)}, step=step)
    # Same columns: appended in place (same file), and readable before finish(), as after a kill.
    assert os.stat(path).st_ino == inode
    assert _rows(path)[-1] == ["3", "0.25"]
    tracker.log({"acc": 0.5}, step=4)
    assert os.stat(path).st_ino != inode  # widened by an atomic rewrite
    assert _rows(path) == [["step", "loss", "acc"], ["0", "1.0", ""], ["1", "0.5", ""],
                           ["2", "0.3333333333333333", ""], ["3", "0.25", ""], ["4", "", "0.5"]]
    tracker.finish()


def test_each_new_run_gets_its_own_version_folder(tmp_path: Path) -> None:
    dirs = []
    for _ in range(2):
        tracker = CSVTracker("proj", tmp_path)
        tracker.start()
        tracker.log({"loss": 1.0}, step=0)
        tracker.finish()
        dirs.append(tracker.run_dir)
    assert dirs == [str(tmp_path / "proj" / "version_0"), str(tmp_path / "proj" / "version_1")]
    assert all(_rows(Path(d) / "metrics.csv") == [["step", "loss"], ["0", "1.0"]] for d in dirs)


def test_resume_appends_to_the_same_file_and_drops_rows_after_the_checkpoint(tmp_path: Path) -> None:
    first = CSVTracker("proj", tmp_path)
    first.start()
    for step in range(3):
        first.log({"loss": float(step)}, step=step)
    checkpoint = first.state_dict()  # what a checkpoint at step 2 stores
    first.log({"loss": 3.0, "late": 1.0}, step=3)  # logged after the checkpoint, then the process dies
    # No finish(): a killed run. The resumed run re-logs step 3, so the stale row must go.

    resumed = CSVTracker("another_name", tmp_path)  # the saved identity wins over the project name
    resumed.load_state_dict(checkpoint)
    resumed.start()
    assert resumed.run_dir == first.run_dir
    resumed.log({"loss": 30.0}, step=3)
    resumed.log({"loss": 40.0, "acc": 1.0}, step=4)
    resumed.finish()
    first.finish()

    # Cut back to what the checkpoint saw (the column first logged after it too), as an uninterrupted run's file.
    assert _rows(Path(first.run_dir) / "metrics.csv") == [
        ["step", "loss", "acc"], ["0", "0.0", ""], ["1", "1.0", ""], ["2", "2.0", ""], ["3", "30.0", ""],
        ["4", "40.0", "1.0"]]
    assert resumed.state_dict() == {"run": "proj/version_0", "step": 4, "rows": 5, "columns": 3, "row_step": 4,
                                    "row": {"loss": 40.0, "acc": 1.0}}
    assert not (tmp_path / "another_name").exists() and sorted(os.listdir(tmp_path / "proj")) == ["version_0"]


def test_misuse_errors(tmp_path: Path) -> None:
    tracker = CSVTracker("proj", tmp_path)
    with pytest.raises(RuntimeError, match=r"log\(\) before start\(\)"):
        tracker.log({"loss": 1.0}, step=0)
    tracker.start()
    with pytest.raises(ValueError, match=r"reserves the column name 'step'"):
        tracker.log({"step": 1})
    with pytest.raises(RuntimeError, match=r"load_state_dict\(\) must come before start\(\)"):
        tracker.load_state_dict({"run": "proj/version_0"})
    tracker.finish()
    with pytest.raises(TypeError, match=r"takes no options but version=. Received: \['flush_every'\]"):
        CSVTracker("proj", tmp_path, flush_every=10)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "metrics.csv").write_text("epoch,loss\n0,1.0\n")
    other = CSVTracker("proj", tmp_path)
    other.load_state_dict({"run_dir": str(foreign), "step": None})
    with pytest.raises(ValueError, match=r"not a metrics file written by CSVTracker"):
        other.start()


def test_a_copied_run_resumes_into_the_copy_from_any_working_directory(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = CSVTracker("proj", "runs/a")  # a relative logging directory, as scripts pass it
    first.start()
    first.log({"loss": 1.0}, step=1)
    checkpoint = first.state_dict()
    first.log({"loss": 2.0}, step=2)
    first.finish()
    assert checkpoint == {"run": "proj/version_0", "step": 1, "rows": 1, "columns": 2, "row_step": 1,
                          "row": {"loss": 1.0}}
    original = (tmp_path / "runs/a/proj/version_0/metrics.csv").read_bytes()

    import shutil

    shutil.copytree(tmp_path / "runs/a", tmp_path / "copy")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a stray relative "runs/..." here would be a bug
    resumed = CSVTracker("proj", tmp_path / "copy")
    resumed.load_state_dict(checkpoint)
    resumed.start()
    resumed.log({"loss": 20.0}, step=2)
    resumed.finish()
    assert (tmp_path / "runs/a/proj/version_0/metrics.csv").read_bytes() == original
    assert _rows(tmp_path / "copy/proj/version_0/metrics.csv") == [["step", "loss"], ["1", "1.0"], ["2", "20.0"]]
    assert os.listdir(elsewhere) == []


def test_a_saved_run_folder_cannot_leave_the_logging_directory(tmp_path: Path) -> None:
    tracker = CSVTracker("proj", tmp_path / "mine")
    with pytest.raises(ValueError, match=r"not a path inside the logging directory"):
        tracker.load_state_dict({"run": "../theirs/version_0", "step": 3})
    with pytest.raises(ValueError, match=r"not a path inside the logging directory"):
        tracker.load_state_dict({"run": str(tmp_path / "theirs"), "step": 3})
    # An older checkpoint's folder outside this run: a warning, and a new version folder, never the other run's.
    with pytest.warns(UserWarning, match=r"not inside this run's logging directory"):
        tracker.load_state_dict({"run_dir": str(tmp_path / "theirs" / "version_0"), "step": 3})
    tracker.start()
    tracker.finish()
    assert tracker.run_dir == str(tmp_path / "mine" / "proj" / "version_0")


def test_a_tracker_dropped_without_finish_closes_its_file_quietly(tmp_path: Path) -> None:
    import gc
    import warnings

    tracker = CSVTracker("proj", tmp_path)
    tracker.start()
    tracker.log({"loss": 1.0}, step=0)
    handle = tracker.tracker
    assert handle is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del tracker  # e.g. a Trainer that went out of scope without end_training()
        gc.collect()
    assert handle.closed
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_one_row_per_step(tmp_path: Path) -> None:
    tracker = CSVTracker("proj", tmp_path)
    tracker.start()
    tracker.log({"loss": 1.0}, step=10)
    tracker.log({"val/acc": 0.5}, step=10)  # a new column while merging: the file is widened, then merged
    tracker.log({"lr": 0.1}, step=10)
    tracker.log({"lr": 0.2, "loss": 0.9}, step=10)  # would change values of the row: a row of its own
    tracker.log({"loss": 0.8}, step=20)
    tracker.log({"note": 1.0})  # no step: never merged
    tracker.log({"note": 2.0})
    tracker.log({"lr": 0.05}, step=20)
    tracker.finish()
    assert _rows(Path(tracker.run_dir) / "metrics.csv") == [
        ["step", "loss", "val/acc", "lr", "note"], ["10", "1.0", "0.5", "0.1", ""], ["10", "0.9", "", "0.2", ""],
        ["20", "0.8", "", "", ""],
        ["", "", "", "", "1.0"], ["", "", "", "", "2.0"], ["20", "", "", "0.05", ""]]


def test_a_flat_run_folder_and_fixed_versions_are_never_shared(tmp_path: Path) -> None:
    flat = CSVTracker("", tmp_path / "run", version="")  # Lightning's CSVLogger(save_dir, name="", version="")
    flat.start()
    flat.log({"loss": 1.0}, step=1)
    saved = flat.state_dict()
    flat.finish()
    assert flat.metrics_path == str(tmp_path / "run" / "metrics.csv") and saved["run"] == "." and saved["step"] == 1
    with pytest.raises(FileExistsError, match=r"run/metrics.csv already holds the metrics of another run"):
        CSVTracker("", tmp_path / "run", version="").start()  # a second fresh run in the same folder
    resumed = CSVTracker("", tmp_path / "run", version="")
    resumed.load_state_dict(saved)  # ...while resuming that run continues it
    resumed.start()
    resumed.log({"loss": 0.5}, step=2)
    resumed.finish()
    assert _rows(tmp_path / "run" / "metrics.csv") == [["step", "loss"], ["1", "1.0"], ["2", "0.5"]]
    fixed = CSVTracker("proj", tmp_path, version=3)
    fixed.start()
    fixed.finish()
    assert fixed.run_dir == str(tmp_path / "proj" / "version_3")
    with pytest.raises(TypeError, match=r"version=\.\.\.\) takes None"):
        CSVTracker("proj", tmp_path, version=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("checkpoint_at", [2, 3])  # mid-epoch (the next lr joins the row), at an epoch's end
def test_a_resumed_file_ends_as_the_uninterrupted_one_row_for_row(tmp_path: Path, checkpoint_at: int) -> None:
    """Values of the checkpoint's step logged after it (a learning rate at the next batch's start, epoch values)
    are cut and logged again; the resumed run's first values of that step join its row, as they would have."""

    def run(tracker: CSVTracker, steps: range, checkpoint_at: int | None = None) -> dict | None:
        saved = None
        for step in steps:
            tracker.log({"lr": 1.0 / (step + 1), "epoch": step // 2}, step=step - 1 if step else 0)  # batch start
            tracker.log({"loss": float(step), "epoch": step // 2}, step=step)
            if step % 2:
                tracker.log({"val/acc": step / 10, "epoch": step // 2}, step=step)  # epoch end, same step
            if step == checkpoint_at:
                saved = tracker.state_dict()
        return saved

    reference = CSVTracker("", tmp_path / "reference", version="")
    reference.start()
    run(reference, range(6))
    reference.finish()

    killed = CSVTracker("", tmp_path / "run", version="")
    killed.start()
    saved = run(killed, range(checkpoint_at + 2), checkpoint_at=checkpoint_at)
    killed.log({"extra": 1.0}, step=checkpoint_at + 2)  # a column first seen after the checkpoint
    # No finish(): the process dies. The resumed run continues after the checkpoint's step.
    resumed = CSVTracker("", tmp_path / "run", version="")
    assert saved is not None
    resumed.load_state_dict(saved)
    resumed.start()
    run(resumed, range(checkpoint_at + 1, 6))
    resumed.finish()
    killed.finish()
    expected = (tmp_path / "reference" / "metrics.csv").read_text()
    assert (tmp_path / "run" / "metrics.csv").read_text() == expected
    # Step 3's row, then the lr of step 4's batch (logged at step 3): a new epoch, so a row of its own.
    assert "\n3,,1,3.0,0.3\n3,0.2,2,,\n" in expected


def test_new_row_keeps_a_later_call_out_of_the_last_row(tmp_path: Path) -> None:
    tracker = CSVTracker("proj", tmp_path)
    tracker.start()
    tracker.log({"loss": 1.0, "epoch": 3}, step=40)
    tracker.log({"test/acc": 0.9, "epoch": 3}, step=40, new_row=True)  # the trainer's test results after fit
    tracker.finish()
    assert _rows(tracker.metrics_path) == [["step", "loss", "epoch", "test/acc"], ["40", "1.0", "3", ""],
                                           ["40", "", "3", "0.9"]]
