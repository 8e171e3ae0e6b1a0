"""Lightning behaviours Ember conforms to (issue 27), each a small scenario whose outcome is recorded from Lightning.

Every function returns plain values: file listings, names, messages, counts. ``main`` runs them all; the
recording script runs this very file under Lightning (imports swapped back), the test under Ember.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import BackboneFinetuning, LearningRateMonitor, ModelCheckpoint, Timer
from callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from trainer.loggers import CSVLogger, TensorBoardLogger
from trainer.states import RunningStage, TrainerFn, TrainerStatus
from trainer.utilities.exceptions import MisconfigurationException

QUIET = {"enable_progress_bar": False, "enable_model_summary": False}


def _data(n: int = 16, batch_size: int = 4, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)


class Net(pl.LightningModule):
    """A linear regressor that logs ``train_loss`` and ``val_loss``; ``scores`` scripts a validation metric."""

    def __init__(self, scores: list[float] | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))
        if self.hparams.scores:
            self.log("score", self.hparams.scores[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _fit(workdir: str, model: pl.LightningModule, val: bool = True, **kwargs: Any) -> pl.Trainer:
    kwargs = {"default_root_dir": workdir, "logger": False, **QUIET, **kwargs}
    trainer = pl.Trainer(**kwargs)
    trainer.fit(model, _data(), _data(8) if val else None)
    return trainer


def _listing(path: str) -> list[str]:
    return sorted(os.listdir(path))


def checkpoints(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    top = ModelCheckpoint(dirpath=f"{workdir}/top", monitor="score", mode="max", save_top_k=2, save_last=True,
                          filename="{epoch}-{score:.1f}")
    _fit(workdir, Net(scores=[0.1, 0.7, 0.3, 0.5]), max_epochs=4, callbacks=[top])
    out["top_k_and_last"] = {"files": _listing(f"{workdir}/top"), "best": os.path.basename(top.best_model_path),
                             "last": os.path.basename(top.last_model_path),
                             "kth": os.path.basename(top.kth_best_model_path), "best_score": float(top.best_model_score)}
    newest = ModelCheckpoint(dirpath=f"{workdir}/newest")
    _fit(workdir, Net(), max_epochs=3, callbacks=[newest])
    out["no_monitor"] = {"files": _listing(f"{workdir}/newest"), "last": newest.last_model_path,
                         "best": os.path.basename(newest.best_model_path)}
    zero = ModelCheckpoint(dirpath=f"{workdir}/zero", save_top_k=0, save_last=True)
    _fit(workdir, Net(), max_epochs=2, callbacks=[zero])
    out["top_zero_last"] = {"files": _listing(f"{workdir}/zero"), "best": zero.best_model_path,
                            "islink": os.path.islink(zero.last_model_path)}
    for _ in range(2):
        _fit(workdir, Net(), max_epochs=1, callbacks=[ModelCheckpoint(dirpath=f"{workdir}/again", save_top_k=0,
                                                                      save_last=True)])
    out["last_versions"] = _listing(f"{workdir}/again")
    link = ModelCheckpoint(dirpath=f"{workdir}/link", monitor="score", mode="max", save_top_k=1, save_last="link",
                           filename="{epoch}")
    _fit(workdir, Net(scores=[0.5, 0.2, 0.9]), max_epochs=3, callbacks=[link])
    target = os.readlink(os.path.join(workdir, "link", "last.ckpt"))
    out["link"] = {"files": _listing(f"{workdir}/link"), "target": target}
    end = ModelCheckpoint(dirpath=f"{workdir}/end", every_n_epochs=0, save_last=True)
    _fit(workdir, Net(), max_epochs=2, callbacks=[end])
    out["every_n_epochs_0"] = _listing(f"{workdir}/end")
    steps = ModelCheckpoint(dirpath=f"{workdir}/steps", filename="{step}", every_n_train_steps=3, save_top_k=-1)
    _fit(workdir, Net(), max_epochs=2, val=False, callbacks=[steps])
    out["every_3_steps"] = _listing(f"{workdir}/steps")
    epoch_monitor = ModelCheckpoint(dirpath=f"{workdir}/epoch", monitor="epoch", mode="max", save_top_k=2,
                                    filename="{epoch}")
    _fit(workdir, Net(), max_epochs=3, callbacks=[epoch_monitor])
    out["monitor_epoch"] = {"files": _listing(f"{workdir}/epoch"), "score": float(epoch_monitor.best_model_score)}
    named = ModelCheckpoint(dirpath="/ckpt", filename="{epoch:02d}-{missing:.2f}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["names"] = [named.format_checkpoint_name({"epoch": 3}), named.format_checkpoint_name({"epoch": 3}, ver=2),
                        named.format_checkpoint_name({"epoch": 1}, filename="last"),
                        named.format_checkpoint_name({"epoch": 1}, prefix="exception")]
    out["constants"] = [ModelCheckpoint.CHECKPOINT_NAME_LAST, ModelCheckpoint.FILE_EXTENSION,
                        ModelCheckpoint.CHECKPOINT_JOIN_CHAR, ModelCheckpoint.STARTING_VERSION,
                        ModelCheckpoint().every_n_epochs, ModelCheckpoint(every_n_train_steps=5).every_n_epochs]
    errors = []
    for kwargs in ({"mode": "up"}, {"save_top_k": -3}, {"save_top_k": 3}, {"every_n_epochs": -1},
                   {"every_n_train_steps": 2, "every_n_epochs": 2}):
        try:
            ModelCheckpoint(**kwargs)
        except MisconfigurationException as error:
            errors.append(str(error))
    out["errors"] = errors
    return out


def early_stopping(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kwargs, scores in (("patience", {"patience": 2}, [0.5, 0.4, 0.45, 0.46, 0.47, 0.48]),
                                 ("threshold", {"stopping_threshold": 0.3}, [0.5, 0.4, 0.2, 0.1, 0.1, 0.1]),
                                 ("divergence", {"divergence_threshold": 0.8}, [0.5, 0.9, 0.2, 0.1, 0.1, 0.1]),
                                 ("non_finite", {}, [0.5, float("nan"), 0.2, 0.1, 0.1, 0.1]),
                                 ("not_stopped", {"patience": 9}, [0.5, 0.4, 0.3, 0.2, 0.1, 0.05])):
        stop = EarlyStopping(monitor="score", mode="min", **kwargs)
        trainer = _fit(workdir, Net(scores=scores), max_epochs=6, callbacks=[stop])
        message = stop.stopping_reason_message
        out[name] = {"reason": stop.stopping_reason.name, "value": stop.stopping_reason.value,
                     "stopped_epoch": stop.stopped_epoch, "epochs": trainer.current_epoch,
                     "message_start": None if message is None else message.split(" = ")[0].split(" did not")[0]}
    stop = EarlyStopping(monitor="score")
    stop.load_state_dict({"wait_count": 1, "stopped_epoch": 2, "best_score": 0.5, "patience": 3})
    out["old_state"] = [stop.stopping_reason.name, stop.stopping_reason_message]
    try:
        EarlyStopping(monitor="score", mode="up")
    except MisconfigurationException as error:
        out["mode_error_has"] = "`mode` can be" in str(error) and "got up" in str(error)
    out["reasons"] = [(r.name, r.value) for r in EarlyStoppingReason]
    return out


class TwoGroups(Net):
    def configure_optimizers(self):
        optimizer = torch.optim.Adam([{"params": [self.layer.weight]}, {"params": [self.layer.bias], "lr": 0.01}],
                                     lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


class TwoOptimizers(Net):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        for optimizer in self.optimizers():
            x, y = batch
            loss = nn.functional.mse_loss(self.layer(x), y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

    def configure_optimizers(self):
        return [torch.optim.Adam(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters(), lr=0.2)]


def lr_monitor(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, model in (("groups", TwoGroups()), ("two_optimizers", TwoOptimizers())):
        monitor = LearningRateMonitor(log_momentum=True, log_weight_decay=True)
        trainer = _fit(workdir, model, max_epochs=3, callbacks=[monitor], logger=CSVLogger(workdir, name=name),
                       log_every_n_steps=2)
        out[name] = {"lrs": monitor.lrs, "momentum": monitor.last_momentum_values,
                     "weight_decay": monitor.last_weight_decay_values,
                     "in_callback_metrics": sorted(k for k in trainer.callback_metrics if k.startswith("lr-"))}
    try:
        _fit(workdir, Net(), max_epochs=1, callbacks=[LearningRateMonitor()])
    except MisconfigurationException as error:
        out["no_logger"] = "`Trainer` that has no logger" in str(error)
    return out


def timer(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for interval in ("step", "epoch"):
        trainer = _fit(workdir, Net(), max_epochs=3, callbacks=[Timer(duration={"seconds": 0}, interval=interval)])
        out[interval] = [trainer.global_step, trainer.current_epoch]
    trainer = _fit(workdir, Net(), max_epochs=3, min_epochs=2, callbacks=[Timer(duration="00:00:00:00")])
    out["min_epochs"] = [trainer.global_step, trainer.current_epoch]
    stages = Timer()
    _fit(workdir, Net(), max_steps=3, callbacks=[stages])
    out["stages"] = [stages.time_elapsed("train") > 0, stages.time_elapsed("validate") > 0,
                     stages.time_elapsed("test") == 0, stages.start_time("test") is None]
    out["remaining"] = [Timer("00:00:01:30").time_remaining(), Timer({"minutes": 2}).time_remaining(),
                        Timer().time_remaining()]
    for kwargs in ({"duration": "1:00"}, {"interval": "batch"}):
        try:
            Timer(**kwargs)
        except MisconfigurationException as error:
            out.setdefault("errors", []).append(("DD:HH:MM:SS" in str(error), "Unsupported parameter" in str(error)))
    return out


class Probe(Net):
    """Records the dtypes a step sees (true precisions)."""

    def training_step(self, batch, batch_idx):
        self.seen = [str(batch[0].dtype), str(self.layer.weight.dtype), str(torch.get_default_dtype()),
                     str(torch.zeros(1).dtype)]
        return super().training_step(batch, batch_idx)


class NoOptimizer(Net):
    def configure_optimizers(self):
        return None

    def on_after_backward(self) -> None:
        self.backwards = getattr(self, "backwards", 0) + 1


def trainer_attributes(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for precision in ("64", "64-true", "bf16-true"):
        model = Probe()
        trainer = _fit(workdir, model, max_steps=1, precision=precision)
        out[f"precision_{precision}"] = [trainer.precision, *model.seen, str(torch.get_default_dtype())]
    out["precision_names"] = [pl.Trainer(precision=p, logger=False).precision for p in ("32", "16-true", 64)]
    stop = EarlyStopping(monitor="val_loss")
    trainer = _fit(workdir, Net(), max_epochs=1, callbacks=[stop], enable_progress_bar=True)
    out["attributes"] = [trainer.early_stopping_callback is stop, trainer.early_stopping_callbacks == [stop],
                         type(trainer.progress_bar_callback).__name__, trainer.num_devices, trainer.device_ids,
                         trainer.node_rank, trainer.num_nodes, trainer.interrupted, trainer.received_sigterm,
                         trainer.state.fn == TrainerFn.FITTING, trainer.state.status == TrainerStatus.FINISHED,
                         trainer.state.finished, trainer.ckpt_path, os.path.normpath(trainer.default_root_dir) ==
                         os.path.normpath(workdir)]
    out["no_bar"] = _fit(workdir, Net(), max_steps=1).progress_bar_callback is None

    class Fails(Net):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("fails")

    failing = pl.Trainer(default_root_dir=workdir, logger=False, **QUIET, max_epochs=1)
    try:
        failing.fit(Fails(), _data())
    except RuntimeError:
        pass
    out["after_failure"] = [failing.interrupted, failing.state.status == TrainerStatus.INTERRUPTED,
                            failing.state.stage is None or failing.state.stage == "idle"]
    out["stages"] = [RunningStage.TRAINING == "train", RunningStage.SANITY_CHECKING.dataloader_prefix,
                     RunningStage.VALIDATING.evaluating, TrainerFn("fit") == TrainerFn.FITTING]
    model = NoOptimizer()
    before = model.layer.weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(workdir, model, max_epochs=1, val=False)
    out["no_optimizer"] = [trainer.global_step, model.backwards, torch.equal(before, model.layer.weight),
                           any("returned `None`, this fit will run with no optimizer" in str(w.message)
                               for w in caught), repr(getattr(trainer.optimizers[0], "optimizer",
                                                              trainer.optimizers[0]))]
    return out


def loggers(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    root = os.path.join(workdir, "default")
    trainer = pl.Trainer(default_root_dir=root, max_epochs=1, **QUIET)
    trainer.fit(Net(), _data(), _data(8))
    out["default"] = [type(trainer.logger).__name__, os.path.relpath(trainer.log_dir, root),
                      os.path.relpath(trainer.checkpoint_callback.dirpath, root),
                      _listing(trainer.checkpoint_callback.dirpath)]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(trainer.log_dir)
    events.Reload()
    out["hp_metric"] = [(e.step, e.value) for e in events.Scalars("hp_metric")]
    root = os.path.join(workdir, "given")
    trainer = pl.Trainer(default_root_dir=root, logger=CSVLogger(root), max_epochs=1, **QUIET)
    trainer.fit(Net(), _data(), _data(8))
    out["csv_logger"] = [os.path.relpath(trainer.log_dir, root),
                         os.path.relpath(trainer.checkpoint_callback.dirpath, root),
                         _listing(trainer.log_dir)]
    tensorboard = TensorBoardLogger(os.path.join(workdir, "tb"), name="exp", version=3)
    out["tensorboard_log_dir"] = os.path.relpath(tensorboard.log_dir, workdir)
    trainer = pl.Trainer(default_root_dir=workdir, fast_dev_run=True, **QUIET)
    trainer.fit(Net(), _data(), _data(8))
    out["fast_dev_run"] = [type(trainer.logger).__name__, len(trainer.loggers)]
    return out


class Backbone(Net):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(self.backbone(x)), y)

    def on_train_epoch_start(self) -> None:
        optimizer = self.trainer.optimizers[0]
        self.groups = [*getattr(self, "groups", []), [round(g["lr"], 8) for g in optimizer.param_groups]]

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)


def finetuning(workdir: str) -> dict[str, Any]:
    model = Backbone()
    _fit(workdir, model, max_epochs=4, val=False, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1)])
    return {"groups": model.groups, "trainable": all(p.requires_grad for p in model.backbone.parameters())}


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: fn(os.path.join(workdir, name)) for name, fn in (
            ("checkpoints", checkpoints), ("early_stopping", early_stopping), ("lr_monitor", lr_monitor),
            ("timer", timer), ("trainer_attributes", trainer_attributes), ("loggers", loggers),
            ("finetuning", finetuning))}
