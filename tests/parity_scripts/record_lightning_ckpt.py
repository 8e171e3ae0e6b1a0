"""Record the Lightning 2.6.6 <-> Ember ``.ckpt`` round trips; write tests/trainer/data/lightning_2_6_6.ckpt,
tests/trainer/data/ember_epoch_end.ckpt and tests/trainer/lightning_ckpt_expected.py.

    python3 -m venv /tmp/venv-pl && /tmp/venv-pl/bin/pip install torch==2.13.0 lightning==2.6.6
    /tmp/venv-pl/bin/python tests/parity_scripts/record_lightning_ckpt.py

1. Lightning trains ``Net`` (the twin of tests/trainer/lightning_roundtrip.py's, copied here: this venv has no
   Ember) for 2 epochs; its ModelCheckpoint file of epoch 1 becomes the fixture. Lightning then continues that
   file to 4 epochs: the losses it gets are what Ember must get continuing the same file.
2. Ember (its own venv, ``.venv/bin/python -m tests.trainer.lightning_roundtrip``) continues the Lightning file
   to 3 epochs; its epoch-end file of epoch 2 becomes the second fixture.
3. Lightning reads Ember's file: ``torch.load`` with its defaults, ``Net.load_from_checkpoint`` (weights equal to
   the file's), and ``Trainer(max_epochs=5).fit(ckpt_path=...)``: the losses it gets are what Ember must get
   continuing its own file.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import os
import pprint
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "trainer", "data")
LIGHTNING_CKPT = os.path.join(DATA, "lightning_2_6_6.ckpt")
EMBER_CKPT = os.path.join(DATA, "ember_epoch_end.ckpt")
OUT = os.path.join(ROOT, "tests", "trainer", "lightning_ckpt_expected.py")


def loader() -> DataLoader:
    x = torch.arange(48, dtype=torch.float32).reshape(16, 3) / 48
    y = (x.sum(1, keepdim=True) * 0.7 - 0.2).sin()
    return DataLoader(TensorDataset(x, y), batch_size=4)


class Net(pl.LightningModule):
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


def trainer(max_epochs: int, dirpath: str) -> pl.Trainer:
    return pl.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", deterministic=True,
                      callbacks=[ModelCheckpoint(dirpath=dirpath, filename="{epoch}", save_top_k=-1)])


def continued(ckpt_path: str, max_epochs: int, dirpath: str) -> dict[str, Any]:
    """Lightning continues ``ckpt_path`` to ``max_epochs``: its losses, final counters and weights."""
    module = Net()
    run = trainer(max_epochs, dirpath)
    run.fit(module, loader(), ckpt_path=ckpt_path)
    return {"losses": module.losses, "global_step": run.global_step, "current_epoch": run.current_epoch,
            "weights": {name: value.flatten().tolist() for name, value in module.state_dict().items()}}


def main() -> None:
    os.makedirs(DATA, exist_ok=True)
    expected: dict[str, Any] = {"versions": {"lightning": lightning.__version__, "torch": torch.__version__}}
    with tempfile.TemporaryDirectory() as work:
        torch.manual_seed(0)
        trainer(2, os.path.join(work, "first")).fit(Net(), loader())
        shutil.copyfile(os.path.join(work, "first", "epoch=1.ckpt"), LIGHTNING_CKPT)
        expected["lightning_from_lightning"] = continued(LIGHTNING_CKPT, 4, os.path.join(work, "again"))

        env = {**os.environ, "PYTHONPATH": ROOT}
        subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), "-m", "tests.trainer.lightning_roundtrip",
                        EMBER_CKPT], cwd=ROOT, env=env, check=True)
        saved = torch.load(EMBER_CKPT)  # torch's defaults: weights_only=True
        loaded = Net.load_from_checkpoint(EMBER_CKPT)
        for name, value in loaded.state_dict().items():
            assert torch.equal(value, saved["state_dict"][name]), name
        expected["lightning_reads_ember"] = {"keys": sorted(saved), "epoch": saved["epoch"],
                                             "global_step": saved["global_step"],
                                             "hparams": dict(loaded.hparams)}
        expected["lightning_from_ember"] = continued(EMBER_CKPT, 5, os.path.join(work, "from_ember"))
    with open(OUT, "w") as handle:
        handle.write(f'"""Observed from lightning {lightning.__version__} (torch {torch.__version__}, CPU) by '
                     'tests/parity_scripts/record_lightning_ckpt.py; do not edit."""\n\n')
        handle.write("EXPECTED = " + pprint.pformat(expected, sort_dicts=False, width=116) + "\n")
    print(f"wrote {OUT}, {LIGHTNING_CKPT} ({os.path.getsize(LIGHTNING_CKPT)} bytes), {EMBER_CKPT} "
          f"({os.path.getsize(EMBER_CKPT)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
