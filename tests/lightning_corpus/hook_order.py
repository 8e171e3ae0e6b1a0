"""The order of every callback and module hook in fit (with validation and a sanity check) and in test."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from trainer import Callback

HOOKS = ("setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
         "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
         "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
         "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
         "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
         "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
         "on_save_checkpoint")


class Recorder(Callback):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls


class Net(pl.LightningModule):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls
        self.net = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        self.calls.append("module.training_step")
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.calls.append("module.validation_step")

    def test_step(self, batch, batch_idx):
        self.calls.append("module.test_step")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _recording(kind: str, hook: str):
    def record(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(f"{kind}.{hook}")
    return record


for _hook in HOOKS:
    setattr(Recorder, _hook, _recording("callback", _hook))
    if _hook not in ("on_sanity_check_start", "on_sanity_check_end", "on_save_checkpoint"):
        setattr(Net, _hook, _recording("module", _hook))


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    calls: list[str] = []
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                         limit_val_batches=1, accumulate_grad_batches=2, callbacks=[Recorder(calls)],
                         default_root_dir=workdir)
    model = Net(calls)
    trainer.fit(model, loader, loader)
    fit_calls = list(calls)
    calls.clear()
    trainer.test(model, loader, verbose=False)
    return {"fit": fit_calls, "test": list(calls)}
