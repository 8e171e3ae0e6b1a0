"""One-file ``.ckpt`` checkpoints with Lightning's keys: read by ``torch.load``'s defaults, and both ways with
Lightning 2.6.6 (files and losses recorded there by tests/parity_scripts/record_lightning_ckpt.py; Lightning is
not needed here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from engine.checkpoint.io import CorruptCheckpointError, UnsafeCheckpointError
from tests.trainer import lightning_roundtrip as roundtrip
from tests.trainer.helpers import QUIET, Regressor, damage, data
from tests.trainer.lightning_ckpt_expected import EXPECTED
from trainer import Trainer

LIGHTNING_KEYS = {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks",
                  "optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters"}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-7}  # other CPUs' kernels differ in the last bits; Ember-vs-Ember is bitwise


def _plain(value: Any, where: str = "checkpoint") -> None:
    """Only what ``weights_only=True`` allows: tensors, str / int / float / bool / None, lists, tuples, dicts."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, (str, int)), f"{where} key {key!r}"
            _plain(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _plain(item, f"{where}[{i}]")
    else:
        assert isinstance(value, (torch.Tensor, str, int, float, bool, type(None))), f"{where}: {type(value)}"


def test_a_checkpoint_is_one_file_torch_load_reads_with_its_defaults(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{step}", save_top_k=-1, save_last=True)
    trainer = Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=2, seed=0, callbacks=[callback])
    module = Regressor(lr=0.2)
    trainer.fit(module, data())
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    checkpoint = torch.load(tmp_path / "epoch=1-step=8.ckpt")  # torch's defaults: weights_only=True
    assert LIGHTNING_KEYS <= set(checkpoint) and "ember" in checkpoint
    _plain(checkpoint)
    # Lightning's meanings: the epoch just finished at an epoch's end, optimizer steps, the module's state_dict.
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (1, 8)
    assert checkpoint["hyper_parameters"] == {"lr": 0.2, "features": 3} and checkpoint["hparams_name"] == "kwargs"
    for name, value in module.state_dict().items():
        assert torch.equal(checkpoint["state_dict"][name], value), name
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] == 0.2
    assert callback.state_key in checkpoint["callbacks"]
    fit_loop = checkpoint["loops"]["fit_loop"]
    assert fit_loop["epoch_progress"]["current"] == {"ready": 2, "completed": 1, "started": 2, "processed": 2}
    assert fit_loop["epoch_loop.batch_progress"]["is_last_batch"] is True
    # Ember's exact-resume part: every rank's RNG states and loader positions; no spent gradients.
    ranks = checkpoint["ember"]["ranks"]
    assert len(ranks) == 1 and ranks[0]["rng"]["rng"] and ranks[0]["dataloaders"] and ranks[0]["gradients"] == {}


def test_a_lightning_checkpoint_loads_and_continues_as_lightning_continued_it(capsys: Any) -> None:
    saved = torch.load(roundtrip.LIGHTNING_CKPT)
    loaded = roundtrip.Net.load_from_checkpoint(roundtrip.LIGHTNING_CKPT)
    assert dict(loaded.hparams) == {"lr": 0.1, "hidden": 4}
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, saved["state_dict"][name]), name  # the very weights Lightning saved
    trainer, module = roundtrip.fit(roundtrip.LIGHTNING_CKPT, max_epochs=4)
    out = capsys.readouterr().out
    assert "was written by Lightning 2.6.6: restored the weights, optimizer and scheduler states, epoch and " \
           "global step (8); training continues at the start of epoch 2, not exactly" in out
    expected = EXPECTED["lightning_from_lightning"]
    torch.testing.assert_close(torch.tensor(module.losses), torch.tensor(expected["losses"]), **TOLERANCE)
    assert (trainer.global_step, trainer.current_epoch) == (expected["global_step"], expected["current_epoch"])
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value.flatten(), torch.tensor(expected["weights"][name]), **TOLERANCE)


