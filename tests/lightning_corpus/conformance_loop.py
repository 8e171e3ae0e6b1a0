"""Lightning loop behaviours Ember conforms to (issue 27, second round), each a small scenario recorded from
Lightning: the module's mode hooks and ``backward``, submodule modes across validation, ``self.log`` from
callbacks and from ``on_train_start``, loop limits, data loaders under ``overfit_batches``.

Every function returns plain values; ``main`` runs them all. The recording script runs this very file under
Lightning (imports swapped back), the test under Ember.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import EarlyStopping, WeightAveraging
from trainer.utilities import GradClipAlgorithmType

QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False,
         "enable_checkpointing": False}


def _data(n: int = 8, batch_size: int = 2, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g)), batch_size=batch_size)


class Recorded(pl.LightningModule):
    """A linear model with a dropout kept in eval mode; records its hooks and both modules' modes."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.frozen = nn.Dropout()
        self.frozen.eval()
        self.calls: list[Any] = []

    def training_step(self, batch, batch_idx):
        self.calls.append(["train", self.training, self.frozen.training])
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.calls.append(["validation", self.training, self.frozen.training])

    def test_step(self, batch, batch_idx):
        self.calls.append(["test", self.training, self.frozen.training])

    def predict_step(self, batch, batch_idx):
        self.calls.append(["predict", self.training, self.frozen.training])

    def on_validation_start(self) -> None:
        self.calls.append("on_validation_start")

    def on_validation_end(self) -> None:
        self.calls.append("on_validation_end")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class WithModeHooks(Recorded):
    def on_validation_model_eval(self) -> None:
        self.calls.append("on_validation_model_eval")
        super().on_validation_model_eval()

    def on_validation_model_train(self) -> None:
        self.calls.append("on_validation_model_train")
        super().on_validation_model_train()

    def on_test_model_eval(self) -> None:
        self.calls.append("on_test_model_eval")
        self.eval()
        self.layer.train()  # an override decides each submodule's mode itself

    def on_test_model_train(self) -> None:
        self.calls.append("on_test_model_train")

    def on_predict_model_eval(self) -> None:
        self.calls.append("on_predict_model_eval")
        super().on_predict_model_eval()


class WithBackward(Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def backward(self, loss, *args, **kwargs):
        self.calls.append("backward")
        self.losses.append(round(float(loss), 6))
        (loss * 0.5).backward(*args, **kwargs)  # half the gradient: the weights show the override ran

    def on_before_backward(self, loss) -> None:
        self.calls.append("on_before_backward")

    def on_after_backward(self) -> None:
        self.calls.append("on_after_backward")


class ManualWithBackward(WithBackward):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()


def module_hooks(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, cls in (("defaults", Recorded), ("overridden", WithModeHooks)):
        pl.seed_everything(0, verbose=False)
        model = cls()
        trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, num_sanity_val_steps=1, limit_val_batches=1,
                             **QUIET)
        trainer.fit(model, _data(4), _data(4))
        trainer.test(model, _data(2), verbose=False)
        trainer.predict(model, _data(2))
        out[name] = [*model.calls, ["after", model.training, model.layer.training, model.frozen.training]]
    for name, cls in (("backward", WithBackward), ("manual_backward", ManualWithBackward)):
        pl.seed_everything(0, verbose=False)
        model = cls()
        trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, accumulate_grad_batches=2 if
                             name == "backward" else 1, **QUIET)
        trainer.fit(model, _data(4))
        out[name] = [[c for c in model.calls if isinstance(c, str)], model.losses,
                     [round(v, 6) for v in model.layer.weight.flatten().tolist()]]
    return out


