"""`GradientAccumulationScheduler`: change ``accumulate_grad_batches`` by epoch."""

from __future__ import annotations

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView


class GradientAccumulationScheduler(Callback):
    """Accumulate ``scheduling[e]`` batches per optimizer step from epoch ``e`` on (1 before the first key).

    Example:
        >>> scheduler = GradientAccumulationScheduler({0: 1, 4: 2, 8: 4})
        >>> [scheduler.factor(e) for e in (0, 3, 4, 9)]
        [1, 1, 2, 4]
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not isinstance(scheduling, dict) or not scheduling:
            raise ValueError(f"GradientAccumulationScheduler needs a non-empty dict {{epoch: factor}}. Received: "
                             f"{scheduling!r}.")
        for epoch, factor in scheduling.items():
            if not (isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0):
                raise ValueError(f"GradientAccumulationScheduler epochs must be ints >= 0. Received key {epoch!r}.")
            if not (isinstance(factor, int) and not isinstance(factor, bool) and factor >= 1):
                raise ValueError(f"GradientAccumulationScheduler factors must be ints >= 1. Received {factor!r} for "
                                 f"epoch {epoch}.")
        self.scheduling = dict(sorted(scheduling.items()))

    def factor(self, epoch: int) -> int:
        """The accumulation factor in ``epoch``."""
        factor = 1
        for start, value in self.scheduling.items():
            if epoch >= start:
                factor = value
        return factor

    def setup(self, trainer: TrainerView, module: torch.nn.Module, stage: str) -> None:
        if stage != "fit":
            return
        if not module.automatic_optimization:
            raise ValueError("GradientAccumulationScheduler needs automatic optimisation; under manual optimisation "
                             "accumulate in training_step instead.")
        given = trainer.accumulate_grad_batches
        if given not in (None, 1, *self.scheduling.values()):
            raise ValueError(f"Trainer(accumulate_grad_batches={given}) conflicts with GradientAccumulationScheduler"
                             f"({self.scheduling}): drop one of them.")

    def on_train_epoch_start(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        # A documented setter: the trainer reads the factor at every batch when it decides the accumulation
        # window, so the new value holds from this epoch's first batch whatever runs after this hook.
        trainer.accumulate_grad_batches = self.factor(trainer.current_epoch)
