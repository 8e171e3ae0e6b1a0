"""ReduceLROnPlateau on a monitored validation metric, with EarlyStopping and ModelCheckpoint."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import EarlyStopping, ModelCheckpoint
from tests.lightning_corpus.common import scalars, weights_summary


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), prog_bar=True)

    def on_train_epoch_start(self) -> None:
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(3, verbose=False)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(48, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + torch.randn(48, 1, generator=g)
    model = Net()
    checkpoint = ModelCheckpoint(dirpath=f"{workdir}/ckpts", monitor="val_loss", mode="min", save_top_k=1)
    stopper = EarlyStopping(monitor="val_loss", mode="min", patience=2, min_delta=0.01)
    trainer = pl.Trainer(max_epochs=8, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[checkpoint, stopper])
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True),
                DataLoader(TensorDataset(x, y), batch_size=24))
    return {"weights": weights_summary(model), "metrics": scalars(trainer.callback_metrics), "lrs": model.lrs,
            "stopped_epoch": stopper.stopped_epoch, "epochs_run": trainer.current_epoch,
            "best_score": float(checkpoint.best_model_score), "global_step": trainer.global_step}
