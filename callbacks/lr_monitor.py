"""`LearningRateMonitor`: log each optimizer's learning rate (and optionally momentum / weight decay)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView
from engine.keywords import suggest_keywords


@suggest_keywords
class LearningRateMonitor(Callback):
    """Log ``lr-<Optimizer>`` for each optimizer to the trackers, with Lightning's names and timing.

    Names: ``lr-<Optimizer class>`` (``lr-Adam``, a second Adam ``lr-Adam-1``), or the scheduler config's
    ``"name"``; with several parameter groups ``/pg1``, ``/pg2``... (or ``/<group's "name">``). When a group is
    added during training (e.g. by ``BackboneFinetuning``) the optimizer's first name becomes ``.../pg1`` and
    keeps its history. Momentum and weight decay are logged as ``<name>-momentum`` / ``<name>-weight_decay``.

    When: an optimizer with a scheduler at its scheduler's interval; one without a scheduler at both; a step
    value before each batch that ends a ``log_every_n_steps`` interval, an epoch value at each epoch start
    (``logging_interval="step"`` / ``"epoch"`` forces one). Logged values go to the trackers, into
    ``trainer.callback_metrics`` (so ``EarlyStopping`` can monitor a learning rate) and into ``self.lrs``
    (name -> list); the newest momentum / weight decay values are in ``last_momentum_values`` /
    ``last_weight_decay_values``.

    Example:
        >>> LearningRateMonitor(logging_interval="step").logging_interval
        'step'
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise MisconfigurationException(f"LearningRateMonitor(logging_interval={logging_interval!r}): "
                                            "logging_interval should be `step` or `epoch` or `None`.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}
        self._last_count = -1

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if not trainer.loggers:
            raise MisconfigurationException("Cannot use `LearningRateMonitor` callback with `Trainer` that has no "
                                            "logger: pass Trainer(logger=...) or log_with=..., or remove the callback.")
        if self.log_momentum and not all("momentum" in o.defaults or "betas" in o.defaults
                                         for o in _unwrapped(trainer.optimizers)):
            warnings.warn("You have set log_momentum=True, but some optimizers do not have momentum. This will log "
                          "a value 0 for the momentum.", RuntimeWarning, stacklevel=2)
        names = [name for group in self._names(trainer) for _, names in group for name in names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}
        self._last_count = -1

    def on_train_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module,
                             batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "epoch":
            return
        # Batches that stepped the optimizers so far: optimizer steps, or batches under manual optimisation.
        automatic = getattr(pl_module, "automatic_optimization", True)
        count = trainer.global_step if automatic else trainer.state.micro_step
        # Before the batch that ends a log_every_n_steps interval (its metrics are logged at its end), once per
        # optimizer step (not again for each accumulated micro-batch).
        if (count + 1) % trainer.log_every_n_steps == 0 and count != self._last_count:
            self._last_count = count
            self._log(trainer, "step" if self.logging_interval is None else "any")

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch" if self.logging_interval is None else "any")

    def _names(self, trainer: TrainerView) -> list[list[tuple[Any, list[str]]]]:
        """``[with schedulers, without]``: each a list of (optimizer, the names of its parameter groups)."""
        with_scheduler: list[tuple[Any, list[str]]] = []
        seen: list[Any] = []
        per_class: dict[type, int] = {}
        for config in trainer.lr_scheduler_configs:
            optimizer = getattr(config.scheduler, "optimizer", None)
            if optimizer is None or any(optimizer is s for s in seen):
                continue
            seen.append(optimizer)
            with_scheduler.append((optimizer, self._group_names(optimizer, config.name, per_class)))
        without = [(o, self._group_names(o, None, per_class)) for o in _unwrapped(trainer.optimizers)
                   if not any(o is s for s in seen)]
        return [with_scheduler, without]

    @staticmethod
    def _group_names(optimizer: torch.optim.Optimizer, name: str | None, per_class: dict[type, int]) -> list[str]:
        if name is None:
            count = per_class[type(optimizer)] = per_class.get(type(optimizer), 0) + 1
            name = f"lr-{type(optimizer).__name__}" + (f"-{count - 1}" if count > 1 else "")
        groups = optimizer.param_groups
        given = [g.get("name") for g in groups]
        duplicated = sorted({n for n in given if n is not None and given.count(n) > 1})
        if duplicated:
            raise MisconfigurationException(f"A single `Optimizer` cannot have multiple parameter groups with "
                                            f"identical `name` values. {name} has duplicated parameter group names "
                                            f"{duplicated}: give each group its own name.")
        if len(groups) == 1:
            return [f"{name}/{given[0]}" if given[0] else name]
        return [f"{name}/{g if g else f'pg{i + 1}'}" for i, g in enumerate(given)]

    def _rename(self, names: list[str]) -> None:
        """A group added to an optimizer: its former single name moves (with its history) to ``.../pg1``."""
        for name in names:
            old = name.replace("/pg1", "")
            if "/pg1" in name and old in self.lrs:
                self.lrs[name] = self.lrs.pop(old)
            elif name not in self.lrs:
                self.lrs[name] = []

    def _log(self, trainer: TrainerView, interval: str) -> None:
        with_scheduler, without = self._names(trainer)
        intervals = {id(getattr(c.scheduler, "optimizer", None)): c.interval for c in trainer.lr_scheduler_configs}
        values: dict[str, float] = {}
        for group, every in ((with_scheduler, False), (without, True)):
            self._rename([name for _, names in group for name in names])
            for optimizer, names in group:
                if every or interval in ("any", intervals.get(id(optimizer))):
                    values.update(self._values(optimizer, names))
        if values:
            trainer.callback_metrics.update({k: torch.tensor(v) for k, v in values.items()})
            trainer.log_metrics(values)

    def _values(self, optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, float]:
        values: dict[str, float] = {}
        betas = "betas" in optimizer.defaults
        for group, name in zip(optimizer.param_groups, names):
            values[name] = group["lr"]
            self.lrs[name].append(group["lr"])
            if self.log_momentum:
                momentum = group["betas"][0] if betas else group.get("momentum", 0)
                values[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = momentum
            if self.log_weight_decay:
                decay = group["weight_decay"]
                values[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = decay
        return values


def _unwrapped(optimizers: list[Any]) -> list[torch.optim.Optimizer]:
    """The user's optimizers (the engine wraps them; names and identities are the user's)."""
    return [getattr(o, "optimizer", o) for o in optimizers]
