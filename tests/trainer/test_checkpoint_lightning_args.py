"""ModelCheckpoint's remaining Lightning arguments: save_weights_only and enable_version_counter."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from callbacks import ModelCheckpoint
from tests.trainer.helpers import SAVING, Regressor, data
from trainer import Trainer


def test_save_weights_only_writes_loadable_weights_and_rotates(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_weights_only=True)  # the newest epoch kept
    module = Regressor(lr=0.2)
    Trainer(**SAVING, max_epochs=3, callbacks=[checkpoint]).fit(module, data())
    assert os.listdir(tmp_path / "ckpt") == ["epoch=2-step=12.ckpt"]  # older weights-only folders were removed
    saved = torch.load(checkpoint.best_model_path)  # Lightning's weights-only keys: no optimizer or callbacks
    assert "state_dict" in saved and not {"optimizer_states", "lr_schedulers", "callbacks"} & set(saved)
    loaded = Regressor.load_from_checkpoint(checkpoint.best_model_path, lr=0.2)
    assert torch.equal(loaded.net.weight, module.net.weight)


def test_version_counter_or_replacement_of_a_taken_name(tmp_path: Path) -> None:
    for counter, expected in ((True, ["epoch=0-step=4-v1.ckpt", "epoch=0-step=4.ckpt"]),
                              (False, ["epoch=0-step=4.ckpt"])):
        folder = tmp_path / str(counter)
        for _ in range(2):  # the second run saves under the name the first one took
            checkpoint = ModelCheckpoint(dirpath=folder, save_top_k=-1, enable_version_counter=counter)
            Trainer(**SAVING, max_epochs=1, callbacks=[checkpoint]).fit(Regressor(), data())
        assert sorted(os.listdir(folder)) == expected
