"""`SchedulerStepper`: steps the learning-rate schedulers ``configure_optimizers`` returned, when each is due."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from callbacks.exceptions import MisconfigurationException
from trainer.metrics.logger import MetricLogger
from trainer.optim import SchedulerConfig


class SchedulerStepper:
    """Step schedulers (``interval="step"``) after each optimizer step, plateau step schedulers at the batch
    boundary (after validation: they may monitor a validation metric); epoch schedulers, as Lightning, after the
    epoch's last batch (before its ``on_train_batch_end``, its validation and epoch-end hooks), plateau ones at
    the epoch's end (after validation).

    Under manual optimisation the module steps its schedulers itself (as in Lightning): give ``configs=[]``.

    Args:
        configs: the parsed scheduler configurations.
        step_fn: ``module.lr_scheduler_step(scheduler, metric)``.
        metrics: the trainer's metric record (its ``callback_metrics`` are read when a scheduler monitors one).

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        >>> stepper = SchedulerStepper([SchedulerConfig(sched, interval="step")], lambda s, m: s.step(), MetricLogger(1, None, None))
        >>> stepper.after_optimizer_step(global_step=1); opt.param_groups[0]["lr"]
        0.5
    """

    def __init__(self, configs: list[SchedulerConfig], step_fn: Callable[[Any, Any], None],
                 metrics: MetricLogger) -> None:
        self._step_fn = step_fn
        self._metrics = metrics
        self.per_step = [c for c in configs if c.interval == "step" and not c.reduce_on_plateau]
        self.plateau_per_step = [c for c in configs if c.interval == "step" and c.reduce_on_plateau]
        self.per_epoch = [c for c in configs if c.interval == "epoch" and not c.reduce_on_plateau]
        self.plateau_per_epoch = [c for c in configs if c.interval == "epoch" and c.reduce_on_plateau]

    def pause(self) -> None:
        """Step no scheduler for the rest of this fit: something else sets the learning rate (the learning-rate
        finder's sweep, as Lightning swaps the schedulers out for it; a plateau scheduler waiting for a validation
        metric would otherwise fail)."""
        self.per_step, self.plateau_per_step, self.per_epoch, self.plateau_per_epoch = [], [], [], []
    def after_optimizer_step(self, global_step: int) -> None:
        if self.per_step:
            self._step(self.per_step, global_step)

    def at_boundary(self, global_step: int) -> None:
        if self.plateau_per_step:
            self._step(self.plateau_per_step, global_step)

    def at_last_batch(self, epoch: int) -> None:
        """The epoch's last batch is done (its count known: a sized loader)."""
        if self.per_epoch:
            self._step(self.per_epoch, epoch + 1)

    def at_epoch_end(self, epoch: int, sized: bool) -> None:
        """A whole epoch ended; ``sized``: its last batch was known (``at_last_batch`` stepped the others)."""
        configs = self.plateau_per_epoch if sized else self.per_epoch + self.plateau_per_epoch
        if configs:
            self._step(configs, epoch + 1)

    def _step(self, configs: list[SchedulerConfig], count: int) -> None:
        for config in configs:
            if count % config.frequency:
                continue
            metric = None
            if config.monitor is not None:
                metrics = self._metrics.callback_metrics
                metric = metrics.get(config.monitor)
                if metric is None:
                    logged = sorted(metrics)
                    message = (f"ReduceLROnPlateau conditioned on metric {config.monitor} which is not available"
                               if config.reduce_on_plateau else
                               f"The scheduler {type(config.scheduler).__name__} monitors {config.monitor!r}, which "
                               "is not available")
                    if config.strict:
                        raise MisconfigurationException(
                            f"{message}. Available metrics are: {logged}. Condition can be set using `monitor` key in "
                            f"lr scheduler dict: log it with self.log({config.monitor!r}, ...), change 'monitor', or "
                            "set 'strict': False to skip the step.")
                    warnings.warn(f"{message} but strict is set to `False`. Skipping learning rate update.",
                                  RuntimeWarning, stacklevel=3)
                    continue
            self._step_fn(config.scheduler, metric)
