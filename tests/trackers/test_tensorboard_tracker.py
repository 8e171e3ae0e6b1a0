"""`TensorBoardTracker`: read the event files back with tensorboard's own EventAccumulator."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.plugin_event_accumulator import (
    EventAccumulator as PluginEventAccumulator,
)
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from trackers import TensorBoardTracker


def _next_second() -> None:
    """Wait for the next whole second: event files sort by their name (the second, the pid, then a per-process
    writer counter compared as text, so writer 10 sorts before writer 9), and a resumed run's file must come
    after the interrupted one's, as it does when a new process resumes later."""
    time.sleep(1.0 - time.time() % 1.0 + 0.01)


def _read(log_dir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return accumulator


def _scalars(accumulator: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def _texts(log_dir: Path, tag: str) -> list[tuple[int, str]]:
    # The loader TensorBoard's server uses: the legacy EventAccumulator never purges text (tensor) events on a
    # restart, this one does, so it shows what a user sees after a resume.
    accumulator = PluginEventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(event.step, event.tensor_proto.string_val[0].decode()) for event in
            accumulator.Tensors(f"{tag}/text_summary")]


def test_scalars_text_and_hparams_in_one_run_folder(tmp_path: Path) -> None:
    # Lightning's layout (TensorBoardLogger's); the default is Accelerate's: tests/trackers/test_tensorboard_layout.py
    tracker = TensorBoardTracker("proj", tmp_path, layout="lightning")
    tracker.start()
    tracker.store_init_configuration({"lr": 0.125, "model": {"name": "mlp", "layers": [1, 2]}, "seed": None})
    for step in range(3):
        tracker.log({"train/loss": 1.0 / (step + 1), "count": step, "note": f"step {step}"}, step=step)
    tracker.log({"bad": math.nan}, step=3)
    tracker.finish()

    log_dir = tmp_path / "proj"
    # Everything in the run folder itself: no timestamped hparams sub-run as Accelerate's add_hparams makes.
    assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == []
    events = _read(log_dir)
    loss = _scalars(events, "train/loss")
    assert [step for step, _ in loss] == [0, 1, 2]
    assert [value for _, value in loss] == pytest.approx([1.0, 0.5, 1.0 / 3.0], rel=1e-7)  # stored as float32
    assert _scalars(events, "count") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert [(e.step, math.isnan(e.value)) for e in events.Scalars("bad")] == [(3, True)]
    assert _texts(log_dir, "note") == [(0, "step 0"), (1, "step 1"), (2, "step 2")]

    content = events.PluginTagToContent("hparams")
    assert set(content) == {"_hparams_/experiment", "_hparams_/session_start_info",
                            "_hparams_/session_end_info"}
    hparams = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info.hparams
    assert {k: v.WhichOneof("kind") for k, v in hparams.items()} == {
        "lr": "number_value", "model/name": "string_value", "model/layers": "string_value"}
    assert (hparams["lr"].number_value, hparams["model/name"].string_value,
            hparams["model/layers"].string_value) == (0.125, "mlp", "[1, 2]")
    assert json.loads((log_dir / "hparams.json").read_text()) == {
        "lr": 0.125, "model": {"name": "mlp", "layers": [1, 2]}, "seed": None}
    saved = tracker.state_dict()  # the run folder, the last step and what was logged at it
    assert (saved["run"], saved["step"], saved["at_step"][0][0]) == ("proj", 3, "bad")
    assert math.isnan(saved["at_step"][0][1])


def test_resume_writes_the_same_folder_and_replaces_steps_after_the_checkpoint(tmp_path: Path) -> None:
    first = TensorBoardTracker("proj", tmp_path)
    first.start()
    for step in range(3):
        first.log({"loss": float(step), "note": f"first {step}"}, step=step)
    checkpoint = first.state_dict()
    for step in range(3, 5):  # logged after the checkpoint, then the run dies
        first.log({"loss": float(step), "note": f"first {step}"}, step=step)
    first.finish()

    resumed = TensorBoardTracker("renamed", tmp_path)
    resumed.load_state_dict(checkpoint)
    _next_second()
    resumed.start()
    for step in range(3, 6):
        resumed.log({"loss": 10.0 * step, "note": f"resumed {step}"}, step=step)
    resumed.finish()

    assert not (tmp_path / "renamed").exists()
    events = _read(tmp_path / "proj")
    assert _scalars(events, "loss") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]
    assert _texts(tmp_path / "proj", "note") == [(0, "first 0"), (1, "first 1"), (2, "first 2"),
                                                 (3, "resumed 3"), (4, "resumed 4"), (5, "resumed 5")]
    assert len(list((tmp_path / "proj").glob("events.out.tfevents.*"))) == 2


