"""``DeviceStatsMonitor`` scenarios recorded from Lightning (``record_corpus.py device_stats``): on the CPU, which
keys reach the logger, at which steps, from which hooks; ``cpu_stats``; the error without a logger."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import DeviceStatsMonitor
from trainer.loggers import CSVLogger
from trainer.utilities.exceptions import MisconfigurationException


class Recording(CSVLogger):
    """Keeps the names (``DeviceStatsMonitor.*``) and step of each ``log_metrics`` call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[list[Any]] = []

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        names = sorted(k for k in metrics if k.startswith("DeviceStatsMonitor"))
        if names:
            self.calls.append([step, names])
        super().log_metrics(metrics, step)


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val", self.layer(batch[0]).pow(2).mean())

    def test_step(self, batch, batch_idx):
        self.log("test", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _data() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)


def run(workdir: str, cpu_stats: bool | None = None, every: int = 1) -> dict[str, Any]:
    logger = Recording(workdir)
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, limit_train_batches=3, limit_val_batches=2,
                         num_sanity_val_steps=0, log_every_n_steps=every, logger=logger, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[DeviceStatsMonitor(cpu_stats=cpu_stats)])
    model = Net()
    trainer.fit(model, _data(), _data())
    fitted = list(logger.calls)
    trainer.test(model, _data(), verbose=False)
    return {"fit": [[step, sorted({n.split("/")[0] for n in names}), sorted({n.split("/")[1] for n in names})]
                    for step, names in fitted],
            "test": [[step, sorted({n.split("/")[0] for n in names})] for step, names in logger.calls[len(fitted):]]}


def no_logger(workdir: str) -> str:
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, callbacks=[DeviceStatsMonitor()])
    try:
        trainer.fit(Net(), _data())
    except MisconfigurationException as error:
        return str(error)
    return "no error"


def main(workdir: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {"default": run(os.path.join(workdir, "a")), "cpu_stats_true": run(os.path.join(workdir, "b"), True),
                "cpu_stats_false": run(os.path.join(workdir, "c"), False),
                "every_2": run(os.path.join(workdir, "d"), every=2), "no_logger": no_logger(os.path.join(workdir, "e"))}
