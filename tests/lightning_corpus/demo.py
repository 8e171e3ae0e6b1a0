"""Lightning's demo pattern: an autoencoder on shuffled data with validation (so a sanity check runs first)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from tests.lightning_corpus.common import scalars, weights_summary


class LitAutoEncoder(pl.LightningModule):
    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Dropout(0.1), nn.Linear(4, 2))
        self.decoder = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        loss = nn.functional.mse_loss(self.decoder(self.encoder(x)), x)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val_loss", nn.functional.mse_loss(self.decoder(self.encoder(x)), x))

    def test_step(self, batch, batch_idx):
        x, _ = batch
        self.log("test_loss", nn.functional.mse_loss(self.decoder(self.encoder(x)), x))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(42, verbose=False)
    x = torch.randn(96, 8, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, torch.zeros(96))
    train = DataLoader(data, batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[:32], torch.zeros(32)), batch_size=16)
    model = LitAutoEncoder()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=workdir)
    trainer.fit(model, train, val)
    fit_metrics = scalars(trainer.callback_metrics)
    test = trainer.test(model, dataloaders=val, verbose=False)
    return {"weights": weights_summary(model), "fit_metrics": fit_metrics, "test": test,
            "global_step": trainer.global_step, "test_callback_metrics": scalars(trainer.callback_metrics)}
