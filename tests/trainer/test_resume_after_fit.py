"""A checkpoint written after ``fit`` returns continues at the next batch of the run that wrote it (issue 39).

Whichever way fit ended inside an epoch (``max_steps``, ``max_time``, ``trainer.should_stop``, with
``limit_train_batches``), ``trainer.save_checkpoint`` afterwards holds the position where training stopped, as a
``ModelCheckpoint`` of the same step does; resuming it with a larger budget gives the uninterrupted run's batches
and bits. Lightning 2.6.6 starts a new epoch there instead (observed: ``current_epoch`` is 1 after ``max_steps=6``
of a 10-batch epoch and its ``.ckpt`` holds ``epoch=1``), skipping the rest of the epoch: a deliberate difference.
An exception checkpoint continues exactly where it is complete (an exception outside a training batch); inside a
batch a complete checkpoint is refused, saying what to do.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from engine.checkpoint.io import CheckpointError
from tests.trainer.helpers import QUIET, Regressor
from trainer import Trainer

BATCHES = 10  # per epoch


class Tracing(Regressor):
    """Dropout (RNG), a shuffled loader (the sampler's generator), an epoch-interval scheduler; records the first
    sample index of every training batch."""

    def __init__(self) -> None:
        super().__init__(lr=0.05)
        self.drop = torch.nn.Dropout(0.2)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.drop(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        index, x, y = batch
        self.seen.append(int(index[0]))
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _, x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4 * BATCHES, 3, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(torch.arange(4 * BATCHES), x, y), batch_size=4, shuffle=True,
                      generator=torch.Generator().manual_seed(5))


class StopAt(Callback):
    """``trainer.should_stop = True`` after global step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


class Slow(Callback):
    """Makes each batch take a while, so a small ``max_time`` stops fit inside an epoch."""

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        time.sleep(0.05)


def fit(root: str, ckpt_path: str | None = None, callbacks: tuple[Callback, ...] = (), **limits: Any) -> Tracing:
    torch.manual_seed(0)
    module = Tracing()
    trainer = Trainer(**{**QUIET, "default_root_dir": root, "callbacks": list(callbacks), **limits})
    trainer.fit(module, loader(), ckpt_path=ckpt_path)
    module.trainer_after = trainer  # type: ignore[attr-defined]
    return module


def assert_continues(tmp_path: Any, stop: dict[str, Any], callbacks: tuple[Callback, ...] = (),
                     budget: dict[str, Any] | None = None) -> tuple[Tracing, Tracing]:
    """Fit until ``stop`` ends it, save after fit, resume to ``budget`` (default 2 epochs); the resumed run must
    train the uninterrupted run's remaining batches and end with its bits."""
    budget = budget or {"max_epochs": 2}
    full = fit(str(tmp_path / "full"), **budget)
    first = fit(str(tmp_path / "first"), callbacks=callbacks, **{**budget, **stop})
    path = str(tmp_path / "after_fit.ckpt")
    first.trainer_after.save_checkpoint(path)  # type: ignore[attr-defined]
    done = len(first.seen)
    assert 0 < done < len(full.seen)
    resumed = fit(str(tmp_path / "resumed"), ckpt_path=path, **budget)
    assert resumed.seen == full.seen[done:]  # the stopped epoch's remaining batches, not a new epoch
    for name, value in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    full_optimizer = full.trainer_after.optimizers[0].state_dict()  # type: ignore[attr-defined]
    resumed_optimizer = resumed.trainer_after.optimizers[0].state_dict()  # type: ignore[attr-defined]
    assert resumed_optimizer["param_groups"] == full_optimizer["param_groups"]  # the epoch scheduler's lr too
    return first, resumed


def test_max_steps_mid_epoch_then_save_continues_at_the_next_batch(tmp_path: Any,
                                                                   capsys: pytest.CaptureFixture) -> None:
    first, _ = assert_continues(tmp_path, {"max_steps": 6}, budget={"max_steps": 14})
    assert first.trainer_after.current_epoch == 1  # type: ignore[attr-defined]  # Lightning's count after fit
    assert "Resumed from" in capsys.readouterr().out.split("at epoch 0, batch 6, step 6.")[0]


def test_a_stop_request_then_save_continues_at_the_next_batch(tmp_path: Any) -> None:
    assert_continues(tmp_path, {}, callbacks=(StopAt(13),))  # inside the second epoch


def test_limited_epochs_then_save_continue_at_the_next_batch(tmp_path: Any) -> None:
    assert_continues(tmp_path, {"max_steps": 5}, budget={"max_epochs": 2, "limit_train_batches": 8})


def test_max_time_then_save_continues_at_the_next_batch(tmp_path: Any) -> None:
    assert_continues(tmp_path, {"max_time": 0.25}, callbacks=(Slow(),))  # wherever the clock stops it


def test_a_stop_on_the_last_batch_of_an_epoch_continues_at_the_next_epoch(tmp_path: Any) -> None:
    assert_continues(tmp_path, {"max_steps": BATCHES})


class FailingValidation(Tracing):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.trainer.global_step == 4:
            raise RuntimeError("validation failed")
        super().validation_step(batch, batch_idx)


class SaveOnException(Callback):
    """A complete checkpoint on failure (Lightning's ``OnExceptionCheckpoint`` saves a complete one)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.error: BaseException | None = None

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        try:
            trainer.save_checkpoint(self.path)
        except CheckpointError as error:
            self.error = error


def test_an_exception_checkpoint_outside_a_batch_continues_exactly(tmp_path: Any) -> None:
    val = DataLoader(TensorDataset(torch.arange(8), torch.randn(8, 3), torch.randn(8, 1)), batch_size=4)
    kw = {**QUIET, "max_epochs": 2, "val_check_interval": 2}
    torch.manual_seed(0)
    full, trainer = Tracing(), Trainer(**kw, default_root_dir=str(tmp_path / "full"))
    trainer.fit(full, loader(), val)
    path = str(tmp_path / "exception.ckpt")
    saver = SaveOnException(path)
    torch.manual_seed(0)
    failing = FailingValidation()
    with pytest.raises(RuntimeError, match="validation failed"):
        Trainer(**kw, default_root_dir=str(tmp_path / "first"), callbacks=[saver]).fit(failing, loader(), val)
    assert saver.error is None and os.path.isfile(path)
    torch.manual_seed(0)
    resumed = Tracing()
    Trainer(**kw, default_root_dir=str(tmp_path / "resumed")).fit(resumed, loader(), val, ckpt_path=path)
    assert resumed.seen == full.seen[4:]
    for name, value in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


class FailingStep(Tracing):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 3:
            raise RuntimeError("bad batch")
        return super().training_step(batch, batch_idx)


def test_a_complete_checkpoint_inside_a_failed_batch_is_refused_saying_what_to_do(tmp_path: Any) -> None:
    saver = SaveOnException(str(tmp_path / "exception.ckpt"))
    trainer = Trainer(**QUIET, max_epochs=1, default_root_dir=str(tmp_path), callbacks=[saver])
    with pytest.raises(RuntimeError, match="bad batch"):
        trainer.fit(FailingStep(), loader())
    assert saver.error is not None and not os.path.exists(saver.path)
    message = str(saver.error)
    assert "training batch 3 of epoch 0" in message and "weights_only=True" in message
    trainer.save_checkpoint(str(tmp_path / "weights.ckpt"), weights_only=True)  # the weights can still be kept
    with pytest.raises(CheckpointError, match="ckpt_path='last'"):
        trainer.save_checkpoint(str(tmp_path / "after.ckpt"))  # nor after fit returned with the batch open


def test_budgeted_runs_with_the_default_checkpoint_continue_exactly(tmp_path: Any) -> None:
    """A job that trains a budget of steps per allocation: the default ModelCheckpoint's epoch-end save of a fit
    stopped by ``max_steps`` continues at the next batch, so ``ckpt_path="last"`` runs chain to the uninterrupted
    result."""
    full = fit(str(tmp_path / "full"), max_steps=14)
    root = str(tmp_path / "budgeted")
    seen: list[int] = []
    for budget in (4, 9, 14):
        torch.manual_seed(0)
        module = Tracing()
        trainer = Trainer(**{**QUIET, "enable_checkpointing": True, "default_root_dir": root, "max_steps": budget})
        trainer.fit(module, loader(), ckpt_path="last")
        seen += module.seen
    assert seen == full.seen
    for name, value in full.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name
