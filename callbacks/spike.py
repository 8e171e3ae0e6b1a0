"""`SpikeDetection`: stop training with `TrainingSpikeException` when the loss jumps away from its running mean.

Lightning's callback of that name (``lightning.pytorch.callbacks.spike``), with its arguments and its
decisions, as recorded on Lightning 2.6.6: a batch's loss is a spike when it moved the wrong way since the last
tracked loss (up for ``mode="min"``) and differs from the running mean of the last ``window`` tracked losses by at
least ``atol`` and at least ``rtol`` times that mean; with ``finite_only=True`` (the default) a non-finite loss is
a spike too. Every process decides on its own loss; a spike on any process stops all of them. The batch and the one
before it are written to ``exclude_batches_path`` (a JSON list, by the main process) so a restarted run can skip
them, then ``TrainingSpikeException`` is raised.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Any, Literal

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView


class TrainingSpikeException(RuntimeError):
    """Raised by ``SpikeDetection`` at a loss spike (Lightning's ``lightning.fabric.utilities.spike`` name)."""

    def __init__(self, batch_idx: int, *args: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args)
        self.batch_idx = batch_idx


class SpikeDetection(Callback):
    """Raise ``TrainingSpikeException`` at a training loss spike; record the batches to skip on a restart.

    Args:
        mode: ``"min"`` (a loss rising is suspect) or ``"max"``.
        window: how many of the last tracked losses the running mean averages.
        warmup: batches of each epoch (by index) before spikes are looked for.
        atol / rtol: a spike differs from the running mean by at least ``atol`` and by at least ``rtol`` times the
            mean (``None``: that test passes always).
        exclude_batches_path: the JSON file (or a folder for ``skip_batches.json``) of batch indices to skip;
            default ``{trainer.default_root_dir}/skip_batches.json``.
        finite_only: a non-finite loss is a spike (default); ``False``: it is judged like any value, and is not
            tracked in the running mean.

    Example:
        >>> SpikeDetection(window=5, rtol=1.5).window
        5
    """

    def __init__(self, mode: Literal["min", "max"] = "min", window: int = 10, warmup: int = 1,
                 atol: float | None = None, rtol: float | None = 2.0,
                 exclude_batches_path: str | os.PathLike[str] | None = None, finite_only: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"SpikeDetection(mode=...) must be 'min' or 'max'. Received: {mode!r}.")
        for name, value, least in (("window", window, 1), ("warmup", warmup, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"SpikeDetection({name}=...) must be an int >= {least}. Received: {value!r}.")
        for name, tolerance in (("atol", atol), ("rtol", rtol)):
            if tolerance is not None and (not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool)):
                raise ValueError(f"SpikeDetection({name}=...) must be a number or None. Received: {tolerance!r}.")
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = None if exclude_batches_path is None else os.fspath(exclude_batches_path)
        self.finite_only = finite_only
        self.last_val: float = 0.0  # the last tracked loss
        self.bad_batches: list[int] = []
        self._tracked: collections.deque[float] = collections.deque(maxlen=window)

    @property
    def running_mean(self) -> float:
        """The mean of the last ``window`` tracked losses (0.0 before the first)."""
        return sum(self._tracked) / len(self._tracked) if self._tracked else 0.0

    @torch.no_grad()
    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = _loss_of(outputs)
        value = float(loss)  # one device sync per batch: the decision needs the value on the host
        if self.exclude_batches_path is None:
            self.exclude_batches_path = os.path.join(trainer.default_root_dir, "skip_batches.json")
        if not self.exclude_batches_path.endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")
        spike = batch_idx >= self.warmup and self._is_spike(value)
        if _any_process(trainer, spike):
            self._handle_spike(trainer, batch_idx)
        if self.finite_only or not _any_process(trainer, not math.isfinite(value)):
            self._tracked.append(value)
            self.last_val = value

    def _is_spike(self, value: float) -> bool:
        if self.finite_only and not math.isfinite(value):
            return True
        change = value - self.last_val
        if (change <= 0.0) if self.mode == "min" else (change >= 0.0):
            return False  # moved the good way since the last tracked loss
        distance = abs(value - self.running_mean)
        far_absolute = self.atol is None or distance >= abs(self.atol)
        far_relative = self.rtol is None or distance >= abs(self.rtol * self.running_mean)
        return far_absolute and far_relative

    def _handle_spike(self, trainer: TrainerView, batch_idx: int) -> None:
        # The batch before is skipped too: it may have moved the weights to where this batch's loss explodes.
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        path = self.exclude_batches_path
        assert path is not None
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def state_dict(self) -> dict[str, Any]:
        return {"last_val": self.last_val, "mode": self.mode, "warmup": self.warmup, "atol": self.atol,
                "rtol": self.rtol, "bad_batches": list(self.bad_batches), "bad_batches_path": self.exclude_batches_path,
                "tracked": list(self._tracked)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = state_dict["last_val"]
        self.mode, self.warmup = state_dict["mode"], state_dict["warmup"]
        self.atol, self.rtol = state_dict["atol"], state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self._tracked = collections.deque(state_dict.get("tracked", []), maxlen=self.window)


def _loss_of(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    if isinstance(outputs, dict) and "loss" in outputs:
        return outputs["loss"].detach()
    raise TypeError(f"SpikeDetection needs training_step to return the loss (a tensor, or a dict with 'loss'). "
                    f"Received: {type(outputs).__qualname__}.")


def _any_process(trainer: TrainerView, flag: bool) -> bool:
    """Whether ``flag`` holds on any process (one all-reduce with several processes)."""
    if trainer.world_size == 1:
        return flag
    accelerator = trainer.accelerator
    total = accelerator.reduce(torch.tensor(float(flag), device=accelerator.device), "sum")
    return bool(total > 0)
