"""A LightningModule and a LightningDataModule, ported to Ember by changing only the imports.

    python examples/port_from_lightning.py                 # the module's own *_dataloader methods
    python examples/port_from_lightning.py --datamodule    # the same data through the LightningDataModule

``LitDigits`` follows Lightning's ``LitMNIST`` example and ``DigitsDataModule`` its ``MNISTDataModule``, with
scikit-learn's bundled 8x8 digits in place of MNIST (no download). The original import lines were::

    from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint

Everything in the two classes is unchanged Lightning code. In ``main`` only Trainer arguments that Lightning
spells differently change: ``default_root_dir`` is ``project_dir`` and ``logger`` is ``log_with``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from engine import set_seed as seed_everything
from trainer import DataModule as LightningDataModule
from trainer import Trainer
from trainer import TrainModule as LightningModule


def load_digits_dataset() -> TensorDataset:
    """All 1,797 digits as (1, 8, 8) float images in [0, 1] and integer labels (MNIST's shape, smaller)."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    return TensorDataset(torch.tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0,
                         torch.tensor(labels, dtype=torch.long))


# ---------------------------------------------------------------- Lightning code from here on, unchanged ----
class LitDigits(LightningModule):
    def __init__(self, hidden_size: int = 64, learning_rate: float = 2e-3, batch_size: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = 10
        channels, width, height = (1, 8, 8)
        self.model = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * width * height, hidden_size), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(hidden_size, self.num_classes),
        )
        self.validation_step_outputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.model(x), dim=1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.nll_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        loss = F.nll_loss(logits, y)
        preds = torch.argmax(logits, dim=1)
        self.validation_step_outputs.append((preds == y).float())
        self.log("val_loss", loss, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        # Lightning 2.x's pattern for epoch-level metrics: collect in the step, reduce here, clear.
        correct = torch.cat(self.validation_step_outputs)
        self.log("val_acc", correct.mean(), prog_bar=True)
        self.validation_step_outputs.clear()

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("test_loss", F.nll_loss(logits, y))
        self.log("test_acc", (torch.argmax(logits, dim=1) == y).float().mean())

    def on_train_epoch_end(self) -> None:
        self.print(f"epoch {self.current_epoch}: train_loss {self.trainer.callback_metrics['train_loss_epoch']:.4f}")

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=1)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss", "interval": "epoch", "frequency": 1}}

    # The data hooks, as in LitMNIST: the module can carry its own data.
    def prepare_data(self) -> None:
        load_digits_dataset()  # MNIST(self.data_dir, download=True) in the original

    def setup(self, stage: str) -> None:
        full = load_digits_dataset()
        generator = torch.Generator().manual_seed(42)
        self.digits_train, self.digits_val, self.digits_test = random_split(full, [1257, 270, 270], generator)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_val, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_test, batch_size=self.hparams.batch_size)


class DigitsDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        load_digits_dataset()

    def setup(self, stage: str) -> None:
        full = load_digits_dataset()
        generator = torch.Generator().manual_seed(42)
        if stage == "fit":
            self.digits_train, self.digits_val, _ = random_split(full, [1257, 270, 270], generator)
        if stage == "test":
            _, _, self.digits_test = random_split(full, [1257, 270, 270], generator)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_val, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_test, batch_size=self.hparams.batch_size)
# ------------------------------------------------------------------------------------ end of Lightning code ----


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datamodule", action="store_true", help="feed the data through DigitsDataModule")
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--project-dir", default="runs/port_from_lightning")
    args = parser.parse_args(argv)

    seed_everything(42)
    model = LitDigits()
    trainer = Trainer(
        accelerator="cpu", max_epochs=args.max_epochs, log_every_n_steps=10,
        project_dir=args.project_dir,  # Lightning: default_root_dir=...
        log_with="csv",  # Lightning: logger=CSVLogger(...)
        callbacks=[ModelCheckpoint(monitor="val_loss", mode="min"), EarlyStopping(monitor="val_loss", patience=3),
                   LearningRateMonitor(logging_interval="epoch")])
    datamodule = DigitsDataModule() if args.datamodule else None
    trainer.fit(model, datamodule=datamodule)
    (results,) = trainer.test(model, datamodule=datamodule)
    print(f"test accuracy {results['test_acc']:.2%}")
    return results["test_acc"]


if __name__ == "__main__":
    main()
