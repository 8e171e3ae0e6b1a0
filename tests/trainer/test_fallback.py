"""fit(ckpt_path="last") steps past a damaged newest checkpoint (as the engine's load_state does); an explicit
damaged path, or nothing intact, fails with what to do."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from engine.checkpoint_io import CorruptCheckpointError
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


def _fit(project: Path, max_epochs: int, ckpt_path: str | None = None) -> Regressor:
    checkpoint = ModelCheckpoint(save_top_k=-1, filename="{epoch}")  # every epoch's checkpoint is kept
    trainer = Trainer(**QUIET, max_epochs=max_epochs, seed=0, project_dir=str(project), callbacks=[checkpoint])
    torch.manual_seed(0)
    module = Regressor()  # the same initial weights in every run
    trainer.fit(module, data(n=16, batch_size=4, shuffle=True), data(n=8), ckpt_path=ckpt_path)
    return module


def _flip(path: Path, count: int = 16) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(count):  # the last bytes: tensor data, so the file still parses and only the checksum tells
        raw[-1 - i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_last_falls_back_past_a_damaged_newest_checkpoint_and_ends_bitwise_equal(tmp_path: Path,
                                                                                   capsys: Any) -> None:
    reference = _fit(tmp_path / "reference", max_epochs=4)
    _fit(tmp_path / "run", max_epochs=3)
    folders = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(folders)) == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt"]
    _flip(folders / "epoch=2.ckpt" / "model.safetensors")
    capsys.readouterr()
    damaged = re.escape(str(folders / "epoch=2.ckpt" / "model.safetensors"))
    with pytest.warns(UserWarning, match=r"fit\(ckpt_path='last'\): Checkpoint .*epoch=2\.ckpt is corrupted: " + damaged +
                      r" has 184 bytes with xxh3_64x16m \w+, its manifest says 184 bytes with \w+\. Falling back to the "
                      r"previous committed checkpoint .*epoch=1\.ckpt\."):
        resumed = _fit(tmp_path / "run", max_epochs=4, ckpt_path="last")
    assert "Resumed from " + str(folders / "epoch=1.ckpt") in capsys.readouterr().out
    for name, value in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name  # bitwise, as if never interrupted


def test_an_explicit_damaged_checkpoint_or_none_intact_fails_with_advice(tmp_path: Path) -> None:
    _fit(tmp_path, max_epochs=2)
    folders = tmp_path / "checkpoints"
    _flip(folders / "epoch=1.ckpt" / "model.safetensors")
    with pytest.raises(CorruptCheckpointError, match=r"fit\(ckpt_path='.*epoch=1\.ckpt'\): .*corrupted.* Pass "
                                                     r"ckpt_path='last' to resume from the newest checkpoint that "
                                                     r"verifies"):
        _fit(tmp_path, max_epochs=3, ckpt_path=str(folders / "epoch=1.ckpt"))
    _flip(folders / "epoch=0.ckpt" / "model.safetensors")
    with pytest.raises(CorruptCheckpointError, match=r"none of the 2 committed checkpoint\(s\) verifies:\n  .*epoch=1.ckpt: "
                                                     r".*\n  .*epoch=0.ckpt: .*\nTo start a new run, pass ckpt_path=None"), \
            pytest.warns(UserWarning, match="Falling back"):
        _fit(tmp_path, max_epochs=3, ckpt_path="last")
