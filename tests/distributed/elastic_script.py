"""A Trainer run that torchrun's elastic agent restarts (tests/distributed/test_elastic_restarts.py).

    python -m torch.distributed.run --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:PORT elastic_script.py OUT_DIR [--hold-at STEP] [--hold-in-save STEP]

Dropout, a shuffled loader, a ModelCheckpoint every ``EVERY`` optimizer steps (and ``last``), the csv tracker, and
``fit(ckpt_path="last")``. Once per ``OUT_DIR`` (not again after a restart, nor in a node started again),
``--hold-at STEP`` makes rank ``--hold-rank`` write ``OUT_DIR/held`` (its pid) once it has trained STEP steps and
stop there, so that the test can SIGKILL it mid-epoch (the other ranks wait in the step's collective);
``--hold-in-save STEP`` does the same inside the checkpoint save of step STEP (a save-state pre-hook: the
temporary folder exists, nothing is committed). Rank 0 writes the final
weights to ``OUT_DIR/final.pt``; every rank appends ``<restart count> <world size>`` to ``OUT_DIR/starts_<rank>``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from trainer import Trainer, TrainModule
from trainer.checkpoint import ckpt_file

EVERY = 3  # optimizer steps between checkpoints
SAMPLES = 48  # 2 ranks x batches of 4: 6 steps an epoch
EPOCHS = 2


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Hold(Callback):
    """Stops this rank at a chosen point of the first attempt, after saying where (for the test to kill it)."""

    def __init__(self, out_dir: str, rank: int, at_step: int, in_save: int) -> None:
        self.marker = os.path.join(out_dir, "held")
        self.rank, self.at_step, self.in_save = rank, at_step, in_save
        # Not TORCHELASTIC_RESTART_COUNT: an agent started again counts from 0.
        self.held_before = os.path.exists(self.marker)

    def _hold(self, trainer: Trainer, step: int) -> None:
        if self.held_before or trainer.global_rank != self.rank or trainer.global_step != step:
            return
        with open(self.marker + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(self.marker + ".tmp", self.marker)  # whole, for the test that reads it
        time.sleep(120)  # the test kills this rank now

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._hold(trainer, self.at_step)

    def inside_save(self, trainer: Trainer) -> None:
        """Called inside a checkpoint's write, once its temporary file exists."""
        self._hold(trainer, self.in_save)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--hold-rank", type=int, default=1)
    parser.add_argument("--hold-at", type=int, default=-1)
    parser.add_argument("--hold-in-save", type=int, default=-1)
    args = parser.parse_args()
    rank = os.environ.get("RANK", "0")
    with open(os.path.join(args.out_dir, f"starts_{rank}"), "a") as handle:
        handle.write(f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '-')} {os.environ.get('WORLD_SIZE', '1')}\n")
    hold = Hold(args.out_dir, args.hold_rank, args.hold_at, args.hold_in_save)
    trainer = Trainer(num_nodes=args.num_nodes, max_epochs=EPOCHS, seed=0, deterministic=True, log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, log_with="csv",
                      project_dir=args.out_dir,
                      callbacks=[ModelCheckpoint(every_n_train_steps=EVERY, save_last=True), hold])
    # A DDP checkpoint is one .ckpt file that rank 0 writes (trainer/checkpoint/ckpt_file.py): hold inside its
    # write, once the temporary file is complete but not yet renamed into place.
    real_save = ckpt_file.save_torch

    def save_then_hold(obj: Any, temp: str) -> Any:
        written = real_save(obj, temp)
        hold.inside_save(trainer)
        return written

    ckpt_file.save_torch = save_then_hold
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 4, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer.fit(Net(), DataLoader(data, batch_size=4, shuffle=True), ckpt_path="last")
    if trainer.is_global_zero:
        torch.save(trainer.module.state_dict(), os.path.join(args.out_dir, "final.pt"))


if __name__ == "__main__":
    main()
