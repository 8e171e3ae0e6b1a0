"""The lightning-hydra-template MNIST pattern: BatchNorm, torchmetrics, ReduceLROnPlateau, ModelCheckpoint
(save_last), the default logger and progress bar, then a test on the best checkpoint's weights."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

import trainer as pl
from callbacks import ModelCheckpoint
from tests.lightning_corpus.common import scalars, weights_summary


class DenseNet(nn.Module):
    def __init__(self, size: int = 64, hidden: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(size, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.flatten(1))


class DigitsModule(pl.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = DenseNet()
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.train_loss, self.val_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch):
        x, y = batch
        logits = self.forward(x)
        return self.criterion(logits, y), logits.argmax(dim=1), y

    def training_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def test_step(self, batch, batch_idx):
        self.log("test/loss", self.model_step(batch)[0])

    def validation_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=1)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss", "interval": "epoch", "frequency": 1}}


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(12, verbose=False)
    g = torch.Generator().manual_seed(2)
    y = torch.randint(0, 10, (320,), generator=g)
    x = torch.randn(320, 64, generator=g) + nn.functional.one_hot(y, 64).float() * 1.5
    train, val = TensorDataset(x[:256], y[:256]), TensorDataset(x[256:], y[256:])
    model = DigitsModule()
    checkpoint = ModelCheckpoint(dirpath=f"{workdir}/ckpts", monitor="val/acc", mode="max", save_last=True)
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", default_root_dir=workdir, callbacks=[checkpoint])
    trainer.fit(model, DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=64))
    fitted = weights_summary(model)
    tested = trainer.test(model, DataLoader(val, batch_size=64), ckpt_path="best", verbose=False)
    return {"weights": weights_summary(model), "fitted": fitted, "test": tested, "metrics": scalars(trainer.callback_metrics),
            "global_step": trainer.global_step, "best": float(checkpoint.best_model_score),
            "buffers": {n: float(b.double().sum()) for n, b in model.named_buffers()}}
