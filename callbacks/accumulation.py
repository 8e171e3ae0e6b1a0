"""`GradientAccumulationScheduler`: change ``accumulate_grad_batches`` by epoch."""

from __future__ import annotations

import warnings

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
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
        # Lightning's exception types and texts, then what to do.
        if any(not isinstance(e, int) or isinstance(e, bool) or e < 0 for e in scheduling):
            raise MisconfigurationException(f"Epoch should be an int greater than or equal to 0. Got "
                                            f"{list(scheduling.keys())}: use {{epoch: factor}} with int epochs.")
        if any(not isinstance(f, int) or isinstance(f, bool) or f < 1 for f in scheduling.values()):
            raise MisconfigurationException(f"Accumulation factor should be an int greater than 0. Got "
                                            f"{list(scheduling.values())}.")
        self.scheduling = dict(sorted(scheduling.items()))
        self._applied: int | None = None  # the factor this callback set last (trainer.accumulate_grad_batches)

    def factor(self, epoch: int) -> int:
        """The accumulation factor in ``epoch``."""
        factor = 1
        for start, value in self.scheduling.items():
            if epoch >= start:
                factor = value
        return factor

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        """Refuse a backend whose accumulation window is fixed when it sets up (DeepSpeed), with Lightning's words,
        before that set-up (Lightning raises the same at ``on_train_start``, after DeepSpeed's engine is built)."""
        backend = trainer.accelerator.backend
        if stage == "fit" and backend.fixes_accumulation_at_setup:
            raise RuntimeError("The `DeepSpeedStrategy` does not support `accumulate_grad_batches` changing between "
                               "epochs. DeepSpeed's engine is built with one accumulation window: remove the GradientAccumulationScheduler and set "
                               "Trainer(accumulate_grad_batches=N), or train with strategy='ddp' / 'fsdp' to change "
                               f"the window by epoch ({self.scheduling}).")

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Lightning's checks before training: automatic optimisation, no Trainer(accumulate_grad_batches=...)
        beside the callback, a warning for overridden optimizer hooks (called per step, not per batch)."""
        if not pl_module.automatic_optimization:
            raise RuntimeError("Automatic gradient accumulation and the `GradientAccumulationScheduler` is not "
                               "supported for manual optimization. Please remove the callback or switch to automatic "
                               "optimization (or accumulate in training_step yourself).")
        given = trainer.accumulate_grad_batches
        if given not in (None, 1, self._applied):  # the factor this callback set in an earlier fit is its own
            raise ValueError(f"You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler`"
                             f" callback. Either remove `accumulate_grad_batches` from the Trainer or remove the "
                             f"callback (Trainer(accumulate_grad_batches={given}), {self.scheduling}).")
        # Overridden: the method the module's class resolves is not TrainModule's own.
        module_type = type(pl_module)
        overridden = any(not getattr(getattr(module_type, name, None), "__qualname__", "TrainModule.").startswith(
            "TrainModule.") for name in ("optimizer_step", "optimizer_zero_grad"))
        if overridden and any(factor > 1 for factor in self.scheduling.values()):
            warnings.warn("When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                          "`LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch "
                          "(rather, they are called on every optimization step).", UserWarning, stacklevel=2)

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        # A documented setter: the trainer reads the factor at every batch when it decides the accumulation
        # window, so the new value holds from this epoch's first batch whatever runs after this hook.
        self._applied = trainer.accumulate_grad_batches = self.factor(trainer.current_epoch)
