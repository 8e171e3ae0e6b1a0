"""Which of Ember's source files one training step of ``Trainer.fit`` runs code from (a measure of the joins).

A step is followed from ``on_train_batch_start`` of batch 5 to that of batch 6 (warm: the first batches
prepared everything): the step, its end hooks and boundary, and fetching the next batch, with
``sys.setprofile`` recording every Python function called; the
files of ours among them are printed, with their count. The module logs its loss each step, as most do, and the
Trainer keeps its defaults (a ``ModelCheckpoint``, no progress bar or trackers: they would add their own files).

Run: ``python benchmarks/step_files.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from callbacks import Callback
from trainer import Trainer, TrainModule

PACKAGES = ("engine", "trackers", "callbacks", "trainer")


class Regressor(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Probe(Callback):
    """Records the files of every Python function called between two hooks of the same step."""

    def __init__(self) -> None:
        self.files: set[str] = set()

    def _record(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            path = os.path.abspath(frame.f_code.co_filename)
            relative = os.path.relpath(path, ROOT)
            if relative.split(os.sep)[0] in PACKAGES:
                self.files.add(relative)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        sys.setprofile(self._record if batch_idx == 5 else None)


def main() -> None:
    probe = Probe()
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    trainer = Trainer(max_epochs=1, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[probe])
    trainer.fit(Regressor(), data)
    print(f"{len(probe.files)} of Ember's files run code in one training step:")
    for name in sorted(probe.files):
        print(f"  {name}")


if __name__ == "__main__":
    main()
