"""`StepMixin`: the parts of a training step around ``training_step``: backward, the optimizer step,
schedulers, and the non-finite loss check; plus the checks on what a module and its step return."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from engine import Accelerator, gather_object
from trainer.errors import MisconfigurationError
from trainer.hooks import HookTable, overrides
from trainer.metrics import MetricLogger
from trainer.module import TrainModule
from trainer.optim import SchedulerConfig
from trainer.state import TrainState

NONFINITE_CHOICES = ("raise", "skip", "ignore")


class StepMixin:
    """Backward, optimizer step, scheduler steps and the non-finite loss check of ``Trainer``."""

    accelerator: Accelerator
    state: TrainState
    module: TrainModule | None
    optimizers: list[torch.optim.Optimizer]
    gradient_clip_val: float | None
    gradient_clip_algorithm: str
    on_nonfinite_loss: str
    _hooks: HookTable | None
    _metrics: MetricLogger
    _clip: bool
    _custom_optimizer_step: bool
    _custom_zero_grad: bool
    _step_schedulers_list: list[SchedulerConfig]
    _unchecked: list[tuple[torch.Tensor, int, int, int]]  # (loss, optimizer step, epoch, batch) not yet checked
    _world: int

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self._hooks
        assert hooks is not None
        # The per-step hooks loop over their (usually empty) tuples of overriders: no call when nobody overrides.
        for hook in hooks.overriders["on_before_backward"]:
            hook(loss)
        self.accelerator.backward(loss, *args, **kwargs)
        for hook in hooks.overriders["on_after_backward"]:
            hook()

    def _optimizer_step(self, batch_idx: int, loss: torch.Tensor) -> None:
        hooks, module, state = self._hooks, self.module, self.state
        assert hooks is not None and module is not None
        optimizer = self.optimizers[0]
        if self.on_nonfinite_loss == "skip" and self._skip_nonfinite():
            optimizer.zero_grad()  # the window's gradients hold the non-finite values: drop them with the step
            return
        for hook in hooks.overriders["on_before_optimizer_step"]:
            hook(optimizer)
        if self._clip:
            module.configure_gradient_clipping(optimizer, self.gradient_clip_val, self.gradient_clip_algorithm)
        # The module's optimizer_step / optimizer_zero_grad are only called when overridden (a call saved per step).
        if self._custom_optimizer_step:
            module.optimizer_step(state.epoch, batch_idx, optimizer, lambda: loss)
        else:
            optimizer.step()
        for hook in hooks.overriders["on_before_zero_grad"]:
            hook(optimizer)
        if self._custom_zero_grad:
            module.optimizer_zero_grad(state.epoch, batch_idx, optimizer)
        else:
            optimizer.zero_grad()
        state.global_step += 1
        if self._step_schedulers_list and not getattr(optimizer, "step_was_skipped", False):
            self._step_schedulers(self._step_schedulers_list)

    def _skip_nonfinite(self) -> bool:
        """``on_nonfinite_loss="skip"``: whether this optimizer step must be dropped (one host sync per step)."""
        return self._check_losses(skip=True)

    def _check_losses(self, skip: bool = False) -> bool:
        """Check the losses recorded since the last check; every process reaches the same verdict.

        With ``"raise"`` this runs at points every process reaches together and that already cost a sync or
        matter: each log interval, before each checkpoint, at epoch and fit ends (so no NaN checkpoint is ever
        written); nothing per step. It raises a ``FloatingPointError`` naming the first non-finite loss of each
        process. With ``skip=True`` (``"skip"``, before each optimizer step) it returns whether any was found.
        """
        if not skip and self.on_nonfinite_loss != "raise":
            return False  # "skip" checks before each step, "ignore" never
        pending, self._unchecked = self._unchecked, []
        if not pending and self._world == 1:
            return False
        device = self.accelerator.device
        losses = torch.stack([loss for loss, *_ in pending]) if pending else torch.zeros(0, device=device)
        bad = (~torch.isfinite(losses)).sum()
        if self._world > 1:
            bad = self.accelerator.reduce(bad.to(device), "sum")  # every process decides alike
        if not int(bad.item()):
            return False
        values = losses.tolist()
        first = next(((loss, *where) for loss, (_, *where) in zip(values, pending) if not math.isfinite(loss)), None)
        found = [(0, first)] if self._world == 1 else list(enumerate(gather_object([first])))
        details = "; ".join(f"rank {rank}: {loss} at optimizer step {step} (epoch {epoch}, batch {batch})"
                            for rank, item in found if item is not None for loss, step, epoch, batch in [item])
        message = f"Non-finite loss: {details}."
        if not skip:
            raise FloatingPointError(f"{message} Training stopped on every process. Find the operation with "
                                     "Trainer(detect_anomaly=True), lower the learning rate or set gradient_clip_val; "
                                     "Trainer(on_nonfinite_loss='skip') skips such steps instead.")
        if self.accelerator.is_main_process:
            warnings.warn(f"{message} Skipping this optimizer step (on_nonfinite_loss='skip').", UserWarning,
                          stacklevel=3)
        return True

    def _record_loss(self, loss: torch.Tensor, batch_idx: int) -> None:
        """Keep ``loss`` (no sync) for the next check; a very long log interval is checked every 1024."""
        state, loss = self.state, loss.detach()
        self._unchecked.append((loss.reshape(()) if loss.ndim else loss, state.global_step + 1, state.epoch, batch_idx))
        if len(self._unchecked) >= 1024 and self.on_nonfinite_loss == "raise":
            self._check_losses()

    def _check_manual_loss(self, outputs: Any, batch_idx: int) -> None:
        """Under manual optimisation the module steps itself: a non-finite returned loss can only stop the run."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._record_loss(loss, batch_idx)

    def _step_schedulers(self, configs: list[SchedulerConfig]) -> None:
        """Step each of ``configs`` that is due (empty under manual optimisation: the module steps them)."""
        for config in configs:
            count = self.state.global_step if config.interval == "step" else self.state.epoch + 1
            if count % config.frequency:
                continue
            metric = None
            if config.monitor is not None:
                metric = self._metrics.callback_metrics.get(config.monitor)
                if metric is None:
                    logged = sorted(self._metrics.callback_metrics)
                    message = (f"The scheduler {type(config.scheduler).__name__} monitors {config.monitor!r}, which "
                               f"was never logged. Logged metrics: {logged}. Log it with self.log({config.monitor!r}"
                               ", ...) or change 'monitor'")
                    if config.strict:
                        raise KeyError(message + " (or set 'strict': False to skip the step).")
                    warnings.warn(message + "; skipping this scheduler step.", UserWarning, stacklevel=2)
                    continue
            self.module.lr_scheduler_step(config.scheduler, metric)  # type: ignore[union-attr]


