"""`LossCheck`: the non-finite loss policy (``Trainer(on_nonfinite_loss=...)``), decided alike on every process."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from engine import Accelerator, gather_object
from trainer.state import TrainState

# A very long log interval is still checked this often, so the kept losses stay bounded.
MAX_PENDING = 1024


class LossCheck:
    """Keeps the losses of the steps since the last check and checks them where every process meets.

    With ``"raise"`` the check runs at points that already cost a sync or matter: each log interval, before
    each checkpoint, at epoch and fit ends (so no checkpoint holds a NaN); nothing per step. With ``"skip"``
    the trainer asks ``should_skip()`` before every optimizer step (one host sync each). ``"ignore"`` keeps
    nothing.

    Example:
        >>> from engine import Accelerator
        >>> check = LossCheck("raise", Accelerator(cpu=True), TrainState())
        >>> check.record(torch.tensor(1.0), batch_idx=0)
        >>> check.check()
        False
    """

    def __init__(self, policy: str, accelerator: Accelerator, state: TrainState) -> None:
        self.policy = policy
        self.active = policy != "ignore"  # read per step: whether to record at all
        self.accelerator = accelerator
        self.state = state
        self.world = accelerator.num_processes
        self._pending: list[tuple[torch.Tensor, int, int, int]] = []  # (loss, optimizer step, epoch, batch)

    def reset(self) -> None:
        self._pending = []

    def record(self, loss: torch.Tensor, batch_idx: int) -> None:
        """Keep ``loss`` (no sync) for the next check."""
        state, loss = self.state, loss.detach()
        self._pending.append((loss.reshape(()) if loss.ndim else loss, state.global_step + 1, state.epoch, batch_idx))
        if len(self._pending) >= MAX_PENDING and self.policy == "raise":
            self.check()

    def record_output(self, outputs: Any, batch_idx: int) -> None:
        """Manual optimisation: the module steps itself, so a non-finite returned loss can only stop the run."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.record(loss, batch_idx)

    def should_skip(self) -> bool:
        """``"skip"``: whether this optimizer step must be dropped (one host sync per step)."""
        return self._check(skip=True)

    def check(self) -> bool:
        """``"raise"``: raise a ``FloatingPointError`` naming the first non-finite loss of each process."""
        return self.policy == "raise" and self._check(skip=False)

    def _check(self, skip: bool) -> bool:
        pending, self._pending = self._pending, []
        if not pending and self.world == 1:
            return False
        device = self.accelerator.device
        losses = torch.stack([loss for loss, *_ in pending]) if pending else torch.zeros(0, device=device)
        bad = (~torch.isfinite(losses)).sum()
        if self.world > 1:
            bad = self.accelerator.reduce(bad.to(device), "sum")  # every process decides alike
        if not int(bad.item()):
            return False
        values = losses.tolist()
        first = next(((loss, *where) for loss, (_, *where) in zip(values, pending) if not math.isfinite(loss)), None)
        found = [(0, first)] if self.world == 1 else list(enumerate(gather_object([first])))
        details = "; ".join(f"rank {rank}: {loss} at optimizer step {step} (epoch {epoch}, batch {batch})"
                            for rank, item in found if item is not None for loss, step, epoch, batch in [item])
        message = f"Non-finite loss: {details}."
        if not skip:
            raise FloatingPointError(f"{message} Training stopped on every process. Find the operation with "
                                     "Trainer(detect_anomaly=True), lower the learning rate or set gradient_clip_val; "
                                     "Trainer(on_nonfinite_loss='skip') skips such steps instead.")
        if self.accelerator.is_main_process:
            warnings.warn(f"{message} Skipping this optimizer step (on_nonfinite_loss='skip').", UserWarning,
                          stacklevel=4)
        return True
