"""Preemption signals, max_time, non-finite losses and exceptions: how a run ends, and what it leaves behind."""

from __future__ import annotations

import os
import signal
from typing import Any
from unittest import mock

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data, quiet
from trainer import Trainer
from trainer.loop.signals import Preempted


class Signal(Callback):
    """Sends this process ``signum`` at the start of one micro-step."""

    def __init__(self, at: int, signum: int = signal.SIGTERM) -> None:
        self.at, self.signum = at, signum

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.state.micro_step == self.at:
            os.kill(os.getpid(), self.signum)


class Finishes(MemoryTracker):
    finished = False

    def finish(self) -> None:
        self.finished = True


def _trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    return Trainer(**{**quiet(kwargs.get("callbacks")), "max_epochs": 2, "accumulate_grad_batches": 2, "seed": 0,
                      "project_dir": str(tmp_path), **kwargs})


def test_a_signal_saves_at_the_next_step_finishes_trackers_and_exits(tmp_path: Any) -> None:
    tracker = Finishes()
    trainer = _trainer(tmp_path, log_with=[tracker], callbacks=[Signal(at=3, signum=signal.SIGUSR1)],
                       preemption_signals=("SIGTERM", signal.SIGUSR1), preemption_exit_code=7)
    with pytest.raises(Preempted, match=r"Preempted by SIGUSR1 at epoch 0, batch 4, step 2.*ckpt_path='last'") as info:
        trainer.fit(Regressor(), data(n=24))
    assert info.value.code == 7 and tracker.finished
    assert os.listdir(tmp_path / "checkpoints") == ["preempted"]  # no ModelCheckpoint: the trainer's own folder
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the previous handler is back

    full = _trainer(tmp_path / "full")
    full_module = Regressor()
    full.fit(full_module, data(n=24))
    resumed = _trainer(tmp_path)
    module = Regressor()
    resumed.fit(module, data(n=24), ckpt_path="last")
    assert torch.equal(module.net.weight, full_module.net.weight) and resumed.global_step == full.global_step


def test_with_a_model_checkpoint_the_preemption_save_is_its_last(tmp_path: Any) -> None:
    callback = ModelCheckpoint(monitor="train/loss", save_top_k=1)
    trainer = _trainer(tmp_path, callbacks=[callback, Signal(at=5)])
    with pytest.raises(SystemExit) as info:
        trainer.fit(Regressor(), data(n=24))
    assert info.value.code == 143  # the default: 128 + SIGTERM
    assert os.path.basename(callback.last_model_path) == "last.ckpt" and callback.best_k_models == {}
    assert os.listdir(tmp_path / "checkpoints") == ["last.ckpt"]  # the position at step 3


