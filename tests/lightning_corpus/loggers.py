"""Logger objects: CSVLogger and TensorBoardLogger passed to the Trainer, values read back from metrics.csv."""

from __future__ import annotations

import csv
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from tests.lightning_corpus.common import weights_summary
from trainer.loggers import CSVLogger, TensorBoardLogger


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def on_train_epoch_end(self) -> None:
        self.logger.log_metrics({"custom_epoch_end": float(self.current_epoch)}, step=self.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(5, verbose=False)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 3, generator=g)
    y = x.sum(1, keepdim=True)
    csv_logger = CSVLogger(workdir, name="csv")
    tb_logger = TensorBoardLogger(workdir, name="tb")
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=[csv_logger, tb_logger], log_every_n_steps=2,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    model = Regressor()
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=20))
    # Compare values per (step, name): the column layout of the two CSV writers differs (see the README).
    rows = {}
    for row in _rows(os.path.join(csv_logger.log_dir, "metrics.csv")):
        for key, value in row.items():
            if key != "step" and value not in ("", None):
                rows[f"{row['step']}:{key}"] = float(value)
    return {"weights": weights_summary(model), "csv": rows,
            "csv_log_dir": os.path.relpath(csv_logger.log_dir, workdir),
            "tb_log_dir": os.path.relpath(tb_logger.log_dir, workdir),
            "logger_is_first": trainer.logger is csv_logger, "n_loggers": len(trainer.loggers),
            "versions": [csv_logger.version, tb_logger.version]}
