"""`python ddp_script.py OUT_JSON`: devices=2 from one plain process (the Trainer starts the other one).

Each rank's batch is half of the data (one batch per epoch), so every step's averaged gradient is the full
data's whatever the sampler's assignment (Lightning's DistributedSampler and Ember's shards differ in which
samples go to which rank, not in what a step sees as a whole).
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    pl.seed_everything(13, verbose=False)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 3, generator=g)
    y = x.sum(1, keepdim=True)
    model = Regressor()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=4, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=32), DataLoader(TensorDataset(x, y), batch_size=32))
    if trainer.global_rank == 0:
        weights = [[float(v) for v in p.detach().flatten()] for p in model.parameters()]
        with open(sys.argv[1], "w") as f:
            json.dump({"world_size": trainer.world_size, "global_step": trainer.global_step, "weights": weights,
                       "rank": model.global_rank,
                       "metrics": {k: float(v) for k, v in sorted(trainer.callback_metrics.items())}}, f)
