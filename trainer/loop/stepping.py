"""Checks on what a module and its ``training_step`` return, and what the batch-end hooks receive."""

from __future__ import annotations

from typing import Any

import torch

from trainer.errors import MisconfigurationError
from trainer.loop.hooks import overrides
from trainer.loop.run import check_module
from trainer.module import TrainModule
from trainer.tools.compiling import unwrap_compiled


def check_trainable(module: Any, accumulate: int | None, clip: float | None, on_nonfinite_loss: str) -> None:
    """Fail before any set-up work when ``module`` cannot be trained as configured."""
    module = check_module(unwrap_compiled(module)[0])  # fit(torch.compile(module)) trains the module inside
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
