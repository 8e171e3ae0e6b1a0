"""Smaller Lightning behaviours (issue 27), each as Lightning 2.6 shows it: where hooks run, what is said, what a
fast_dev_run or barebones trainer skips."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from callbacks import EarlyStopping
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class Grads(Regressor):
    """Records whether gradients / inference mode are on in the evaluation start hooks."""

    def _record(self) -> None:
        self.seen = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())

    on_validation_start = on_test_start = on_predict_start = _record


@pytest.mark.parametrize("entry", ["validate", "test", "predict"])
@pytest.mark.parametrize("inference_mode", [True, False])
def test_evaluation_start_hooks_run_without_gradients(entry: str, inference_mode: bool) -> None:
    module = Grads()
    getattr(Trainer(**QUIET, inference_mode=inference_mode), entry)(module, data(n=8))
    assert module.seen == (False, inference_mode)


def test_early_stopping_does_not_check_under_fast_dev_run() -> None:
    # A monitor nobody logs would raise (strict); Lightning's fast_dev_run skips early-stopping checks.
    trainer = Trainer(**QUIET, fast_dev_run=2, callbacks=[EarlyStopping(monitor="never_logged")])
    trainer.fit(Regressor(), data(n=8), data(n=8))
    assert trainer.global_step == 2


def test_barebones_says_so_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        trainer = Trainer(barebones=True, max_epochs=1)
    assert "running in `Trainer(barebones=True)` mode" in caplog.text
    with pytest.warns(UserWarning, match=r"`self.log\('train/loss', ...\)` but `Trainer\(barebones=True\)` is "):
        trainer.fit(Regressor(), data(n=8))
    assert trainer.callback_metrics == {}
    assert trainer.barebones and trainer.log_every_n_steps == 0  # Lightning 2.6.6: True, 0


@pytest.mark.parametrize("keyword", [{"log_every_n_steps": 1}, {"fast_dev_run": 1}, {"profiler": "simple"},
                                     {"detect_anomaly": True}, {"enable_checkpointing": True}])
def test_barebones_refuses_what_it_turns_off(keyword: dict[str, Any]) -> None:
    # Lightning 2.6.6 raises a ValueError starting "`Trainer(barebones=True, log_every_n_steps=1)` was passed."
    (name, value), = keyword.items()
    with pytest.raises(ValueError, match=rf"`Trainer\(barebones=True, {name}={value!r}\)` was passed"):
        Trainer(barebones=True, **keyword)


def test_a_module_attached_by_hand_logs_through_its_trainer() -> None:
    # Lightning's module._trainer = trainer attaches a module outside a run: under barebones its self.log warns.
    module = Regressor()
    module._trainer = Trainer(barebones=True)
    assert module.trainer is module._trainer
    with pytest.warns(UserWarning, match=r"barebones=True\)` is configured"):
        module.log("foo", 1.0)
    module._trainer = None
    assert module._trainer is None


@pytest.mark.parametrize("name, value, meaning", [
    ("limit_train_batches", 1, "1 batch will be used"), ("limit_val_batches", 1.0, "100% of the batches"),
    ("overfit_batches", 1, "1 batch will be used"), ("val_check_interval", 1, "validation will run after every batch"),
    ("val_check_interval", 1.0, "validation will run at the end of the training epoch"),
])
def test_a_limit_of_one_is_spelled_out(caplog: pytest.LogCaptureFixture, name: str, value: Any, meaning: str) -> None:
    with caplog.at_level(logging.INFO):
        Trainer(**QUIET, **{name: value})
    assert f"`Trainer({name}={value})` was configured so {meaning}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        Trainer(**QUIET)  # the defaults say nothing
    assert "was configured" not in caplog.text


def test_trainer_defaults_from_pl_trainer_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's PL_TRAINER_<NAME> variables set the defaults of keywords not given.
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    trainer = Trainer(enable_progress_bar=False)
    assert trainer.logger is None and trainer.max_steps == 7
    assert Trainer(logger=True, max_steps=42, enable_progress_bar=False).max_steps == 42  # given: the keyword wins


def test_trainer_state_compares_with_the_trainers_state() -> None:
    # Lightning 2.6.6: a new Trainer's state == TrainerState(status=INITIALIZING, fn=None, stage=None).
    from trainer.states import TrainerFn, TrainerState, TrainerStatus

    trainer = Trainer(**QUIET, max_epochs=1)
    assert trainer.state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
    trainer.fit(Regressor(), data(n=8))
    assert trainer.state == TrainerState(status=TrainerStatus.FINISHED, fn=TrainerFn.FITTING, stage=None)
    assert trainer.state != TrainerState()


class ManualPlateau(Regressor):
    """Manual optimisation stepping its own ReduceLROnPlateau (given as a dict with a monitor, or bare)."""

    def __init__(self, as_dict: bool) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.as_dict = as_dict

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()

    def on_train_epoch_end(self) -> None:
        self.lr_schedulers().step(torch.tensor(0.0))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        scheduler = {"scheduler": plateau, "monitor": "train_loss", "interval": "step"} if self.as_dict else plateau
        return [optimizer], [scheduler]


def test_manual_optimisation_takes_a_plateau_scheduler_without_monitor() -> None:
    # Lightning 2.6.6: under manual optimisation monitor / strict / reduce_on_plateau are ignored with a warning,
    # a bare ReduceLROnPlateau needs no monitor, and the interval is kept.
    trainer = Trainer(**QUIET, max_epochs=1)
    with pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be ignored"):
        trainer.fit(ManualPlateau(as_dict=True), data(n=8))
    assert trainer.lr_scheduler_configs[0].interval == "step"
    Trainer(**QUIET, max_epochs=1).fit(ManualPlateau(as_dict=False), data(n=8))


class SchedulerReader(Regressor):
    """SGD(lr=1) with StepLR(gamma=10) per epoch or per step; records what on_save_checkpoint sees."""

    def __init__(self, interval: str) -> None:
        super().__init__()
        self.interval = interval
        self.seen: list[dict[str, Any]] = []
        self.loaded: list[str] = []

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=10)
        return [optimizer], [{"scheduler": scheduler, "interval": self.interval}]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.seen.append({"scheduler": checkpoint["lr_schedulers"][0], "step": checkpoint["global_step"],
                          "weights": sorted(checkpoint["state_dict"]),
                          "optimizers": len(checkpoint["optimizer_states"])})
        checkpoint["mine"] = 1

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded = sorted(checkpoint)


@pytest.mark.parametrize(("interval", "steps"), [("epoch", 1), ("step", 2)])
def test_on_save_checkpoint_sees_lightnings_keys(tmp_path: Any, interval: str, steps: int) -> None:
    # Lightning 2.6.6 (tests_pytorch/trainer/optimization/test_optimizers.py): after 2 batches of 1 epoch the
    # saved scheduler has stepped once per epoch or once per batch: _step_count - 1 and _last_lr [10 ** steps].
    from callbacks import ModelCheckpoint

    module = SchedulerReader(interval)
    trainer = Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=1, limit_train_batches=2,
                      project_dir=str(tmp_path), callbacks=[ModelCheckpoint(dirpath=str(tmp_path))])
    trainer.fit(module, data(n=8))
    (seen,) = module.seen
    assert seen["scheduler"]["_step_count"] - 1 == steps and seen["scheduler"]["_last_lr"] == [10.0 ** steps]
    assert seen["weights"] == ["net.bias", "net.weight"] and seen["optimizers"] == 1 and seen["step"] == 2
    Trainer(**QUIET, max_epochs=2, limit_train_batches=2, project_dir=str(tmp_path)).fit(
        module, data(n=8), ckpt_path=trainer.checkpoint_callback.best_model_path)
    assert module.loaded == ["epoch", "global_step", "mine"]  # the views are not saved a second time


def test_the_running_stage_reads_as_lightnings_enum_and_is_saved_as_a_plain_string(tmp_path: Any) -> None:
    # Lightning code reads trainer.state.stage.value (its progress-bar tests do, in every hook).
    from callbacks import Callback
    from trainer.states import RunningStage

    seen: list[tuple[Any, str]] = []

    class Stages(Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            seen.append((trainer.state.stage, trainer.state.stage.value))

        def on_validation_batch_start(self, trainer: Any, *args: Any) -> None:
            seen.append((trainer.state.stage, trainer.state.stage.value))

    trainer = Trainer(**{**QUIET, "num_sanity_val_steps": 1}, max_epochs=1, callbacks=[Stages()])
    trainer.fit(Regressor(), data(n=4, batch_size=4), data(n=4, batch_size=4))
    assert seen == [(RunningStage.SANITY_CHECKING, "sanity_check"), (RunningStage.TRAINING, "train"),
                    (RunningStage.VALIDATING, "validate")]
    assert all(isinstance(stage, RunningStage) and stage == value for stage, value in seen)
    assert trainer.state.stage == "idle"  # between runs (Lightning: None)
    path = str(tmp_path / "s.ckpt")
    trainer.save_checkpoint(path)
    saved = torch.load(path)  # weights_only: a saved enum would need unpickling
    stages = [v for v in _walk(saved) if isinstance(v, str) and v in ("idle", "train", "validate")]
    assert stages and all(type(v) is str for v in stages)


def _walk(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _walk(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _walk(v)]
    return [value]


def test_setup_gets_a_trainer_fn_and_the_stage_is_set_before_it_and_metrics_reset_once_per_epoch() -> None:
    # Lightning 2.6.6 (tests_pytorch/trainer/logging_/test_logger_connector.py::test_metrics_reset): setup(stage)
    # receives a TrainerFn (stage.value works), trainer.state.stage is already the running stage, and a logged
    # torchmetrics Metric is reset once at each epoch end.
    from torchmetrics.classification import BinaryAccuracy

    from trainer.states import RunningStage, TrainerFn

    seen: list[Any] = []
    resets: list[int] = []

    class Model(Regressor):
        def setup(self, stage: str) -> None:
            seen.append((stage, stage.value, self.trainer.state.stage))  # type: ignore[attr-defined]
            self.acc = BinaryAccuracy()
            reset = self.acc.reset
            self.acc.reset = lambda: (resets.append(1), reset())[1]  # type: ignore[method-assign]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.acc(torch.rand(4), torch.randint(0, 2, (4,)))
            resets.clear()  # forward resets its batch state: count only what the trainer does
            self.log("acc", self.acc)
            return super().training_step(batch, batch_idx)

    trainer = Trainer(**{**QUIET, "max_epochs": 1})
    trainer.fit(Model(), data(8, 4))
    assert seen == [(TrainerFn.FITTING, "fit", RunningStage.TRAINING)] and resets == [1]
