"""The learning-rate range test behind ``Tuner.lr_find``: the sweep callback and its result (``LRFinder``).

The learning rate grows from ``min_lr`` to ``max_lr`` over ``num_training`` optimizer steps; the loss of each step
is smoothed (exponential moving average with bias correction) and the sweep stops early once it exceeds
``early_stop_threshold`` times the best smoothed loss. The suggestion is the learning rate where the smoothed loss
falls fastest against the learning rate (the most negative gradient), skipping the first and last points.

Every formula is Lightning 2.6's, quirks included, so a suggestion matches Lightning's on the same run (a test
checks it against values recorded from Lightning): step 0 uses ``min_lr`` and step ``i > 0`` the rate at
``(i + 1) / num_training`` of the way, the bias correction uses ``beta ** (step + 1)``, and the gradient is taken
with the learning rates as spacing.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import torch

from callbacks import Callback
from callbacks.protocols import TrainerView
from trainer.utilities.exceptions import MisconfigurationException

MODES = ("exponential", "linear")


class LRFinder:
    """The result of ``Tuner.lr_find``: ``results = {"lr": [...], "loss": [...]}``, ``suggestion()``, ``plot()``.

    Example:
        >>> finder = LRFinder(1e-4, 1.0, 5, "exponential")
        >>> [round(finder.lr_at(i), 6) for i in range(5)]
        [0.0001, 0.003981, 0.025119, 0.158489, 1.0]
    """

    def __init__(self, min_lr: float, max_lr: float, num_training: int, mode: str) -> None:
        self.min_lr, self.max_lr, self.num_training, self.mode = min_lr, max_lr, num_training, mode
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self._optimal_idx: int | None = None

    def lr_at(self, step: int) -> float:
        """The learning rate of sweep step ``step`` (0-based), as Lightning's ``_ExponentialLR`` / ``_LinearLR``."""
        fraction = 0.0 if step == 0 else (step + 1) / self.num_training
        if self.mode == "linear":
            return self.min_lr + (self.max_lr - self.min_lr) * fraction
        return self.min_lr * (self.max_lr / self.min_lr) ** fraction

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss decreases fastest (``None``, with a warning, if too few
        finite points remain after skipping ``skip_begin`` / ``skip_end`` of them)."""
        losses = torch.tensor(self.results["loss"][skip_begin:len(self.results["loss"]) - skip_end],
                              dtype=torch.float64)
        lrs = self.results["lr"][skip_begin:len(self.results["lr"]) - skip_end]
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], [lr for lr, ok in zip(lrs, finite.tolist()) if ok]
        if len(losses) < 2:
            warnings.warn("LRFinder: too few finite losses to suggest a learning rate; run more steps "
                          "(num_training) or lower skip_begin.", UserWarning, stacklevel=2)
            self._optimal_idx = None
            return None
        spacing = torch.tensor(lrs, dtype=torch.float64)
        best = int(torch.argmin(torch.gradient(losses, spacing=[spacing])[0]).item())
        self._optimal_idx = self.results["lr"].index(lrs[best])
        return lrs[best]

    def plot(self, path: str | os.PathLike[str] | None = None, suggest: bool = True, show: bool = False) -> Any:
        """A matplotlib figure of loss against learning rate (log scale for the exponential sweep), with the
        suggestion marked; saved as a PNG at ``path`` when given. Needs matplotlib (``ember-train[examples]``)."""
        try:
            import matplotlib

            if not show:
                matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("LRFinder.plot needs matplotlib: pip install matplotlib (or "
                              "\"ember-train[examples]\").") from None
        figure, axes = plt.subplots()
        axes.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            axes.set_xscale("log")
        axes.set_xlabel("Learning rate")
        axes.set_ylabel("Loss (smoothed)")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            index = self._optimal_idx
            axes.plot(self.results["lr"][index], self.results["loss"][index], markersize=10, marker="o", color="red")
        if path is not None:
            figure.savefig(os.fspath(path), format="png")
        if show:
            plt.show()
        return figure


class LRSweep(Callback):
    """Sets each optimizer step's learning rate and records the smoothed, cross-process mean loss."""

    def __init__(self, finder: LRFinder, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.finder = finder
        self.early_stop_threshold = early_stop_threshold
        self.beta = beta
        self._average = 0.0
        self._best = math.inf

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            raise MisconfigurationException(f"`model.configure_optimizers()` returned {len(optimizers)}, but learning "
                                            "rate finder only works with single optimizer")
        trainer.schedulers.pause()  # the sweep owns the learning rate during the search

    def on_before_optimizer_step(self, trainer: TrainerView, pl_module: torch.nn.Module,
                                 optimizer: torch.optim.Optimizer) -> None:
        lr = self.finder.lr_at(trainer.global_step)
        for group in optimizer.param_groups:  # over any scheduler of the module: the sweep owns the rate
            group["lr"] = lr

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps done, this one included
        if step == len(self.finder.results["lr"]):
            return  # mid accumulation window: no step yet
        if not isinstance(outputs, dict) or "loss" not in outputs:  # training_step returned None: a NaN point,
            self.finder.results["lr"].append(self.finder.lr_at(step - 1))  # which the suggestion leaves out
            self.finder.results["loss"].append(math.nan)
            return
        loss = outputs["loss"].detach().float().reshape(())
        if trainer.world_size > 1:  # every process records (and decides on) the same curve
            loss = trainer.accelerator.reduce(loss, "mean")
        value = float(loss.item())
        self._average = self.beta * self._average + (1 - self.beta) * value
        smoothed = self._average / (1 - self.beta ** (step + 1))
        if self.early_stop_threshold is not None and step > 1 and (
                not math.isfinite(smoothed) or smoothed > self.early_stop_threshold * self._best):
            trainer.should_stop = True  # diverged: the rest of the sweep would only grow
        if smoothed < self._best or step == 1:
            self._best = smoothed
        self.finder.results["lr"].append(self.finder.lr_at(step - 1))
        self.finder.results["loss"].append(smoothed)