def test_an_ember_checkpoint_continues_as_lightning_continued_it(tmp_path: Path) -> None:
    # The file Lightning was shown is what Ember writes today (bitwise: Ember against Ember).
    fresh = torch.load(roundtrip.ember_run(str(tmp_path)))
    shown = torch.load(roundtrip.EMBER_CKPT)
    assert sorted(fresh) == EXPECTED["lightning_reads_ember"]["keys"] == sorted(shown)
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch", "global_step"):
        torch.testing.assert_close(fresh[key], shown[key], rtol=0, atol=0)
    assert (shown["epoch"], shown["global_step"]) == (2, 12)
    # Lightning continued it to epoch 5; Ember continues it to the same losses and weights.
    trainer, module = roundtrip.fit(roundtrip.EMBER_CKPT, max_epochs=5)
    expected = EXPECTED["lightning_from_ember"]
    torch.testing.assert_close(torch.tensor(module.losses), torch.tensor(expected["losses"]), **TOLERANCE)
    assert trainer.global_step == expected["global_step"] == 20
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value.flatten(), torch.tensor(expected["weights"][name]), **TOLERANCE)


def test_a_lightning_file_that_needs_unpickling_is_refused_unless_the_caller_opts_in(tmp_path: Path) -> None:
    checkpoint = torch.load(roundtrip.LIGHTNING_CKPT)
    checkpoint["hyper_parameters"] = {"lr": 0.1, "hidden": 4, "root": PurePosixPath("/data")}
    path = tmp_path / "pickled.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(UnsafeCheckpointError, match=r"pickled\.ckpt holds Python objects .* pass weights_only=False"):
        roundtrip.Net.load_from_checkpoint(path)
    with pytest.raises(UnsafeCheckpointError, match=r"ckpt_path=\.\.\., weights_only=False"):
        roundtrip.fit(str(path), max_epochs=3)
    assert roundtrip.Net.load_from_checkpoint(path, weights_only=False).hparams.hidden == 4
    trainer = Trainer(**QUIET, max_epochs=3)
    trainer.fit(roundtrip.Net(), roundtrip.loader(), ckpt_path=str(path), weights_only=False)
    assert trainer.global_step == 12


def test_a_damaged_file_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "copy.ckpt"
    shutil.copyfile(roundtrip.EMBER_CKPT, path)
    damage(path)
    with pytest.raises(CorruptCheckpointError, match=r"Checkpoint .*copy\.ckpt is corrupted: its 'state_dict' has "
                                                     r"(xxh3|blake2b)-128 \w+, the file's digest says \w+ .* Resume from "
                                                     r"another checkpoint .* or restore the file from a copy"):
        roundtrip.Net.load_from_checkpoint(path)
    with pytest.raises(CorruptCheckpointError, match=r"fit\(ckpt_path='.*copy\.ckpt'\): .*corrupted.* Pass "
                                                     r"ckpt_path='last' to resume from the newest checkpoint"):
        roundtrip.fit(str(path), max_epochs=4)
    path.write_bytes(path.read_bytes()[:-100])  # truncated: the file no longer loads at all
    with pytest.raises(CorruptCheckpointError, match=r"copy\.ckpt is corrupted: it does not load"):
        roundtrip.Net.load_from_checkpoint(path)


def test_a_flipped_byte_in_the_files_structure_is_damage_not_a_pickled_object(tmp_path: Path) -> None:
    path = tmp_path / "copy.ckpt"
    raw = bytearray(Path(roundtrip.EMBER_CKPT).read_bytes())
    start = raw.index(b"data.pkl") + 60  # inside the pickle stream: the file's structure
    for i in range(start, start + 6):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"copy\.ckpt is corrupted"):
        roundtrip.Net.load_from_checkpoint(path)


def test_the_epoch_key_is_lightnings_inside_fit_and_after_it(tmp_path: Path) -> None:
    # Observed on Lightning 2.6.6 (2 epochs of 2 steps, a checkpoint at each epoch end, then one after fit):
    # epoch=0-step=2 holds epoch 0, epoch=1-step=4 epoch 1, and the one written after fit returned epoch 2.
    trainer = Trainer(**{**QUIET, "enable_checkpointing": True, "max_epochs": 2, "project_dir": str(tmp_path),
                         "callbacks": [ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)]})
    trainer.fit(Regressor(), data(8, 4))
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    found = {name: (torch.load(tmp_path / name)["epoch"], torch.load(tmp_path / name)["global_step"])
             for name in ("epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "after.ckpt")}
    assert found == {"epoch=0-step=2.ckpt": (0, 2), "epoch=1-step=4.ckpt": (1, 4), "after.ckpt": (2, 4)}
