"""Lightning's Trainer keywords: each works (checked by its effect) or fails at construction with the fix."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from engine import Accelerator
from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data
from trainer import Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger
from trainer.loggers.logger import TrackerLogger
from trainer.strategies import DDPStrategy
from trainer.utilities import rank_zero_only

QUIET_ON = {k: v for k, v in QUIET.items() if k not in ("log_with", "enable_checkpointing")}


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"strategy": "deepspeed_stage_9"}, ValueError, r"strategy='deepspeed_stage_9'.*not a strategy.*deepspeed_stage_3"),
    ({"strategy": 3}, TypeError, r"strategy=...\) takes a name or a DDPStrategy.*Received: int"),
    ({"devices": 0}, ValueError, r"devices=0\) must be >= 1"),
    ({"devices": "x"}, ValueError, r"devices=...\) takes an int.*Received: 'x'"),
    ({"devices": [0, 1], "accelerator": "cpu"}, ValueError, r"names GPU ids.*pass devices=2"),
    ({"devices": -1, "accelerator": "cpu"}, ValueError, r"devices=-1\) means every GPU"),
    ({"num_nodes": 2}, ValueError, r"num_nodes=2\) needs one launch per machine: run `ember launch --nnodes 2"),
    ({"logger": "csv"}, TypeError, r"logger=...\) takes True / False, a logger.*Received: str"),
    ({"logger": CSVLogger("x"), "log_with": "csv"}, ValueError, r"both choose the trackers"),
    ({"profiler": "simpel"}, ValueError, r"profiler='simpel'\) is not a known profiler. Did you mean 'simple'"),
    ({"plugins": ["x"]}, ValueError, r"plugins=\['x'\]\) is not supported"),
    ({"model_registry": "m"}, ValueError, r"model_registry='m'\) is not supported"),
    ({"reload_dataloaders_every_n_epochs": -1}, ValueError, r"should be an int >= 0.*Received: -1"),
    ({"benchmark": True, "deterministic": True}, ValueError, r"benchmark=True, deterministic=True\) contradict"),
    ({"barebones": True, "enable_checkpointing": True}, ValueError, r"barebones=True, enable_checkpointing=True"),
    ({"barebones": True, "logger": True}, ValueError, r"barebones=True, logger=True\)"),
    ({"default_root_dir": "a", "project_dir": "b"}, ValueError, r"name two folders for one run"),
    ({"inference_mode": "yes"}, TypeError, r"inference_mode=...\) must be True or False"),
])
def test_bad_lightning_keywords(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Trainer(**kwargs)


def test_gpu_requests_fail_early_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"accelerator='gpu'\) asks for a GPU, but torch.cuda.is_available\(\) is "
                                           r"False here \(torch .*Use accelerator='cpu'"):
        Trainer(accelerator="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"devices=4\) asks for more GPUs than this machine has \(2\)"):
        Trainer(accelerator="gpu", devices=4)


def test_a_launch_that_does_not_match_devices_or_num_nodes_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"launched with 2 process\(es\) on this node.*devices=3.*pass devices=2"):
        Trainer(accelerator="cpu", devices=3)
    with pytest.raises(ValueError, match=r"num_nodes=2\) with 2 process\(es\) per node makes 4.*WORLD_SIZE=2"):
        Trainer(accelerator="cpu", num_nodes=2)
    with pytest.raises(ValueError, match="use_distributed_sampler=False\\) with several processes"):
        Trainer(use_distributed_sampler=False)


def test_devices_above_one_inside_pytest_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"devices=2\) from a single process would run the test runner again"):
        Trainer(accelerator="cpu", devices=2)


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_logger_object_default_root_dir_and_default_checkpoint(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path / "logs", name="exp")
    trainer = Trainer(logger=logger, default_root_dir=str(tmp_path), max_epochs=2, log_every_n_steps=1, **QUIET_ON)
    module = Regressor()
    trainer.fit(model=module, train_dataloaders=data())
    assert trainer.logger is logger and trainer.loggers == [logger] and module.logger is logger
    assert module.loggers == [logger] and trainer.model is module
    rows = _rows(os.path.join(logger.log_dir, "metrics.csv"))
    assert [r["step"] for r in rows if r.get("train/loss")] == ["0", "1", "2", "3", "4", "5", "6", "7"]  # Lightning's
    # The default ModelCheckpoint: in the logger's version folder, the newest epoch end kept (Lightning's default).
    (callback,) = trainer.checkpoint_callbacks
    assert callback.dirpath == os.path.join(logger.log_dir, "checkpoints")
    assert os.listdir(callback.dirpath) == ["epoch=1-step=8.ckpt"]
    assert trainer.test(model=module, dataloaders=data(), ckpt_path="last", verbose=False)[0]["test/loss"] >= 0


def test_logger_true_false_and_tracker_views(tmp_path: Path) -> None:
    trainer = Trainer(logger=True, default_root_dir=str(tmp_path), max_epochs=1, enable_checkpointing=False,
                      **QUIET_ON)
    assert isinstance(trainer.logger, TensorBoardLogger)
    assert trainer.logger.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    trainer.fit(Regressor(), data())
    assert any(name.startswith("events.") for name in os.listdir(trainer.logger.log_dir))
    off = Trainer(logger=False, max_epochs=1, **QUIET_ON)
    assert off.logger is None and off.loggers == [] and not off.accelerator.log_with
    named = Trainer(log_with="csv", project_dir=str(tmp_path / "p"), max_epochs=1, enable_checkpointing=False,
                    **QUIET_ON)
    named.fit(Regressor(), data())
    (view,) = named.loggers
    assert isinstance(view, TrackerLogger) and os.path.exists(os.path.join(view.log_dir, "metrics.csv"))


def test_barebones_turns_everything_off() -> None:
    trainer = Trainer(barebones=True, max_epochs=1)
    assert trainer.callbacks == [] and trainer.logger is None and trainer.num_sanity_val_steps == 0
    assert not trainer.accelerator.log_with and trainer.enable_checkpointing is False


class ModeProbe(Regressor):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize(("inference_mode", "expected"), [(True, (True, False)), (False, (False, False))])
def test_inference_mode_chooses_the_evaluation_context(inference_mode: bool, expected: tuple[bool, bool]) -> None:
    module = ModeProbe()
    trainer = Trainer(inference_mode=inference_mode, max_epochs=1, **QUIET)
    trainer.fit(module, data(), data())
    # Inside fit, as Lightning 2.6.6 (recorded in tests/lightning_corpus/pruning.py): validation runs under no_grad,
    # never inference_mode, whatever the keyword says (what it creates may take part in training afterwards).
    assert module.modes == (False, False)
    trainer.validate(module, data())
    assert module.modes == expected


def test_benchmark_autolog_strategy_object_and_rank() -> None:
    saved = torch.backends.cudnn.benchmark
    try:
        Trainer(benchmark=True, **QUIET)
        assert torch.backends.cudnn.benchmark is True
        Trainer(deterministic=True, **QUIET)
        assert torch.backends.cudnn.benchmark is False  # Lightning: deterministic turns benchmarking off
    finally:
        torch.backends.cudnn.benchmark = saved
    tracker = MemoryTracker()
    Trainer(**{**QUIET, "log_with": [tracker]}, enable_autolog_hparams=False, max_epochs=1).fit(Regressor(), data())
    assert tracker.config is None
    trainer = Trainer(strategy=DDPStrategy(find_unused_parameters=True, static_graph=True), **QUIET)
    handler = trainer.accelerator.ddp_handler
    assert handler is not None and handler.find_unused_parameters and handler.static_graph
    assert rank_zero_only.rank == 0
    with pytest.raises(ValueError, match=r"was given together with \['strategy'\]"):
        Trainer(accelerator=Accelerator(cpu=True), strategy="ddp_find_unused_parameters_true")


def test_lightning_none_defaults_are_accepted() -> None:
    trainer = Trainer(limit_train_batches=None, limit_val_batches=None, val_check_interval=None,
                      num_sanity_val_steps=None, log_every_n_steps=None, gradient_clip_algorithm=None,
                      enable_checkpointing=None, enable_progress_bar=False, enable_model_summary=None, log_with=None,
                      max_steps=-1, max_epochs=1)
    assert (trainer.limit_train_batches, trainer.num_sanity_val_steps, trainer.log_every_n_steps) == (1.0, 2, 50)
    assert any(isinstance(c, ModelCheckpoint) for c in trainer.callbacks)
