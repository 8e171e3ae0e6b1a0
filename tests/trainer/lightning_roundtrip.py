"""The module, data and runs of the Lightning 2.6.6 <-> Ember ``.ckpt`` round trips.

tests/parity_scripts/record_lightning_ckpt.py trains the same module (its Lightning twin, copied there: that venv
has no Ember) in Lightning 2.6.6 and records what tests/trainer/test_lightning_ckpt.py checks:

- ``data/lightning_2_6_6.ckpt``: Lightning's own ``ModelCheckpoint`` file after 2 epochs (epoch=1), and the
  losses Lightning gets continuing from it to 4 epochs;
- ``data/ember_epoch_end.ckpt``: Ember's file after continuing that Lightning file to 3 epochs (``ember_run``
  here, run by the recorder in Ember's venv), and the losses Lightning gets continuing from it to 5 epochs.

The data is built without a random generator, so it is the same bytes wherever it is made.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Trainer, TrainModule

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
LIGHTNING_CKPT = os.path.join(DATA, "lightning_2_6_6.ckpt")
EMBER_CKPT = os.path.join(DATA, "ember_epoch_end.ckpt")


def loader() -> DataLoader:
    """16 samples of 3 features, in 4 batches, never shuffled."""
    x = torch.arange(48, dtype=torch.float32).reshape(16, 3) / 48
    y = (x.sum(1, keepdim=True) * 0.7 - 0.2).sin()
    return DataLoader(TensorDataset(x, y), batch_size=4)


class Net(TrainModule):
    """A two-layer regressor with Adam and an epoch StepLR: the Lightning twin has the same names and steps."""

    def __init__(self, lr: float = 0.1, hidden: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


def fit(ckpt_path: str, max_epochs: int, checkpoints: str | None = None) -> tuple[Trainer, Net]:
    """Continue ``ckpt_path`` to ``max_epochs`` in Ember (saving every epoch into ``checkpoints`` if given)."""
    callbacks = [ModelCheckpoint(dirpath=checkpoints, filename="{epoch}", save_top_k=-1)] if checkpoints else []
    trainer = Trainer(max_epochs=max_epochs, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=bool(checkpoints), callbacks=callbacks, seed=0)
    module = Net()
    trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return trainer, module


def ember_run(workdir: str) -> str:
    """What the recorder shows Lightning: the Lightning file continued in Ember to 3 epochs; returns Ember's
    epoch-end checkpoint of epoch 2 (copied to ``EMBER_CKPT`` by the recorder)."""
    checkpoints = os.path.join(workdir, "checkpoints")
    fit(LIGHTNING_CKPT, 3, checkpoints)
    return os.path.join(checkpoints, "epoch=2.ckpt")


if __name__ == "__main__":  # the recorder's step 2: python -m tests.trainer.lightning_roundtrip OUT
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        shutil.copyfile(ember_run(workdir), sys.argv[1])
