"""The Trainer with FSDP2 on real processes: ModelCheckpoint (top-k and last) and trainer.save_checkpoint write
sharded checkpoints, a SIGKILLed run resumes bitwise, and a checkpoint resumes on 2 -> 1 and 1 -> 2 processes."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.trainer.helpers import SAVING, Regressor, data
from tests.trainer.resume_script import launch
from tests.trainer.test_resume import assert_same_run, resumed_from
from trainer import Trainer

SCORES = [0.5, 0.2, 0.4, 0.1, 0.3]  # val/score by epoch, lower is better: the best two of 3 epochs are 1 and 2


class Scored(Regressor):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self.log("val/score", SCORES[self.trainer.current_epoch])


def _fsdp_fit(folder: str, max_epochs: int, ckpt_path: str | None = None) -> dict[str, Any]:
    from engine import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(project_dir=folder, fsdp_plugin=FullyShardedDataParallelPlugin())
    checkpoint = ModelCheckpoint(monitor="val/score", save_top_k=2, save_last=True, filename="{epoch}")
    quiet = {k: v for k, v in SAVING.items() if k != "log_with"}
    trainer = Trainer(**quiet, accelerator=accelerator, max_epochs=max_epochs, seed=0, callbacks=[checkpoint])
    trainer.fit(Scored(), data(n=16, batch_size=2), data(n=8, batch_size=2), ckpt_path=ckpt_path)
    trainer.save_checkpoint(os.path.join(folder, "explicit"))  # outside fit: written at once, every rank
    state = accelerator.get_state_dict(trainer.plan.model)  # gathered to rank 0
    return {"step": trainer.global_step, "epoch": trainer.current_epoch,
            "state": {name: value.tolist() for name, value in state.items()},
            "kept": sorted(os.listdir(os.path.join(folder, "checkpoints"))),
            "best": os.path.basename(checkpoint.best_model_path), "last": os.path.basename(checkpoint.last_model_path)}


@pytest.mark.filterwarnings("ignore:Checkpoint .* was saved by")
def test_model_checkpoint_and_save_checkpoint_under_fsdp2_then_resume_on_another_world_size(
        run_distributed: Any, tmp_path: Any) -> None:
    two = str(tmp_path / "two")
    saved = run_distributed(_fsdp_fit, 2, two, 3)
    # top 2 by val/score (epochs 1 and 2) and last.ckpt (the newest position, epoch 2)
    assert saved[0]["kept"] == saved[1]["kept"] == ["epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"]
    assert saved[0]["best"] == "epoch=1.ckpt" and saved[0]["last"] == "last.ckpt"
    files = json.loads((tmp_path / "two" / "explicit" / "manifest.json").read_text())["files"]
    assert any(name.startswith("pytorch_model_fsdp_0/") for name in files)  # sharded, one file per rank
    assert saved[0]["step"] == 12 and saved[0]["state"]

    # 2 -> 1: the sharded checkpoint loads into one process; the run was complete, so nothing more trains. A fit
    # resume on another world size is refused unless asked for (trainer/checkpoint/world_size.py).
    reshard = {"EMBER_ALLOW_WORLD_SIZE_CHANGE": "1"}
    one = run_distributed(_fsdp_fit, 1, two, 3, os.path.join(two, "explicit"), env=reshard)[0]
    assert (one["step"], one["epoch"]) == (12, 3) and one["state"] == saved[0]["state"]
    # ... and continues training from it on one process.
    longer = run_distributed(_fsdp_fit, 1, two, 4, os.path.join(two, "explicit"), env=reshard)[0]
    assert longer["step"] == 12 + 8 and longer["state"] != saved[0]["state"]

    # 1 -> 2.
    single = str(tmp_path / "one")
    saved_by_one = run_distributed(_fsdp_fit, 1, single, 2)[0]
    both = run_distributed(_fsdp_fit, 2, single, 2, "last", env=reshard)
    assert both[0]["step"] == saved_by_one["step"] and both[0]["state"] == saved_by_one["state"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = str(tmp_path_factory.mktemp("fsdp_reference"))
    assert launch(directory, "--fsdp", nproc=2) == 0
    return directory


def test_fsdp2_sigkill_then_resume_is_bitwise_exact(reference: str, tmp_path: Any) -> None:
    run = str(tmp_path)
    assert launch(run, "--fsdp", "--kill-at", "3", nproc=2) == "killed"  # between the micro-batches of step 2
    assert launch(run, "--fsdp", "--ckpt-path", "last", "--kill-at", "9", nproc=2) == "killed"
    assert resumed_from(run) == (0, 2, 1)
    assert launch(run, "--fsdp", "--ckpt-path", "last", nproc=2) == 0
    assert resumed_from(run) == (1, 2, 4)
    assert_same_run(reference, run)
    newest = max(os.listdir(os.path.join(run, "checkpoints")))
    assert "pytorch_model_fsdp_0" in os.listdir(os.path.join(run, "checkpoints", newest))
    assert torch.load(os.path.join(run, "final.pt")).keys() == {"net.0.weight", "net.0.bias", "net.3.weight",
                                                                 "net.3.bias"}
