"""`LearningRateFinder`: Lightning's learning-rate range test as a callback (``Tuner.lr_find`` when fit starts)."""

from __future__ import annotations

from typing import Any

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView


class LearningRateFinder(Callback):
    """Run a learning-rate search when fit starts and train with the suggested rate.

    The search is ``Tuner.lr_find`` on the fit's training data (a short-lived trainer with your trainer's
    settings; the module's weights and the random state are restored afterwards). With ``update_attr`` the
    suggestion is written to the module's ``lr`` / ``learning_rate`` (or ``attr_name``) and into the param groups
    of the optimizers the fit already built. The result (``results``, ``suggestion()``, ``plot()``) is kept in
    ``optimal_lr``. Override ``on_fit_start`` and call ``self.lr_find(trainer, module)`` from another hook to
    search at other times (e.g. at given epochs when fine-tuning).

    Args:
        min_lr / max_lr: the range swept.
        num_training_steps: optimizer steps of the sweep.
        mode: ``"exponential"`` or ``"linear"`` steps between the rates.
        early_stop_threshold: stop once the loss exceeds this many times the best (None: never).
        update_attr / attr_name: write the suggestion to the module (``attr_name``: default ``lr`` or
            ``learning_rate``, on the module or its hparams).

    Example:
        >>> LearningRateFinder(min_lr=1e-5, max_lr=1.0, num_training_steps=50).optimal_lr is None
        True
    """

    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100,
                 mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                 attr_name: str = "") -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ValueError(f"LearningRateFinder(mode={mode!r}): `mode` should be either of {self.SUPPORTED_MODES}.")
        self._min_lr = min_lr
        self._max_lr = max_lr
        self._num_training_steps = num_training_steps
        self._mode = mode
        self._early_stop_threshold = early_stop_threshold
        self._update_attr = update_attr
        self._attr_name = attr_name
        self.optimal_lr: Any = None

    def lr_find(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Search now, on ``trainer``'s training data; apply the suggestion (``update_attr``)."""
        if len(trainer.optimizers) > 1:
            raise MisconfigurationException("LearningRateFinder works with one optimizer; the module configures "
                                            f"{len(trainer.optimizers)}. Search each rate separately.")
        self.optimal_lr = trainer.lr_find(pl_module, min_lr=self._min_lr, max_lr=self._max_lr,
                                          num_training=self._num_training_steps, mode=self._mode,
                                          early_stop_threshold=self._early_stop_threshold,
                                          update_attr=self._update_attr, attr_name=self._attr_name)
        suggestion = self.optimal_lr.suggestion() if self._update_attr else None
        if suggestion is not None:  # the fit's optimizers exist already: they take the rate too
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = suggestion

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.lr_find(trainer, pl_module)
