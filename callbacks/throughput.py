"""`ThroughputMonitor`: training samples per second, and tokens per second when the module reports tokens."""

from __future__ import annotations

import time
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView


class ThroughputMonitor(Callback):
    """Log ``throughput/samples_per_sec`` (and ``throughput/tokens_per_sec``) over windows of optimizer steps.

    Samples are counted over every process (``trainer.state.samples_seen``). Tokens are what ``training_step``
    reports as ``"tokens"`` in its output dict (an int or a tensor, this process's count), summed over the
    processes once per window. Time spent validating inside a window is not counted. The last values are kept in
    ``self.last``.

    Args:
        window: optimizer steps per measurement (default: ``trainer.log_every_n_steps``).

    Example:
        >>> ThroughputMonitor(window=20).window
        20
    """

    def __init__(self, window: int | None = None) -> None:
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"ThroughputMonitor(window=...) must be an int >= 1 or None. Received: {window!r}.")
        self.window = window
        self.last: dict[str, float] = {}
        self._start = 0.0
        self._paused = 0.0
        self._samples = 0
        self._tokens: Any = 0
        self._last_step = 0
        self._validation_started = 0.0

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._reset(trainer)
        self._validation_started = 0.0  # the sanity check ran before training started

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if isinstance(outputs, dict) and "tokens" in outputs:
            self._tokens = self._tokens + outputs["tokens"]  # stays a tensor: no device sync per step
        window = self.window or trainer.log_every_n_steps
        if trainer.global_step - self._last_step < window:
            return
        if trainer.accelerator.device.type == "cuda":
            torch.cuda.synchronize()  # time what the device did, not what was queued
        seconds = time.perf_counter() - self._start - self._paused
        values = {"throughput/samples_per_sec": (trainer.state.samples_seen - self._samples) / seconds}
        if not (isinstance(self._tokens, int) and self._tokens == 0):
            tokens = torch.as_tensor(self._tokens, dtype=torch.float64, device=trainer.accelerator.device)
            total = trainer.accelerator.reduce(tokens, "sum") if trainer.world_size > 1 else tokens
            values["throughput/tokens_per_sec"] = float(total) / seconds
        self.last = values
        trainer.log_metrics(values)
        self._reset(trainer)

    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._validation_started = time.perf_counter()

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._validation_started:
            self._paused += time.perf_counter() - self._validation_started
            self._validation_started = 0.0

    def _reset(self, trainer: TrainerView) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0
        self._samples = trainer.state.samples_seen
        self._tokens = 0
        self._last_step = trainer.global_step