class LoggingCallback(pl.Callback):
    """Logs through ``self.log`` (the module's, lent to every callback by the trainer)."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.log("cb_train_start", 1.0)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.log("cb_epoch_start", float(trainer.current_epoch + 2))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.log_dict({"cb_batch": float(batch_idx)}, prog_bar=True)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.log("cb_epoch_end", 5.0)


class LogsAtTrainStart(Recorded):
    def on_train_start(self) -> None:
        self.log("start_value", 7.0, prog_bar=True)

    def on_train_epoch_end(self) -> None:
        self.calls.append(sorted(self.trainer.callback_metrics))


def logging(workdir: str) -> dict[str, Any]:
    model = LogsAtTrainStart()
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=2, callbacks=[LoggingCallback()], **QUIET)
    trainer.fit(model, _data(4))
    values = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items()}
    return {"epoch_ends": [c for c in model.calls if isinstance(c, list) and isinstance(c[0], str) and
                           c[0] not in ("train", "validation")],
            "callback_metrics": values, "progress_bar": sorted(trainer.progress_bar_metrics)}


class CountingEarlyStopping(EarlyStopping):
    """Overrides Lightning's ``_run_early_stopping_check`` (one call per check)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checks: list[int] = []

    def _run_early_stopping_check(self, trainer) -> None:
        self.checks.append(trainer.current_epoch)
        super()._run_early_stopping_check(trainer)


class SavingTrainer(pl.Trainer):
    """Overrides ``save_checkpoint`` with Lightning's signature and records each call."""

    saves: ClassVar[list[Any]] = []

    def save_checkpoint(self, filepath, weights_only=False, storage_options=None):
        self.saves.append([os.path.basename(str(filepath)), weights_only])
        super().save_checkpoint(filepath, weights_only, storage_options)


class LogsLoss(Recorded):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


def callback_contracts(workdir: str) -> dict[str, Any]:
    stopping = CountingEarlyStopping(monitor="train_loss", patience=100)
    trainer = SavingTrainer(default_root_dir=workdir, max_epochs=3, callbacks=[stopping], logger=False,
                            enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LogsLoss(), _data(4))
    return {"early_stopping_checks": stopping.checks, "saves": SavingTrainer.saves,
            "kept": sorted(os.listdir(trainer.checkpoint_callback.dirpath))}


class SetupAveraging(WeightAveraging):
    """Reads the averaged copy in its own setup, after the base class's."""

    def setup(self, trainer, pl_module, stage) -> None:
        super().setup(trainer, pl_module, stage)
        copy = self._average_model.module
        self.seen = [type(copy).__name__, copy is not pl_module, copy._trainer is None,
                     copy.train_dataloader.__self__ is copy]


def weight_averaging(workdir: str) -> dict[str, Any]:
    callback = SetupAveraging()
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, callbacks=[callback], **QUIET)
    trainer.fit(Recorded(), _data(4))
    return {"setup": callback.seen, "n_averaged": int(callback._average_model.n_averaged)}


def _shape(loaders: Any) -> Any:
    """What ``trainer.*_dataloaders`` is: None, ``["list", lengths]`` or ``["one", length]``."""
    if loaders is None:
        return None
    if isinstance(loaders, list):
        return ["list", [len(loader) for loader in loaders]]
    return ["one", len(loaders), hasattr(loaders, "sampler")]


class MultiLoader(Recorded):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return super().validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return super().predict_step(batch, batch_idx)


def loader_attributes(workdir: str) -> dict[str, Any]:
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, **QUIET)
    out: dict[str, Any] = {"before": [_shape(trainer.val_dataloaders), _shape(trainer.test_dataloaders),
                                      _shape(trainer.predict_dataloaders)]}
    trainer.fit(Recorded(), _data(8), _data(6))
    out["one"] = _shape(trainer.val_dataloaders)
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, **QUIET)
    trainer.fit(MultiLoader(), _data(8), [_data(6), _data(4)])
    out["two"] = _shape(trainer.val_dataloaders)
    trainer.test(Recorded(), _data(2), verbose=False)
    out["test"] = _shape(trainer.test_dataloaders)
    trainer.predict(MultiLoader(), [_data(2), _data(4)])
    out["predict"] = _shape(trainer.predict_dataloaders)
    return out