def test_max_time_saves_the_position_with_a_model_checkpoint(tmp_path: Any) -> None:
    class Slow(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            import time
            time.sleep(0.1)

    callback = ModelCheckpoint(save_top_k=0)
    trainer = _trainer(tmp_path, max_time=0.15, callbacks=[callback, Slow()])
    trainer.fit(Regressor(), data(n=24))
    assert trainer.global_step == 1
    assert os.path.basename(callback.last_model_path) == "last.ckpt"  # the position at step 1
    assert os.listdir(tmp_path / "checkpoints") == ["last.ckpt"]


def test_a_signal_after_training_is_not_swallowed(tmp_path: Any) -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    try:
        class Late(Callback):
            def on_train_end(self, *args: Any) -> None:
                os.kill(os.getpid(), signal.SIGUSR2)

        _trainer(tmp_path, callbacks=[Late()], preemption_signals=[signal.SIGUSR2]).fit(Regressor(), data())
        assert received == [signal.SIGUSR2]  # re-raised to the handler that was there before fit
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_handler_installed_before_fit_runs_too_and_the_run_still_saves(tmp_path: Any) -> None:
    # Lightning composes its handler with one already installed (a user's, an orchestrator's): both run.
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        trainer = _trainer(tmp_path, callbacks=[Signal(at=3)])
        with pytest.raises(Preempted, match="Preempted by SIGTERM"):
            trainer.fit(Regressor(), data(n=24))
        assert received == [signal.SIGTERM]  # once: when it arrived, not again when fit ends
        assert trainer.received_sigterm and os.listdir(tmp_path / "checkpoints") == ["preempted"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_bad_preemption_arguments() -> None:
    with pytest.raises(ValueError, match=r"preemption_signals=...\) takes signal numbers or names .* 'SIGNOPE'"):
        Trainer(**QUIET, preemption_signals=["SIGNOPE"])
    with pytest.raises(ValueError, match="cannot handle SIGKILL"):
        Trainer(**QUIET, preemption_signals=[signal.SIGKILL])
    with pytest.raises(ValueError, match=r"preemption_exit_code=...\) must be an int in \[0, 255\]. Received: 300"):
        Trainer(**QUIET, preemption_exit_code=300)
    with pytest.raises(ValueError, match=r"on_nonfinite_loss=...\) must be one of \('raise', 'skip', 'ignore'\)"):
        Trainer(**QUIET, on_nonfinite_loss="warn")


class NanAt(Regressor):
    """Its loss is NaN at one batch index of epoch 0."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.bad_batch = batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        bad = self.trainer.current_epoch == 0 and batch_idx == self.bad_batch
        return loss * float("nan") if bad else loss


def test_a_non_finite_loss_stops_with_the_step_and_value_before_any_checkpoint(tmp_path: Any) -> None:
    callback = ModelCheckpoint(every_n_train_steps=1)
    trainer = _trainer(tmp_path, callbacks=[callback], log_every_n_steps=50)
    with pytest.raises(FloatingPointError, match=r"Non-finite loss: rank 0: nan at optimizer step 2 \(epoch 0, "
                                                 r"batch 2\).*on_nonfinite_loss='skip'"):
        trainer.fit(NanAt(2), data(n=24))
    assert os.listdir(tmp_path / "checkpoints") == ["epoch=0-step=1.ckpt"]  # step 2's weights were never saved


def test_skip_drops_the_step_and_goes_on(tmp_path: Any) -> None:
    module = NanAt(2)
    trainer = _trainer(tmp_path, on_nonfinite_loss="skip")
    with pytest.warns(UserWarning, match=r"rank 0: nan at optimizer step 2 \(epoch 0, batch 2\). Skipping"):
        trainer.fit(module, data(n=24))
    assert trainer.global_step == 5 and torch.isfinite(module.net.weight).all()  # 6 windows, one dropped
    ignored = NanAt(2)
    _trainer(tmp_path, on_nonfinite_loss="ignore").fit(ignored, data(n=24))
    assert not torch.isfinite(ignored.net.weight).all()


def test_detect_anomaly_is_on_during_fit_only(tmp_path: Any) -> None:
    seen: list[bool] = []

    class Look(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            seen.append(torch.is_anomaly_enabled())

    _trainer(tmp_path, detect_anomaly=True, callbacks=[Look()], max_epochs=1).fit(Regressor(), data())
    assert seen and all(seen) and not torch.is_anomaly_enabled()


def test_an_exception_runs_on_exception_and_finishes_the_trackers(tmp_path: Any) -> None:
    seen: list[BaseException] = []

    class Fails(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            raise KeyError("boom")

        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            seen.append(exception)

    tracker = Finishes()
    trainer = _trainer(tmp_path, log_with=[tracker], callbacks=[Fails()])
    with pytest.raises(KeyError, match="boom"):
        trainer.fit(Regressor(), data())
    assert isinstance(seen[0], KeyError) and tracker.finished


def test_on_exception_goes_to_the_callbacks_the_data_module_then_the_strategy(tmp_path: Any) -> None:
    # Lightning 2.6's order (trainer/call.py's _interrupt): callbacks, data module, strategy, loggers.
    from trainer import DataModule

    order: list[str] = []
    error = RuntimeError("boom")

    class Fails(Callback):
        def on_train_start(self, *args: Any) -> None:
            raise error

        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            order.append("callback" if exception is error else "?")

    class Data(DataModule):
        def train_dataloader(self) -> Any:
            return data()

        def on_exception(self, exception: BaseException) -> None:
            order.append("datamodule" if exception is error else "?")

    trainer = _trainer(tmp_path, callbacks=[Fails()])
    strategy = trainer.strategy
    with (mock.patch.object(type(strategy), "on_exception", lambda self, exception: order.append("strategy")),
          pytest.raises(RuntimeError, match="boom")):
        trainer.fit(Regressor(), datamodule=Data())
    assert order == ["callback", "datamodule", "strategy"]