def check_trainable(module: Any, accumulate: int | None, clip: float | None, on_nonfinite_loss: str) -> None:
    """Fail before any set-up work when ``module`` cannot be trained as configured."""
    if not isinstance(module, TrainModule):
        raise TypeError(f"The trainer runs TrainModule subclasses. Received: {type(module).__name__}: derive your "
                        "model from trainer.TrainModule.")
    name = type(module).__name__
    if not overrides(module, TrainModule, "training_step"):
        raise MisconfigurationError(f"{name} has no training_step: add `def training_step(self, batch, batch_idx)` "
                                  "returning the loss.")
    if not overrides(module, TrainModule, "configure_optimizers"):
        raise MisconfigurationError(f"{name} has no configure_optimizers: add `def configure_optimizers(self): return "
                                  "torch.optim.AdamW(self.parameters(), lr=1e-3)`.")
    if not module.automatic_optimization and ((accumulate or 1) > 1 or clip is not None):
        raise ValueError(f"{name} uses manual optimisation, which does its own accumulation and clipping: remove "
                         f"Trainer(accumulate_grad_batches={accumulate}, gradient_clip_val={clip}) and do them in "
                         "training_step.")
    if not module.automatic_optimization and on_nonfinite_loss == "skip":
        raise ValueError(f"{name} uses manual optimisation, so the trainer cannot skip its optimizer steps: use "
                         "Trainer(on_nonfinite_loss='raise' or 'ignore') and check the loss in training_step.")


def loss_of(outputs: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned (a tensor, a dict with ``"loss"``, or ``None``)."""
    if isinstance(outputs, torch.Tensor):
        loss = outputs
    elif isinstance(outputs, dict) and "loss" in outputs:
        loss = outputs["loss"]
    elif outputs is None:
        return None
    else:
        keys = f" with keys {sorted(outputs)}" if isinstance(outputs, dict) else ""
        raise TypeError(f"training_step returned {type(outputs).__name__}{keys}; return the loss tensor, a dict with "
                        "a 'loss' key, or None to skip the batch.")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise ValueError(f"training_step's loss must be a scalar tensor that requires grad. Received: {loss!r:.100}."
                         " Return the loss before .item() / .detach(), computed outside torch.no_grad().")
    return loss
