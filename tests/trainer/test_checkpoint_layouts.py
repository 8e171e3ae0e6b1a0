"""Checkpoint folders written before checkpoints were files keep loading beside ``.ckpt`` files: ``"last"`` finds
the newest of either, an explicit folder path resumes exactly, and a file written at a folder's path replaces it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from callbacks import Callback, ModelCheckpoint
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class OldLayout(Callback):
    """Writes each epoch's checkpoint as the trainer did before files: an engine folder, at the same boundary."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        path = str(self.directory / f"epoch={trainer.current_epoch}.ckpt")
        trainer.run_at_boundary(lambda: _old_folder(trainer, path))


def _trainer(project: Path, max_epochs: int, old: bool = False) -> Trainer:
    callbacks: list[Callback] = [OldLayout(project / "checkpoints")] if old else [
        ModelCheckpoint(filename="{epoch}", save_top_k=-1)]
    return Trainer(**{**QUIET, "enable_checkpointing": not old}, max_epochs=max_epochs, seed=0,
                   project_dir=str(project), callbacks=callbacks)


def _old_folder(trainer: Trainer, path: str) -> str:
    """The layout before files: the engine folder with the trainer's entry and the gradients, as it was written."""
    return trainer.accelerator.save_state(path, include_gradients=True)


def test_an_old_folder_and_new_files_resume_alike(tmp_path: Path) -> None:
    uninterrupted = _trainer(tmp_path / "reference", 3)
    torch.manual_seed(0)  # after the Trainer (its seed=0): the same initial weights in every run
    reference = Regressor()
    uninterrupted.fit(reference, data(n=16, batch_size=4, shuffle=True))

    run = tmp_path / "run"
    first = _trainer(run, 1, old=True)
    torch.manual_seed(0)
    first.fit(Regressor(), data(n=16, batch_size=4, shuffle=True))
    checkpoints = run / "checkpoints"
    folder = str(checkpoints / "epoch=0.ckpt")
    assert os.path.isfile(os.path.join(folder, "manifest.json"))  # a folder, in the old layout
    second = _trainer(run, 2)
    resumed = Regressor()
    second.fit(resumed, data(n=16, batch_size=4, shuffle=True), ckpt_path="last")  # finds the folder
    assert os.path.isfile(checkpoints / "epoch=1.ckpt")  # and goes on writing files
    third = _trainer(run, 3)
    final = Regressor()
    third.fit(final, data(n=16, batch_size=4, shuffle=True), ckpt_path="last")  # the file is newer
    for name, value in reference.state_dict().items():
        assert torch.equal(final.state_dict()[name], value), name  # bitwise, across both layouts
    again = _trainer(tmp_path / "again", 3)
    explicit = Regressor()
    again.fit(explicit, data(n=16, batch_size=4, shuffle=True), ckpt_path=folder)  # an explicit old folder
    for name, value in reference.state_dict().items():
        assert torch.equal(explicit.state_dict()[name], value), name


def test_a_file_replaces_a_folder_at_its_path(tmp_path: Path) -> None:
    trainer = Trainer(**QUIET, max_epochs=1, seed=0)
    trainer.fit(Regressor(), data())
    path = str(tmp_path / "last.ckpt")
    _old_folder(trainer, path)
    trainer.save_checkpoint(path)
    assert os.path.isfile(path) and os.listdir(tmp_path) == ["last.ckpt"]
    assert torch.load(path)["global_step"] == 4


def test_save_last_link_points_at_the_newest_file_and_resumes(tmp_path: Path) -> None:
    def run(max_epochs: int, ckpt_path: str | None = None) -> Trainer:
        callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="step", mode="max", save_top_k=2,
                                   save_last="link")
        trainer = Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=max_epochs, seed=0,
                          callbacks=[callback])
        trainer.fit(Regressor(), data(), ckpt_path=ckpt_path)
        return trainer

    run(3)
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"]  # epoch=0 rotated out
    assert os.path.islink(tmp_path / "last.ckpt") and os.readlink(tmp_path / "last.ckpt") == "epoch=2.ckpt"
    assert torch.load(tmp_path / "last.ckpt")["epoch"] == 2  # through the link, a file torch.load reads
    resumed = run(4, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.global_step == 16 and os.readlink(tmp_path / "last.ckpt") == "epoch=3.ckpt"
    assert sorted(os.listdir(tmp_path)) == ["epoch=2.ckpt", "epoch=3.ckpt", "last.ckpt"]
