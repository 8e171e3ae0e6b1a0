"""One SLURM task of a 2-task job (the test starts both, as ``srun`` would): a Trainer fit with no ``ckpt_path``.

Writes ``rank{R}.step`` after each optimizer step (so the test knows when to signal) and, at the end,
``rank{R}.final.pt`` with the weights. ``SLOW`` seconds of sleep per step give the signal time to land mid-run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Trainer, TrainModule


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Progress(Callback):
    def __init__(self, out: Path, slow: float) -> None:
        self.out, self.slow = out, slow

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        (self.out / f"rank{trainer.global_rank}.step").write_text(str(trainer.global_step))
        time.sleep(self.slow)


def main() -> None:
    out, slow = Path(sys.argv[1]), float(sys.argv[2])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)
    trainer = Trainer(max_epochs=3, seed=0, project_dir=str(out / "project"), log_with=None,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[Progress(out, slow)])
    module = Net()
    trainer.fit(module, data)  # the same line on the first start and after a requeue
    rank = int(os.environ["SLURM_PROCID"])
    torch.save({k: v.clone() for k, v in module.state_dict().items()}, out / f"rank{rank}.final.pt")


if __name__ == "__main__":
    main()