class OwnLoaders(pl.LightningModule):
    """Builds its loaders from the global generator (as Lightning's demos do) and records what it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.order: list[str] = []
        self.seen: dict[str, list[Any]] = {"train": [], "val": []}

    def train_dataloader(self):
        self.order.append("train")
        return DataLoader(TensorDataset(torch.randn(8, 1)), batch_size=2)

    def val_dataloader(self):
        self.order.append("val")
        return DataLoader(TensorDataset(torch.randn(8, 1)), batch_size=2)

    def training_step(self, batch, batch_idx):
        self.seen["train"].append([round(v, 6) for v in batch[0].flatten().tolist()])
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.seen["val"].append([round(v, 6) for v in batch[0].flatten().tolist()])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader_order(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Only with a sanity check: without one, Lightning asks for the validation loaders at the first validation
    # (after the training loader's first pass drew its worker seed), Ember at fit's set-up.
    for sanity in (2,):
        pl.seed_everything(0, verbose=False)
        model = OwnLoaders()
        trainer = pl.Trainer(default_root_dir=workdir, max_epochs=2, overfit_batches=1, num_sanity_val_steps=sanity,
                             **QUIET)
        trainer.fit(model)
        out[f"sanity_{sanity}"] = [model.order, model.seen, round(float(torch.rand(1)), 6)]
    return out


class ClipsByEnum(Recorded):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm=GradClipAlgorithmType("value"))


def module_extras(workdir: str) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = ClipsByEnum()
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, **QUIET)
    trainer.fit(model, _data(4))
    x = torch.randn(3, 2)
    scripted = torch.jit.script(model)  # attached to its trainer, as Lightning's test does
    return {"weights": [round(v, 6) for v in model.layer.weight.flatten().tolist()], "fabric": model.fabric,
            "scripted": torch.equal(scripted(x), model(x)),
            "enum": [GradClipAlgorithmType.NORM == "norm", GradClipAlgorithmType.VALUE.value]}


class LimitsProbe(pl.Callback):
    """Reads the loop limits at setup, then stops the fit before its first batch."""

    def setup(self, trainer, pl_module, stage) -> None:
        self.at_setup = [trainer.max_epochs, trainer.max_steps]

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.should_stop = True


def loop_limits(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kwargs in (("none", {}), ("max_steps", {"max_steps": 3}), ("max_time", {"max_time": {"hours": 1}}),
                         ("unlimited", {"max_epochs": -1}), ("epochs", {"max_epochs": 2}),
                         ("steps_unlimited", {"max_steps": -1, "max_epochs": 3})):
        probe = LimitsProbe()
        trainer = pl.Trainer(default_root_dir=workdir, callbacks=[probe], **QUIET, **kwargs)
        before = [trainer.max_epochs, trainer.max_steps]
        trainer.fit(Recorded(), _data(4))
        out[name] = [before, probe.at_setup, [trainer.max_epochs, trainer.max_steps]]
    return out


class SchedulerTiming(Recorded):
    """An epoch StepLR and an epoch ReduceLROnPlateau on two parameter groups; records the rates each hook sees."""

    def _rates(self, where: str) -> None:
        groups = self.trainer.optimizers[0].param_groups
        self.calls.append([where, self.current_epoch, *(round(g["lr"], 6) for g in groups)])

    def training_step(self, batch, batch_idx):
        self._rates(f"train_{batch_idx}")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).pow(2).mean() + self.current_epoch)  # rises: the plateau acts
        if batch_idx == 0:
            self._rates("validation")

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self._rates(f"batch_end_{batch_idx}")

    def on_train_epoch_end(self) -> None:
        self._rates("epoch_end")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD([{"params": self.layer.weight}, {"params": self.layer.bias}], lr=1.0)
        step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.1)
        return [optimizer], [{"scheduler": step}, {"scheduler": plateau, "monitor": "val_loss"}]


def scheduler_timing(workdir: str) -> dict[str, Any]:
    model = SchedulerTiming()
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=2, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model, _data(4), _data(2))
    return {"rates": model.calls}


class BeforeBackward(Recorded):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.calls.append(["returned", round(float(loss), 6)])
        return loss

    def on_before_backward(self, loss) -> None:
        self.calls.append(["on_before_backward", round(float(loss), 6)])


def before_backward(workdir: str) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = BeforeBackward()
    trainer = pl.Trainer(default_root_dir=workdir, max_epochs=1, accumulate_grad_batches=2, **QUIET)
    trainer.fit(model, _data(4))
    return {"losses": [c for c in model.calls if c[0] != "train"]}


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: fn(os.path.join(workdir, name)) for name, fn in (
            ("module_hooks", module_hooks), ("logging", logging), ("callback_contracts", callback_contracts),
            ("weight_averaging", weight_averaging), ("loader_attributes", loader_attributes),
            ("loader_order", loader_order), ("module_extras", module_extras),
            ("loop_limits", loop_limits), ("scheduler_timing", scheduler_timing),
            ("before_backward", before_backward))}
