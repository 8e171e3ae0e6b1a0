"""ModelCheckpoint(async_save=True) / trainer.save_checkpoint(async_save=True): the same folders and exact resume
as synchronous saves, replaced checkpoints deleted only after the commit, fit ends with its checkpoints committed,
preemption saves synchronous, a failed background write raised by fit."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from engine import Accelerator
from engine.checkpoint import io as checkpoint_io  # the real module: a test patches its private writer
from engine.checkpoint.io import CheckpointError
from tests.trainer.helpers import QUIET, SAVING, Regressor, data
from tests.trainer.test_checkpoint import NOISY, _fit
from tests.trainer.test_preemption import Signal
from trainer import Trainer
from trainer.checkpoint.checkpointer import Checkpointer


@pytest.fixture
def save_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The ``async_save`` of every checkpoint written, in order: each ``Accelerator.save_state`` call, and each
    ``.ckpt`` file written (always synchronously: False)."""
    calls: list[bool] = []
    real, real_file = Accelerator.save_state, Checkpointer._write_file

    def recording(self: Accelerator, *args: Any, async_save: bool = False, **kwargs: Any) -> str:
        calls.append(async_save)
        return real(self, *args, async_save=async_save, **kwargs)

    def recording_file(self: Checkpointer, *args: Any, **kwargs: Any) -> None:
        calls.append(False)
        real_file(self, *args, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", recording)
    monkeypatch.setattr(Checkpointer, "_write_file", recording_file)
    return calls


def test_async_top_k_keeps_the_same_folders_and_resumes_exactly(tmp_path: Any, save_calls: list[bool]) -> None:
    options = {"filename": "epoch={epoch}-step={step}-{val/score:.2f}", "monitor": "val/score", "mode": "max",
               "save_top_k": 3, "save_last": True}
    sync = _fit(str(tmp_path / "sync"), len(NOISY), **options)
    assert save_calls and not any(save_calls)
    save_calls.clear()
    asynchronous = _fit(str(tmp_path / "async"), len(NOISY), async_save=True, **options)
    assert save_calls and all(save_calls)
    # fit returned with every checkpoint committed and the replaced ones deleted: the same folders as in sync.
    assert sorted(os.listdir(tmp_path / "async")) == sorted(os.listdir(tmp_path / "sync"))
    assert sorted(map(os.path.basename, asynchronous.best_k_models)) == sorted(
        map(os.path.basename, sync.best_k_models))

    resumed_dir = str(tmp_path / "resumed")
    _fit(resumed_dir, 6, async_save=True, **options)
    resumed = _fit(resumed_dir, len(NOISY), ckpt_path="last", async_save=True, **options)
    assert sorted(os.listdir(resumed_dir)) == sorted(os.listdir(tmp_path / "sync"))
    assert os.path.basename(resumed.last_model_path) == os.path.basename(sync.last_model_path)


def test_save_checkpoint_in_the_background_is_committed_when_fit_returns(tmp_path: Any,
                                                                         save_calls: list[bool]) -> None:
    class SaveEachEpoch(Callback):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            trainer.save_checkpoint(tmp_path / f"epoch{trainer.current_epoch}", async_save=True)

    trainer = Trainer(**QUIET, max_epochs=3, seed=0, callbacks=[SaveEachEpoch()], project_dir=str(tmp_path))
    module = Regressor()
    trainer.fit(module, data(n=8))
    assert save_calls == [True, True, True]
    assert trainer.accelerator.wait_for_checkpoint() is None  # nothing left in flight
    resumed = Trainer(**QUIET, max_epochs=3, seed=0, project_dir=str(tmp_path))
    again = Regressor()
    resumed.fit(again, data(n=8), ckpt_path=str(tmp_path / "epoch2"))
    assert torch.equal(again.net.weight, module.net.weight) and resumed.global_step == trainer.global_step


@pytest.mark.parametrize("every", [1, 2])  # the preempted step was just saved in the background, or not
def test_the_preemption_save_is_synchronous(tmp_path: Any, save_calls: list[bool], every: int) -> None:
    callback = ModelCheckpoint(every_n_train_steps=every, async_save=True)
    trainer = Trainer(**SAVING, max_epochs=2, accumulate_grad_batches=2, seed=0, project_dir=str(tmp_path),
                      callbacks=[callback, Signal(at=5)])
    with pytest.raises(SystemExit):
        trainer.fit(Regressor(), data(n=24))
    # Step 3's checkpoint is on disk when the process stops: written synchronously, or waited for.
    assert save_calls == ([True, True, True] if every == 1 else [True, False])
    assert trainer.accelerator._checkpointer.async_checkpointer.in_flight is False  # type: ignore[union-attr]
    # Just saved at step 3 (every=1), or step 2's checkpoint and the preemption's last.ckpt at step 3.
    expected = ["epoch=0-step=3.ckpt"] if every == 1 else ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == expected


def test_a_failed_background_write_is_raised_by_fit(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = checkpoint_io._write_all

    def full(fd: int, view: memoryview) -> None:
        if threading.current_thread().name.startswith("ember-checkpoint-writer"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, view)

    monkeypatch.setattr(checkpoint_io, "_write_all", full)
    callback = ModelCheckpoint(dirpath=str(tmp_path), async_save=True)
    trainer = Trainer(**SAVING, max_epochs=1, seed=0, callbacks=[callback])
    with pytest.raises(CheckpointError, match=r"asynchronous save of checkpoint .*epoch=0-step=2.ckpt failed.*No space"):
        trainer.fit(Regressor(), data(n=8))
    assert os.listdir(tmp_path) == []


def test_async_save_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"ModelCheckpoint\(async_save=...\) must be True or False. Received: 1"):
        ModelCheckpoint(async_save=1)  # type: ignore[arg-type]
