"""Batch-size search scenarios (``Tuner.scale_batch_size``, ``BatchSizeFinder``) recorded from Lightning
(``record_corpus.py batch_size``): the sizes tried on a module that runs out of memory above a size, the result,
the messages, which errors count as out of memory, where the size is read and written, the errors."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import BatchSizeFinder, LearningRateFinder
from trainer.tuner import Tuner

QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False, "enable_checkpointing": False}
KEPT = ("trying batch size", "greater or equal", "Finished batch size", "Applying margin", "Reached the maximum",
        "exceeds max_val")


def _dataset(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=g))


class Sized(pl.LightningModule):
    """Reads ``self.batch_size`` in every loader; a step at a size above ``limit`` raises ``error``."""

    def __init__(self, batch_size: int | None = 2, n: int = 512, limit: int | None = None,
                 error: Any = "CUDA error: out of memory") -> None:
        super().__init__()
        if batch_size is not None:
            self.batch_size = batch_size
        self.n, self.limit, self.error = n, limit, error
        self.layer = nn.Linear(4, 1)
        self.tried: list[int] = []

    def _step(self, batch: Any) -> torch.Tensor:
        size = self.hparams.batch_size if "batch_size" in self.hparams else self.batch_size
        if not self.tried or self.tried[-1] != size:
            self.tried.append(size)
        if self.limit is not None and size > self.limit:
            raise self.error if isinstance(self.error, BaseException) else RuntimeError(self.error)
        return self.layer(batch[0]).pow(2).mean()

    def training_step(self, batch, batch_idx):
        return self._step(batch)

    def validation_step(self, batch, batch_idx):
        self._step(batch)

    def test_step(self, batch, batch_idx):
        self._step(batch)

    def predict_step(self, batch, batch_idx):
        return self._step(batch)

    def _loader(self) -> DataLoader:
        size = self.hparams.batch_size if "batch_size" in self.hparams else self.batch_size
        return DataLoader(_dataset(self.n), batch_size=size)

    def train_dataloader(self):
        return self._loader()

    def val_dataloader(self):
        return self._loader()

    def test_dataloader(self):
        return self._loader()

    def predict_dataloader(self):
        return self._loader()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class WithHparams(Sized):
    def __init__(self, batch_size: int = 2, n: int = 512) -> None:
        super().__init__(None, n)
        self.save_hyperparameters("batch_size")


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = 2, n: int = 64, hparams: bool = False) -> None:
        super().__init__()
        if hparams:
            self.save_hyperparameters("batch_size")
        else:
            self.batch_size = batch_size
        self.n = n

    def train_dataloader(self):
        size = self.hparams.batch_size if "batch_size" in self.hparams else self.batch_size
        return DataLoader(_dataset(self.n), batch_size=size)

    val_dataloader = train_dataloader


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []  # kept alive: a record reaching two loggers is kept once

    def emit(self, record: logging.LogRecord) -> None:
        if any(k in record.getMessage() for k in KEPT) and not any(r is record for r in self.records):
            self.records.append(record)


def _listen() -> tuple[_Messages, list[tuple[logging.Logger, int]]]:
    handler = _Messages()
    loggers = [logging.getLogger(name) for name in ("", "lightning.pytorch", "lightning", "trainer")]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    return handler, saved


def _unlisten(handler: _Messages, saved: list[tuple[logging.Logger, int]]) -> None:
    for lg, level in saved:
        lg.removeHandler(handler)
        lg.setLevel(level)


def search(workdir: str, model_kwargs: dict[str, Any] | None = None, datamodule: Any = None,
           **kwargs: Any) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = (WithHparams if (model_kwargs or {}).pop("hparams", False) else Sized)(**(model_kwargs or {}))
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, **QUIET)
    handler, saved = _listen()
    try:
        result: Any = Tuner(trainer).scale_batch_size(model, datamodule=datamodule, **kwargs)
    except Exception as error:  # noqa: BLE001 - which errors end the search, and how
        result = f"{type(error).__name__}: {str(error)[:60]}"
    finally:
        _unlisten(handler, saved)
    size = model.hparams.batch_size if "batch_size" in model.hparams else getattr(model, "batch_size", None)
    messages = [r.getMessage() for r in handler.records]
    out = {"result": result, "tried": model.tried, "attribute": size, "messages": messages}
    if datamodule is not None:
        out["datamodule"] = datamodule.hparams.batch_size if "batch_size" in datamodule.hparams else \
            datamodule.batch_size
    return out


OOM_MESSAGES = ["CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA error: out of memory", "out of memory",
                ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous "
                "input."), "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes",
                "shape mismatch", "CUDA error: device-side assert triggered"]


def oom_errors(workdir: str) -> list[Any]:
    errors: list[Any] = [RuntimeError(m) for m in OOM_MESSAGES]
    errors += [RuntimeError("CUDA out of memory", 2), torch.cuda.OutOfMemoryError("CUDA out of memory.")]
    return [search(os.path.join(workdir, str(i)), {"limit": 8, "error": e}, steps_per_trial=1)["result"]
            for i, e in enumerate(errors)]


def errors() -> list[str]:
    texts = []
    model = Sized()
    calls = [lambda: BatchSizeFinder(mode="up"),
             lambda: Tuner(pl.Trainer(**QUIET)).scale_batch_size(model, mode="up"),
             lambda: Tuner(pl.Trainer(**QUIET)).scale_batch_size(model, method="prediction"),
             lambda: Tuner(pl.Trainer(**QUIET)).scale_batch_size(model, train_dataloaders=model.train_dataloader()),
             lambda: Tuner(pl.Trainer(**QUIET)).scale_batch_size(model, dataloaders=model.val_dataloader()),
             lambda: Tuner(pl.Trainer(**QUIET)).scale_batch_size(model, val_dataloaders=model.val_dataloader(),
                                                                   method="test"),
             lambda: Tuner(pl.Trainer(**QUIET)).scale_batch_size(Sized(batch_size=None)),
             lambda: Tuner(pl.Trainer(callbacks=[BatchSizeFinder()], **QUIET)).scale_batch_size(model),
             lambda: Tuner(pl.Trainer(callbacks=[LearningRateFinder()], **QUIET)).lr_find(model),
             lambda: Tuner(pl.Trainer(**QUIET)).lr_find(model, method="validate")]
    for call in calls:
        try:
            call()
            texts.append("no error")
        except Exception as error:  # noqa: BLE001 - the error each call ends with is the value recorded
            texts.append(f"{type(error).__name__}: {str(error).split('. Received')[0]}")
    return texts


def duplicate_warning(workdir: str) -> list[str]:
    class Both(WithHparams):
        def __init__(self, batch_size: int = 2) -> None:
            super().__init__(batch_size)
            self.batch_size = batch_size

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Tuner(pl.Trainer(default_root_dir=workdir, max_epochs=1, **QUIET)).scale_batch_size(Both(), max_trials=1)
    return [str(w.message) for w in caught if "mutually" in str(w.message)]


def callback(workdir: str, method: str) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = Sized(n=64, limit=20)
    finder = BatchSizeFinder(max_trials=4, steps_per_trial=1)
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=2, callbacks=[finder], **QUIET)
    getattr(trainer, method)(model)
    return {"optimal": finder.optimal_batch_size, "attribute": model.batch_size, "global_step": trainer.global_step,
            "epoch": trainer.current_epoch}


def main(workdir: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oom = {"limit": 40}
        cases = {
            "power_oom": ({**oom}, {"mode": "power", "init_val": 4, "steps_per_trial": 1}),
            "binsearch_oom": ({**oom}, {"mode": "binsearch", "init_val": 4, "steps_per_trial": 1}),
            "binsearch_no_margin": ({**oom}, {"mode": "binsearch", "init_val": 4, "margin": 0.0}),
            "binsearch_margin_20": ({**oom}, {"mode": "binsearch", "init_val": 4, "margin": 0.2}),
            "power_3_trials": ({}, {"mode": "power", "max_trials": 3}),
            "binsearch_3_trials": ({}, {"mode": "binsearch", "max_trials": 3}),
            "power_1_trial": ({"batch_size": 4}, {"mode": "power", "max_trials": 1, "init_val": 4}),
            "power_0_trials": ({}, {"mode": "power", "max_trials": 0}),
            "binsearch_0_trials": ({}, {"mode": "binsearch", "max_trials": 0}),
            "dataset_end_power": ({"n": 64, "batch_size": 16}, {"mode": "power", "init_val": 17}),
            "dataset_end_binsearch": ({"n": 64, "batch_size": 16}, {"mode": "binsearch", "init_val": 8}),
            "start_covers_dataset": ({"n": 64, "batch_size": 100}, {"mode": "power", "init_val": 4}),
            "max_val_power": ({}, {"mode": "power", "max_val": 24}),
            "max_val_binsearch": ({}, {"mode": "binsearch", "max_val": 24}),
            "fails_from_the_start": ({"limit": 100}, {"mode": "power", "init_val": 500, "max_trials": 10}),
            "fails_from_the_start_bin": ({"limit": 100}, {"mode": "binsearch", "init_val": 500, "max_trials": 10}),
            "validate": ({**oom}, {"method": "validate", "max_trials": 10}),
            "test": ({**oom}, {"method": "test", "mode": "binsearch"}),
            "predict": ({**oom}, {"method": "predict", "max_trials": 4}),
            "hparams": ({"hparams": True}, {"max_trials": 4}),
            "not_an_oom": ({"limit": 4, "error": "shape mismatch"}, {"max_trials": 4}),
        }
        out: dict[str, Any] = {name: search(os.path.join(workdir, name), m, **k) for name, (m, k) in cases.items()}
        out["datamodule"] = search(os.path.join(workdir, "dm"), {"batch_size": 2}, Data(2), max_trials=4)
        out["datamodule_hparams"] = search(os.path.join(workdir, "dmh"), {"batch_size": None},
                                           Data(2, hparams=True), max_trials=4)
        out["oom_errors"] = oom_errors(os.path.join(workdir, "oom"))
        out["errors"] = errors()
        out["duplicate_warning"] = duplicate_warning(os.path.join(workdir, "dup"))
        out["callback"] = {m: callback(os.path.join(workdir, "cb" + m), m) for m in ("fit", "validate", "test",
                                                                                      "predict")}
        return out
