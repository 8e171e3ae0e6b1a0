"""The Trainer's parts: one owner of the accumulation window, the frozen config and its setters, the callbacks'
Protocol, and hooks a callback skips."""

from __future__ import annotations

import io
import typing
from typing import Any

import pytest
import torch

from callbacks import Callback, GradientAccumulationScheduler, ProgressBar
from callbacks.protocols import StateView, TrainerView
from engine import Accelerator
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.loop.hooks import HookTable
from trainer.module import TrainModule


class StepRecorder(Callback):
    """Which batches an optimizer step closed, and what the engine was told for each batch."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.engine_steps: list[int] = []
        self.sync: list[bool] = []
        self._batch = -1

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._batch = batch_idx

    def on_after_backward(self, trainer: Any, module: Any) -> None:
        self.sync.append(trainer.accelerator.sync_gradients)
        self.engine_steps.append(trainer.accelerator.gradient_accumulation_steps)

    def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
        self.steps.append(self._batch)


def test_the_trainer_alone_decides_the_accumulation_window_and_tells_the_engine() -> None:
    recorder = StepRecorder()
    trainer = Trainer(**QUIET, max_epochs=1, accumulate_grad_batches=3, callbacks=[recorder])
    trainer.fit(Regressor(), data(n=28, batch_size=4))  # 7 batches: windows end at 2, 5 and the epoch's last, 6
    assert recorder.steps == [2, 5, 6]
    assert recorder.sync == [False, False, True, False, False, True, True]
    assert recorder.engine_steps == [1] * 7  # the engine's factor is never written: the trainer divides the loss
    assert trainer.global_step == 3


def test_accumulation_divides_the_loss_like_one_big_batch() -> None:
    torch.manual_seed(0)
    whole, parts = Regressor(), Regressor()
    parts.load_state_dict(whole.state_dict())
    Trainer(**QUIET, max_epochs=1).fit(whole, data(n=8, batch_size=8))
    Trainer(**QUIET, max_epochs=1, accumulate_grad_batches=2).fit(parts, data(n=8, batch_size=4))
    for a, b in zip(whole.parameters(), parts.parameters()):
        torch.testing.assert_close(a, b)


def test_the_scheduler_sets_the_factor_through_the_trainer_attribute() -> None:
    recorder = StepRecorder()
    trainer = Trainer(**QUIET, max_epochs=2, callbacks=[GradientAccumulationScheduler({1: 2}), recorder])
    trainer.fit(Regressor(), data(n=16, batch_size=4))  # 4 batches per epoch
    assert recorder.steps == [0, 1, 2, 3, 1, 3]
    assert trainer.accumulate_grad_batches == 2


def test_an_accelerator_that_accumulates_itself_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=1 and pass Trainer\(accumulate_grad_batches=2\)"):
        Trainer(accelerator=Accelerator(cpu=True, gradient_accumulation_steps=2))


def test_engine_accumulate_sync_keyword_overrides_its_own_counter() -> None:
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = acc.prepare(torch.nn.Linear(2, 1))
    with acc.accumulate(model, sync=True):
        assert acc.sync_gradients
    with acc.accumulate(model, sync=False):
        assert not acc.sync_gradients
    with acc.accumulate(model):  # Accelerate's counting: the second micro-step of four does not sync
        assert not acc.sync_gradients


def test_config_is_frozen_and_its_settable_fields_are_validated() -> None:
    trainer = Trainer(**QUIET, max_epochs=2, limit_val_batches=3)
    with pytest.raises(AttributeError, match=r"read-only after construction: pass Trainer\(limit_val_batches=5\)"):
        trainer.limit_val_batches = 5
    trainer.max_epochs = -1  # Lightning's "no limit", which trainer.max_epochs shows as Lightning does
    assert trainer.max_epochs == -1 and trainer.config.max_epochs is None
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=...\) must be an int >= 1.*Received: 0"):
        trainer.accumulate_grad_batches = 0
    bounded = Trainer(**QUIET, max_epochs=4, min_epochs=3)
    with pytest.raises(ValueError, match=r"min_epochs=3\) is larger than max_epochs=2"):
        bounded.max_epochs = 2
    with pytest.raises(AttributeError, match="set by the trainer"):
        trainer.global_step = 3


def _protocol_names(protocol: type) -> set[str]:
    names = set(typing.get_type_hints(protocol))
    names |= {name for name, value in vars(protocol).items() if not name.startswith("_")
              and (callable(value) or isinstance(value, property))}
    return names


def test_the_trainer_has_every_name_the_callbacks_protocol_lists() -> None:
    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(Regressor(), data())
    names = _protocol_names(TrainerView)
    assert len(names) >= 30
    missing = sorted(name for name in names if not hasattr(trainer, name))
    assert missing == []
    assert sorted(name for name in _protocol_names(StateView) if not hasattr(trainer.state, name)) == []


def test_a_progress_bar_writing_to_a_file_is_not_called_per_batch_and_still_counts() -> None:
    sink = io.StringIO()
    bar = ProgressBar(stream=sink)
    assert bar.skipped_hooks == frozenset({"on_train_batch_end"})
    table = HookTable("trainer", Regressor(), [bar], TrainModule)
    assert table.overriders["on_train_batch_end"] == () and table.overriders["on_train_epoch_end"]
    trainer = Trainer(**{**QUIET, "enable_progress_bar": True}, max_epochs=1, callbacks=[bar])
    trainer.fit(Regressor(), data(n=20, batch_size=4))
    assert "Epoch 0/0: 5 batches, step 5" in sink.getvalue()  # epochs from 0, as current_epoch
