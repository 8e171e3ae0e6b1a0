"""Steps are called with the arguments their signatures take (Lightning inspects them): batch_idx and
dataloader_idx are optional."""

from __future__ import annotations

from typing import Any

import torch

from tests.trainer.helpers import QUIET, data
from trainer import Trainer, TrainModule


class Minimal(TrainModule):
    """Every step takes only the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.seen: list[str] = []

    def training_step(self, batch):  # type: ignore[no-untyped-def]
        self.seen.append("train")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch):  # type: ignore[no-untyped-def]
        self.seen.append("val")

    def test_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        self.seen.append(f"test{batch_idx}")

    def predict_step(self, batch):  # type: ignore[no-untyped-def]
        return self.net(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Indexed(Minimal):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):  # type: ignore[no-untyped-def]
        self.seen.append(f"val{batch_idx}/{dataloader_idx}")


def test_steps_without_batch_idx_run() -> None:
    module = Minimal()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, **QUIET)
    trainer.fit(module, data(), [data(), data()])  # two val loaders: dataloader_idx trimmed away too
    assert module.seen == ["train", "train", "val", "val"]
    trainer.test(module, data(8))
    assert module.seen[-2:] == ["test0", "test1"]
    assert len(trainer.predict(module, data(8))) == 2


def test_dataloader_idx_is_passed_when_taken() -> None:
    module = Indexed()
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, **QUIET)
    trainer.fit(module, data(), [data(), data()])
    assert module.seen == ["train", "val0/0", "val0/1"]