def test_a_new_run_in_a_used_folder_hides_nothing(tmp_path: Path) -> None:
    for value, steps in ((1.0, 3), (2.0, 2)):
        tracker = TensorBoardTracker("proj", tmp_path)
        tracker.start()
        for step in range(steps):
            tracker.log({"loss": value, "note": f"run {value}"}, step=step)
        tracker.finish()
    # Both runs stay visible (Accelerate's behaviour for a shared folder): only a resume replaces points.
    assert sorted(_scalars(_read(tmp_path / "proj"), "loss")) == [(0, 1.0), (0, 2.0), (1, 1.0), (1, 2.0),
                                                                   (2, 1.0)]
    assert sorted(_texts(tmp_path / "proj", "note")) == [(0, "run 1.0"), (0, "run 2.0"), (1, "run 1.0"),
                                                         (1, "run 2.0"), (2, "run 1.0")]


def test_a_moved_run_resumes_into_its_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.chdir(tmp_path)
    first = TensorBoardTracker("proj", "runs/a")
    first.start()
    first.log({"loss": 1.0}, step=1)
    checkpoint = first.state_dict()
    first.finish()
    assert checkpoint == {"run": "proj", "step": 1, "at_step": [["loss", 1.0]]}
    shutil.move(str(tmp_path / "runs/a"), str(tmp_path / "moved"))
    resumed = TensorBoardTracker("proj", tmp_path / "moved")
    resumed.load_state_dict(checkpoint)
    _next_second()
    resumed.start()
    resumed.log({"loss": 2.0}, step=2)
    resumed.finish()
    assert not (tmp_path / "runs/a").exists()
    assert _scalars(_read(tmp_path / "moved/proj"), "loss") == [(1, 1.0), (2, 2.0)]


def test_values_of_the_checkpoints_step_logged_after_it_are_not_doubled(tmp_path: Path) -> None:
    """A learning rate logged at the next batch's start has the checkpoint's step: the resumed run logs it again,
    and TensorBoard shows it once, as for an uninterrupted run."""

    def run(tracker: TensorBoardTracker, steps: range, checkpoint_at: int | None = None) -> dict | None:
        saved = None
        for step in steps:
            tracker.log({"lr": 1.0 / (step + 1), "note": f"lr {step}"}, step=max(step - 1, 0))  # batch start
            tracker.log({"loss": float(step)}, step=step)
            if step == checkpoint_at:
                saved = tracker.state_dict()
        return saved

    reference = TensorBoardTracker("reference", tmp_path)
    reference.start()
    run(reference, range(5))
    reference.finish()
    killed = TensorBoardTracker("run", tmp_path)
    killed.start()
    saved = run(killed, range(4), checkpoint_at=2)
    killed.finish()
    assert saved is not None
    resumed = TensorBoardTracker("run", tmp_path)
    resumed.load_state_dict(saved)
    _next_second()
    resumed.start()
    run(resumed, range(3, 5))
    resumed.finish()
    expected, got = _read(tmp_path / "reference"), _read(tmp_path / "run")
    for tag in ("lr", "loss"):
        assert _scalars(got, tag) == _scalars(expected, tag), tag
    assert _scalars(got, "lr")[2:4] == [(1, pytest.approx(1 / 3)), (2, 0.25)]  # step 2's lr once, not twice
    assert _texts(tmp_path / "run", "note") == _texts(tmp_path / "reference", "note")


def test_a_value_logged_at_an_earlier_step_does_not_move_the_resume_point_back(tmp_path: Path) -> None:
    """Lightning's loggers log each evaluation batch at its count in the loop (0, 1, ...) after training steps
    further on: a checkpoint taken then must still hide only what comes after the furthest step."""
    first = TensorBoardTracker("proj", tmp_path)
    first.start()
    for step in range(3):
        first.log({"loss": float(step)}, step=step)
    first.log({"val_batch": 0.5}, step=0)  # an evaluation batch, at its own count
    checkpoint = first.state_dict()
    first.finish()
    assert checkpoint["step"] == 2 and checkpoint["at_step"] == [["loss", 2.0]]

    resumed = TensorBoardTracker("proj", tmp_path)
    resumed.load_state_dict(checkpoint)
    _next_second()
    resumed.start()
    resumed.log({"loss": 30.0}, step=3)
    resumed.finish()
    assert _scalars(_read(tmp_path / "proj"), "loss") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
