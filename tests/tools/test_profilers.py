"""Profilers: Trainer(profiler=...) times hooks, steps, data fetches, optimizer steps and checkpoints; each
profiler writes its summary (and the pytorch one its trace) into the run folder, one file per rank."""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.trainer.helpers import QUIET, SAVING, Regressor, data
from trainer import Trainer
from trainer.profiling import AdvancedProfiler, PassThroughProfiler, Profiler, PyTorchProfiler, SimpleProfiler


def fit(tmp_path: Any, profiler: Any) -> Trainer:
    trainer = Trainer(**{**SAVING, "log_with": None}, project_dir=str(tmp_path), max_epochs=2, profiler=profiler,
                      callbacks=[ModelCheckpoint(every_n_train_steps=4)])
    trainer.fit(Regressor(), data(n=16, batch_size=4), data(n=8, batch_size=4))
    return trainer


def test_simple_profiler_times_every_kind_of_action(tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    trainer = fit(tmp_path, "simple")
    profiler = trainer.profiler
    assert isinstance(profiler, SimpleProfiler)
    calls = {name: len(durations) for name, durations in profiler.recorded_durations.items()}
    assert calls["run_training_batch"] == 8 and calls["optimizer_step"] == 8 and calls["backward"] == 8
    assert calls["train_dataloader_next"] == 8 + 2  # each epoch's last fetch finds the end
    assert calls["validation_step"] == 4 and calls["save_checkpoint"] == 2
    assert calls["[Callback]ModelCheckpoint.on_train_batch_end"] == 8
    assert calls["[Callback]ModelCheckpoint.setup"] == 1
    printed = capsys.readouterr().out
    assert "FIT Profiler Report" in printed and "run_training_batch" in printed
    path = os.path.join(str(tmp_path), "fit-profiler-0.txt")
    assert profiler.output_paths == [path]
    with open(path) as handle:
        report = handle.read()
    assert "Mean duration (s)" in report and "save_checkpoint" in report and "optimizer_step" in report


def test_advanced_profiler_writes_cprofile_stats_per_action(tmp_path: Any) -> None:
    trainer = fit(tmp_path, AdvancedProfiler(filename="adv", line_count_restriction=5))
    with open(os.path.join(str(tmp_path), "fit-adv-0.txt")) as handle:
        report = handle.read()
    assert "Profile stats for: run_training_batch rank: 0" in report
    assert "Profile stats for: save_checkpoint rank: 0" in report
    assert "function calls" in report and "cumulative" in report  # pstats' own table
    assert isinstance(trainer.profiler, Profiler)


def test_pytorch_profiler_writes_a_chrome_trace_in_the_run_folder(tmp_path: Any) -> None:
    trainer = fit(tmp_path, PyTorchProfiler(row_limit=10))
    profiler = trainer.profiler
    assert isinstance(profiler, PyTorchProfiler)
    trace = os.path.join(str(tmp_path), "fit-profiler-0.pt.trace.json")
    assert profiler.trace_paths == [trace]
    with open(trace) as handle:
        names = {event.get("name") for event in json.load(handle)["traceEvents"]}
    assert {"run_training_batch", "optimizer_step", "backward", "save_checkpoint"} <= names
    with open(os.path.join(str(tmp_path), "fit-profiler-0.txt")) as handle:
        assert "run_training_batch" in handle.read()  # the operator table, with the actions as ranges


def test_pytorch_profiler_with_a_schedule_writes_each_cycle(tmp_path: Any) -> None:
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    trainer = fit(tmp_path, PyTorchProfiler(schedule=schedule))
    traces = [name for name in os.listdir(tmp_path) if name.endswith(".pt.trace.json")]
    assert len(traces) == 1 and traces[0].startswith("fit-profiler-0")  # tensorboard_trace_handler's file
    with open(os.path.join(str(tmp_path), traces[0])) as handle:
        names = {event.get("name") for event in json.load(handle)["traceEvents"]}
    assert "run_training_batch" in names
    assert isinstance(trainer.profiler, PyTorchProfiler)


def test_validate_and_predict_are_profiled_too(tmp_path: Any) -> None:
    profiler = SimpleProfiler()
    trainer = Trainer(**{**QUIET, "log_with": None}, project_dir=str(tmp_path), profiler=profiler)
    module = Regressor()
    trainer.validate(module, data(n=8, batch_size=4), verbose=False)
    trainer.predict(module, data(n=8, batch_size=4))
    assert len(profiler.recorded_durations["predict_step"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["predict-profiler-0.txt", "validate-profiler-0.txt"]


def test_without_a_profiler_a_module_can_still_profile_its_own_code(tmp_path: Any) -> None:
    class Profiled(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            with self.trainer.profiler.profile("my_loss"):  # Lightning code does this
                return super().training_step(batch, batch_idx)

    trainer = Trainer(**{**QUIET, "log_with": None}, project_dir=str(tmp_path), max_steps=2)
    trainer.fit(Profiled(), data())
    assert isinstance(trainer.profiler, PassThroughProfiler) and os.listdir(tmp_path) == []
    profiler = SimpleProfiler()
    Trainer(**{**QUIET, "log_with": None}, project_dir=str(tmp_path), max_steps=2, profiler=profiler).fit(
        Profiled(), data())
    assert len(profiler.recorded_durations["my_loss"]) == 2


def test_an_unknown_profiler_name_fails_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"profiler='simpel'.*Did you mean 'simple'.*'advanced'.*'pytorch'"):
        Trainer(**QUIET, profiler="simpel")
    with pytest.raises(TypeError, match="profiler=.*Received: int"):
        Trainer(**QUIET, profiler=3)


def _two_ranks(folder: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        trainer = Trainer(**{**QUIET, "log_with": None}, project_dir=folder, max_epochs=1, profiler="simple")
        trainer.fit(Regressor(), data(n=16, batch_size=4))
    return out.getvalue()


def test_one_file_per_rank_and_the_summary_printed_once(tmp_path: Any, run_distributed: Any) -> None:
    out0, out1 = run_distributed(_two_ranks, 2, str(tmp_path))
    assert {"fit-profiler-0.txt", "fit-profiler-1.txt"} <= set(os.listdir(tmp_path))
    assert "FIT Profiler Report" in out0 and "Profiler Report" not in out1
    with open(tmp_path / "fit-profiler-1.txt") as handle:
        assert "run_training_batch" in handle.read()


def test_module_hooks_are_timed_under_lightnings_label(tmp_path: Any) -> None:
    class Hooked(Regressor):
        def on_train_epoch_end(self) -> None:
            pass

    trainer = Trainer(**{**QUIET, "log_with": None}, project_dir=str(tmp_path), max_epochs=2, profiler="simple")
    trainer.fit(Hooked(), data(n=8, batch_size=4))
    assert len(trainer.profiler.recorded_durations["[LightningModule]Hooked.on_train_epoch_end"]) == 2
