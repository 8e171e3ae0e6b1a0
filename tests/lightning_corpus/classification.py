"""Classification with torchmetrics and a LightningDataModule (the Hydra-template pattern, shrunk)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

import trainer as pl
from tests.lightning_corpus.common import scalars, weights_summary


class BlobsDataModule(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, n: int = 160) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(3)
        y = torch.randint(0, 3, (self.hparams.n,), generator=g)
        x = torch.randn(self.hparams.n, 5, generator=g) + nn.functional.one_hot(y, 5).float() * 2
        self.train_set, self.val_set, self.test_set = random_split(
            TensorDataset(x, y), [96, 32, 32], generator=torch.Generator().manual_seed(4))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
        self.train_acc = MulticlassAccuracy(num_classes=3, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=3, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=3, average="micro")
        self.train_loss, self.val_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def model_step(self, batch):
        x, y = batch
        logits = self(x)
        return nn.functional.cross_entropy(logits, y), logits.argmax(dim=1), y

    def on_train_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def training_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.test_acc(preds, targets)
        self.log("test/loss", loss)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(11, workers=True, verbose=False)
    dm = BlobsDataModule()
    model = Classifier()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=workdir)
    trainer.fit(model=model, datamodule=dm)
    fit_metrics = scalars(trainer.callback_metrics)
    test = trainer.test(model=model, datamodule=dm, verbose=False)
    return {"weights": weights_summary(model), "fit_metrics": fit_metrics, "test": test,
            "lr": model.optimizers().param_groups[0]["lr"], "global_step": trainer.global_step}
