"""fit(ckpt_path="last") steps past a damaged newest checkpoint (as the engine's load_state does), only to a
checkpoint of the same run; an explicit damaged path, or nothing intact, fails with what to do; a checkpoint of
another model is an error naming both; resuming a finished run says which limit it reached."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from engine.checkpoint.io import CheckpointError, CorruptCheckpointError
from tests.trainer.helpers import QUIET, SAVING, Regressor, damage, data
from trainer import Trainer
from trainer.checkpoint.identity import read_identity


def _fit(project: Path, max_epochs: int, ckpt_path: str | None = None) -> Regressor:
    checkpoint = ModelCheckpoint(save_top_k=-1, filename="{epoch}")  # every epoch's checkpoint is kept
    trainer = Trainer(**SAVING, max_epochs=max_epochs, seed=0, project_dir=str(project), callbacks=[checkpoint])
    torch.manual_seed(0)
    module = Regressor()  # the same initial weights in every run
    trainer.fit(module, data(n=16, batch_size=4, shuffle=True), data(n=8), ckpt_path=ckpt_path)
    return module


def _flip(path: Path) -> None:
    damage(path)  # flipped bytes in the weights: the file still loads, only its digest tells


def test_last_falls_back_past_a_damaged_newest_checkpoint_and_ends_bitwise_equal(tmp_path: Path,
                                                                                   capsys: Any) -> None:
    reference = _fit(tmp_path / "reference", max_epochs=4)
    _fit(tmp_path / "run", max_epochs=3)
    folders = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(folders)) == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt"]
    _flip(folders / "epoch=2.ckpt")
    capsys.readouterr()
    damaged = re.escape(str(folders / "epoch=2.ckpt"))
    with pytest.warns(UserWarning, match=r"fit\(ckpt_path='last'\): Checkpoint " + damaged + r" is corrupted: its "
                      r"'state_dict' has (xxh3|blake2b)-128 \w+, the file's digest says \w+ .* Falling back to the "
                      r"previous committed checkpoint .*epoch=1\.ckpt\."):
        resumed = _fit(tmp_path / "run", max_epochs=4, ckpt_path="last")
    assert "Resumed from " + str(folders / "epoch=1.ckpt") in capsys.readouterr().out
    for name, value in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name  # bitwise, as if never interrupted


def test_an_explicit_damaged_checkpoint_or_none_intact_fails_with_advice(tmp_path: Path) -> None:
    _fit(tmp_path, max_epochs=2)
    folders = tmp_path / "checkpoints"
    _flip(folders / "epoch=1.ckpt")
    with pytest.raises(CorruptCheckpointError, match=r"fit\(ckpt_path='.*epoch=1\.ckpt'\): .*corrupted.* Pass "
                                                     r"ckpt_path='last' to resume from the newest checkpoint that "
                                                     r"verifies"):
        _fit(tmp_path, max_epochs=3, ckpt_path=str(folders / "epoch=1.ckpt"))
    _flip(folders / "epoch=0.ckpt")
    with pytest.raises(CorruptCheckpointError, match=r"none of the 2 committed checkpoint\(s\) verifies:\n  .*epoch=1.ckpt: "
                                                     r".*\n  .*epoch=0.ckpt: .*\nTo start a new run, pass ckpt_path=None"), \
            pytest.warns(UserWarning, match="Falling back"):
        _fit(tmp_path, max_epochs=3, ckpt_path="last")


class Other(Regressor):
    """Another model with the same parameter names and shapes: only the run identity tells its checkpoints apart."""


def _run(project: Path, module: Regressor, max_epochs: int, prefix: str, ckpt_path: str | None = None) -> Trainer:
    checkpoint = ModelCheckpoint(save_top_k=-1, filename=prefix + "-{epoch}")
    trainer = Trainer(**SAVING, max_epochs=max_epochs, seed=0, project_dir=str(project), callbacks=[checkpoint])
    trainer.fit(module, data(n=16, batch_size=4), data(n=8), ckpt_path=ckpt_path)
    return trainer


def test_last_never_falls_back_to_another_runs_checkpoint(tmp_path: Path, capsys: Any) -> None:
    folders = tmp_path / "checkpoints"
    _run(tmp_path, Regressor(), 1, "a")  # run A: a-epoch=0
    _run(tmp_path, Other(), 2, "b")  # run B, another module in the same folder: b-epoch=0, b-epoch=1 (newer)
    first = _run(tmp_path, Regressor(), 2, "a", ckpt_path=str(folders / "a-epoch=0.ckpt"))  # A goes on: a-epoch=1
    assert first.global_step == 8
    _flip(folders / "a-epoch=1.ckpt")
    capsys.readouterr()
    # The damaged newest is A's: the fallback skips B's two newer checkpoints for A's own previous one.
    with pytest.warns(UserWarning, match=r"a-epoch=1\.ckpt is corrupted.*Falling back to the previous committed "
                                         r"checkpoint .*a-epoch=0\.ckpt\."):
        resumed = _run(tmp_path, Regressor(), 3, "a", ckpt_path="last")
    assert "Resumed from " + str(folders / "a-epoch=0.ckpt") in capsys.readouterr().out
    assert resumed.global_step == 12  # trained epochs 1 and 2, never B's counters

    # A run whose only checkpoint is damaged, beside another run's intact ones: a clear error, not B's checkpoint
    # (which, at B's epoch 2, used to end fit at once with only a warning).
    other = tmp_path / "other"
    _run(other, Other(), 2, "b")
    _run(other, Regressor(), 1, "a")
    _flip(other / "checkpoints" / "a-epoch=0.ckpt")
    with pytest.raises(CorruptCheckpointError, match=r"none of the 1 committed checkpoint\(s\) verifies:\n  "
                                                     r".*a-epoch=0\.ckpt: "):
        _run(other, Regressor(), 2, "a", ckpt_path="last")


def test_a_checkpoint_of_another_model_is_an_error_naming_both(tmp_path: Path) -> None:
    _run(tmp_path, Regressor(), 1, "a")
    folder = tmp_path / "checkpoints" / "a-epoch=0.ckpt"
    with pytest.raises(CheckpointError, match=r"fit\(ckpt_path='last'\): the checkpoint .*a-epoch=0\.ckpt was saved from "
                                              r"tests\.trainer\.helpers\.Regressor \(run \w+\), whose parameters do "
                                              r"not match the tests\.trainer\.test_fallback\.Wider being fitted: "
                                              r"other shapes: net\.weight \(checkpoint \[1, 3\], module \[1, 4\]\)\. "
                                              r"Pass the module the checkpoint was saved from"):
        _run(tmp_path, Wider(), 2, "w", ckpt_path="last")
    with pytest.raises(CheckpointError, match=r"not in the checkpoint: head\.weight, head\.bias\. "):
        _run(tmp_path, WithHead(), 2, "h", ckpt_path=str(folder))
    with pytest.raises(CheckpointError, match=r"test\(ckpt_path='.*a-epoch=0\.ckpt'\): .*Wider being evaluated"):
        Trainer(**QUIET, project_dir=str(tmp_path)).test(Wider(), data(n=8, features=4), ckpt_path=str(folder),
                                                          verbose=False)


def test_an_explicit_path_of_another_run_continues_that_run(tmp_path: Path) -> None:
    first = _run(tmp_path / "one", Regressor(), 1, "a")
    second = _run(tmp_path / "two", Other(), 2, "b", ckpt_path=str(tmp_path / "one" / "checkpoints" / "a-epoch=0.ckpt"))
    assert second.global_step == 8  # allowed: an explicit path is explicit; the class may differ, the model not
    assert second.checkpointer.entry.run_id == first.checkpointer.entry.run_id  # the checkpoint's run goes on
    assert read_identity(str(tmp_path / "two" / "checkpoints" / "b-epoch=1.ckpt"))["id"] == first.checkpointer.entry.run_id


def test_resuming_a_finished_run_says_which_limit_it_reached(tmp_path: Path, capsys: Any) -> None:
    _run(tmp_path, Regressor(), 2, "a")
    capsys.readouterr()
    again = _run(tmp_path, Regressor(), 2, "a", ckpt_path="last")
    out = capsys.readouterr().out
    # Lightning 2.6 prints "`Trainer.fit` stopped: `max_epochs=2` reached." (torchmetrics_uneven_expected.py).
    assert ("fit(ckpt_path='last'): the run already reached max_epochs=2 at epoch 2; nothing to train. Raise "
            "max_epochs to train further.") in out
    assert again.global_step == 8
    trainer = Trainer(**QUIET, max_steps=8, seed=0, project_dir=str(tmp_path))
    trainer.fit(Regressor(), data(n=16, batch_size=4), data(n=8), ckpt_path="last")
    assert "the run already reached max_steps=8 at step 8; nothing to train. Raise max_steps" in \
        capsys.readouterr().out


class Wider(Regressor):
    def __init__(self) -> None:
        super().__init__(features=4)


class WithHead(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(1, 1)
