"""A ``Trainer(devices=2)`` script whose launcher the tests kill (tests/distributed/test_launcher_death.py).

    python -m torch.distributed.run --nproc-per-node 2 ... launcher_death_script.py MODE OUT_DIR
    python -m engine.launch.cli launch --nproc-per-node 2 launcher_death_script.py MODE OUT_DIR
    python launcher_death_script.py MODE OUT_DIR          # the Trainer starts the 2 workers itself

MODE ``rendezvous``: rank 1 sleeps before it builds its Trainer, so rank 0 waits in the rendezvous that cannot
complete. MODE ``training``: both ranks train without end, one short step at a time, and write the step they are
at to ``OUT_DIR/rank<R>.step`` (the test kills the launcher once both have trained a few steps).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule

STEP_S = 0.05  # each step sleeps this long, so training goes on while the test watches


class Slow(TrainModule):
    """A tiny regression that records its progress after every step."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(STEP_S)
        with open(os.path.join(self.out_dir, f"rank{os.environ['RANK']}.step"), "w") as progress:
            progress.write(str(batch_idx))
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(mode: str, out_dir: str) -> None:
    if mode == "rendezvous" and os.environ.get("RANK") == "1":
        time.sleep(300)  # far past every deadline of the tests: this rank never reaches the rendezvous
    trainer = Trainer(accelerator="cpu", devices=2, max_epochs=1, enable_progress_bar=False,
                      enable_checkpointing=False, logger=False)
    data = TensorDataset(torch.randn(100_000, 4), torch.randn(100_000, 1))
    trainer.fit(Slow(out_dir), DataLoader(data, batch_size=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
