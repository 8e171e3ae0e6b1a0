"""`LearningRateMonitor`: log each optimizer's learning rate (and optionally momentum / weight decay)."""

from __future__ import annotations

from typing import Any

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView
from engine.keywords import suggest_keywords


@suggest_keywords
class LearningRateMonitor(Callback):
    """Log ``lr-<Optimizer>`` (``/pg<i>`` per extra param group) to the trackers.

    With ``logging_interval=None`` each scheduler is logged at its own interval (optimizers without a scheduler
    every ``log_every_n_steps`` steps); ``"step"`` / ``"epoch"`` force one. Step values are logged before the
    batch that uses them, every ``trainer.log_every_n_steps`` optimizer steps; epoch values at each epoch start.
    The logged values are also kept in ``self.lrs`` (name -> list).

    Example:
        >>> LearningRateMonitor(logging_interval="step").logging_interval
        'step'
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(f"LearningRateMonitor(logging_interval=...) must be None, 'step' or 'epoch'. "
                             f"Received: {logging_interval!r}.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self._targets: list[tuple[str, Any, str]] = []  # (name, optimizer, interval)
        self._last_step = -1

    def on_train_start(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        if not trainer.accelerator.log_with and not trainer.fast_dev_run:
            raise ValueError("LearningRateMonitor has nowhere to log: the trainer has no trackers. Pass "
                             "Trainer(log_with='csv') (or another tracker), or remove the callback.")
        intervals = {id(c.scheduler.optimizer): (c.interval, c.name) for c in trainer.lr_scheduler_configs
                     if hasattr(c.scheduler, "optimizer")}
        self._targets, seen = [], {}
        for optimizer in trainer.optimizers:
            inner = getattr(optimizer, "optimizer", optimizer)  # the engine wraps it; name the user's class
            interval, name = intervals.get(id(inner), ("step", None))
            base = name or f"lr-{type(inner).__name__}"
            seen[base] = seen.get(base, -1) + 1
            self._targets.append((base if seen[base] == 0 else f"{base}-{seen[base]}", optimizer,
                                  self.logging_interval or interval))
        self.lrs = {name: [] for name, _, _ in self._targets}
        self._last_step = -1

    def on_train_batch_start(self, trainer: TrainerView, module: torch.nn.Module, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        # Once per optimizer step (not per accumulated micro-batch), every log_every_n_steps steps.
        if step % trainer.log_every_n_steps == 0 and step != self._last_step:
            self._last_step = step
            self._log(trainer, "step")

    def on_train_epoch_start(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        self._log(trainer, "epoch")

    def _log(self, trainer: TrainerView, interval: str) -> None:
        values: dict[str, float] = {}
        for name, optimizer, wanted in self._targets:
            if wanted != interval:
                continue
            for index, group in enumerate(optimizer.param_groups):
                key = name if index == 0 else f"{name}/pg{index + 1}"
                values[key] = float(group["lr"])
                self.lrs.setdefault(key, []).append(values[key])
                if self.log_momentum:
                    momentum = group.get("momentum", group.get("betas", (None,))[0])
                    if momentum is not None:
                        values[f"{key}-momentum"] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    values[f"{key}-weight_decay"] = float(group["weight_decay"])
        if values:
            trainer.log_metrics(values)
