"""Checks on what a module and its ``training_step`` return, and what the batch-end hooks receive."""

from __future__ import annotations

from typing import Any

import torch

from callbacks.exceptions import MisconfigurationException
from trainer.errors import MisconfigurationError
from trainer.loop.hooks import overrides
from trainer.loop.run import check_module
from trainer.module import TrainModule
from trainer.tools.compiling import unwrap_compiled


def check_trainable(module: Any, accumulate: int | None, clip: float | None, on_nonfinite_loss: str) -> None:
    """Fail before any set-up work when ``module`` cannot be trained as configured."""
    module = check_module(unwrap_compiled(module)[0])  # fit(torch.compile(module)) trains the module inside
    name = type(module).__name__
    # Lightning's words open each message (code written for it matches them); what to do follows.
    minimum = ("Lightning `Trainer` expects as minimum a `training_step()`, `train_dataloader()` and "
               "`configure_optimizers()` to be defined")
    if not overrides(module, TrainModule, "training_step"):
        raise MisconfigurationError(f"No `training_step()` method defined. {minimum}: add to {name} `def "
                                    "training_step(self, batch, batch_idx)` returning the loss.")
    if not overrides(module, TrainModule, "configure_optimizers"):
        raise MisconfigurationError(f"No `configure_optimizers()` method defined. {minimum}: add to {name} `def "
                                    "configure_optimizers(self): return torch.optim.AdamW(self.parameters(), "
                                    "lr=1e-3)`.")
    if not module.automatic_optimization and clip is not None and clip > 0:
        raise MisconfigurationException(
            f"Automatic gradient clipping is not supported for manual optimization ({name}.automatic_optimization "
            f"is False). Remove `Trainer(gradient_clip_val={clip})` and clip in training_step "
            "(self.clip_gradients(...)), or switch to automatic optimization.")
    if not module.automatic_optimization and (accumulate or 1) != 1:
        raise MisconfigurationException(
            f"Automatic gradient accumulation is not supported for manual optimization ({name}."
            f"automatic_optimization is False). Remove `Trainer(accumulate_grad_batches={accumulate})` and step "
            "the optimizer every N batches in training_step, or switch to automatic optimization.")
    if not module.automatic_optimization and on_nonfinite_loss == "skip":
        raise ValueError(f"{name} uses manual optimisation, so the trainer cannot skip its optimizer steps: use "
                         "Trainer(on_nonfinite_loss='raise' or 'ignore') and check the loss in training_step.")


def check_evaluable(module: Any, kind: str) -> None:
    """Fail before any set-up work when ``module`` cannot run ``trainer.<kind>()`` (``validate`` / ``test`` /
    ``predict``), in Lightning's words, then what to add."""
    name = type(module).__name__
    if kind != "predict":
        step = "validation_step" if kind == "validate" else "test_step"
        if not overrides(module, TrainModule, step):
            raise MisconfigurationError(f"No `{step}()` method defined to run `Trainer.{kind}`: add to {name} "
                                        f"`def {step}(self, batch, batch_idx)`.")
        return
    if getattr(module, "predict_step", None) is None:
        raise MisconfigurationError(f"`predict_step` cannot be None to run `Trainer.predict`: remove "
                                    f"{name}.predict_step = None, or define it.")
    if not overrides(module, TrainModule, "predict_step") and not overrides(module, torch.nn.Module, "forward"):
        raise MisconfigurationError(f"`Trainer.predict` requires `forward` method to run: {name}.predict_step is "
                                    "the default (self(batch)), so define forward or predict_step.")


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


def detached(outputs: Any, loss: torch.Tensor | None) -> Any:
    """What the batch-end hooks get, as in Lightning: the step's outputs as a dict whose tensors are detached
    (``{}`` for a step that returned ``None``)."""
    if outputs is None:
        return {}
    if isinstance(outputs, torch.Tensor):
        return {"loss": (loss if loss is not None else outputs).detach()}
    if isinstance(outputs, dict):
        return {key: v.detach() if isinstance(v, torch.Tensor) else v for key, v in outputs.items()}
    return outputs
