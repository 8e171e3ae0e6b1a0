"""Classes the CLI tests name by class_path (``tests.tools.cli_models.Wide``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, TrainModule


class Base(TrainModule):
    """A tiny regression model."""

    def __init__(self, lr: float = 0.1, hidden: int = 4) -> None:
        """Build the network.

        Args:
            lr: the learning rate of SGD.
            hidden: the number of hidden units.
        """
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Wide(Base):
    """A wider regression model."""

    def __init__(self, lr: float = 0.1, hidden: int = 16, dropout: float = 0.0) -> None:
        super().__init__(lr, hidden)
        self.dropout = dropout


class Data(DataModule):
    """32 samples of y = sum(x)."""

    def __init__(self, n: int = 32, batch_size: int = 8) -> None:
        super().__init__()
        self.n, self.batch_size = n, batch_size

    def _loader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, 3, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()
