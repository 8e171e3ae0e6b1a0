"""`ThroughputMonitor`: training samples per second, and tokens per second when the module reports tokens.

Built Lightning's way (``ThroughputMonitor(batch_size_fn, length_fn=None, window_size=..., separator=...)``) it
logs Lightning's per-stage metrics instead (``callbacks.throughput_stages``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView
from callbacks.throughput_stages import StageThroughput
from engine.throughput import Throughput, get_available_flops

# Lightning's keyword arguments, passed on to its ``Throughput`` (``available_flops`` and ``world_size`` override
# what the trainer tells: the device's known peak and the number of processes).
_LIGHTNING_OPTIONS = ("window_size", "separator", "available_flops", "world_size")


class ThroughputMonitor(Callback):
    """Log ``throughput/samples_per_sec`` (and ``throughput/tokens_per_sec``) over windows of optimizer steps.

    Samples are counted over every process (``trainer.state.samples_seen``). Tokens are what ``training_step``
    reports as ``"tokens"`` in its output dict (an int or a tensor, this process's count), summed over the
    processes once per window. Time spent validating inside a window is not counted. The last values are kept in
    ``self.last``.

    Lightning's form, ``ThroughputMonitor(batch_size_fn, length_fn=None, **kwargs)``, logs Lightning's metrics
    instead: ``<stage>/time``, ``<stage>/batches``, ``<stage>/samples`` (``<stage>/lengths``) and, once
    ``window_size`` batches were measured, ``<stage>/device/batches_per_sec``, ``<stage>/device/samples_per_sec``
    (items, FLOPs and ``mfu`` when known) for ``train``, ``validate``, ``test`` and ``predict``, on Lightning's
    schedule (``callbacks.throughput_stages`` says exactly when).

    Args:
        window: optimizer steps per measurement (default: ``trainer.log_every_n_steps``); Ember's form only.
        batch_size_fn: Lightning's form: the number of samples of a batch (``lambda batch: batch[0].size(0)``).
        length_fn: Lightning's form: the number of items (tokens) of a batch.
        **kwargs: Lightning's form: ``window_size`` (default 100, at least 2), ``separator`` (default ``"/"``),
            ``available_flops`` (peak FLOP/s of one device, for ``mfu``), ``world_size``.

    Example:
        >>> ThroughputMonitor(window=20).window
        20
        >>> ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), window_size=50).kwargs
        {'window_size': 50}
    """

    def __init__(self, batch_size_fn: Callable[[Any], int] | None = None,
                 length_fn: Callable[[Any], int] | None = None, *, window: int | None = None, **kwargs: Any) -> None:
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"ThroughputMonitor(window=...) must be an int >= 1 or None. Received: {window!r}.")
        self._stages = _lightning_form(batch_size_fn, length_fn, window, kwargs)
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.kwargs = kwargs
        self.window = window
        self.last: dict[str, float] = {}
        self._start = 0.0
        self._paused = 0.0
        self._samples = 0
        self._tokens: Any = 0
        self._last_step = 0
        self._validation_started = 0.0

    @property
    def available_flops(self) -> float | None:
        """Peak FLOP/s of one device used for ``mfu`` (Lightning's form; set when a run is set up)."""
        return None if self._stages is None else self._stages.available_flops

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        if self._stages is not None:
            # Looked up in this module when called: code that patches Lightning's
            # `throughput_monitor.get_available_flops` (Lightning's own tests do) patches this name.
            self._stages.setup(trainer, pl_module, stage,
                               lambda device, dtype: get_available_flops(device, dtype))

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._stages is not None:
            if trainer.is_global_zero:
                self._stages.start(trainer, "train")
            return
        self._reset(trainer)
        self._validation_started = 0.0  # the sanity check ran before training started

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._stages is not None:
            if trainer.is_global_zero:
                self.last = self._stages.train_batch_end(trainer, pl_module, batch) or self.last
            return
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
        if self._stages is not None:
            if trainer.is_global_zero and not trainer.sanity_checking:
                self._stages.start(trainer, "validate")
            return
        self._validation_started = time.perf_counter()

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._stages is not None and trainer.is_global_zero and not trainer.sanity_checking:
            self.last = self._stages.eval_batch_end(trainer, pl_module, "validate", batch) or self.last

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._stages is not None:
            if trainer.is_global_zero and not trainer.sanity_checking and self._stages.entry == "fit":
                self._stages.pause_training()
            return
        if self._validation_started:
            self._paused += time.perf_counter() - self._validation_started
            self._validation_started = 0.0

    def on_test_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._stages is not None and trainer.is_global_zero:
            self._stages.start(trainer, "test")

    def on_test_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._stages is not None and trainer.is_global_zero:
            self.last = self._stages.eval_batch_end(trainer, pl_module, "test", batch) or self.last

    def on_predict_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._stages is not None and trainer.is_global_zero:
            self._stages.start(trainer, "predict")

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._stages is not None and trainer.is_global_zero:
            self.last = self._stages.eval_batch_end(trainer, pl_module, "predict", batch) or self.last

    def _reset(self, trainer: TrainerView) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0
        self._samples = trainer.state.samples_seen
        self._tokens = 0
        self._last_step = trainer.global_step


def _lightning_form(batch_size_fn: Callable[[Any], int] | None, length_fn: Callable[[Any], int] | None,
                    window: int | None, options: dict[str, Any]) -> StageThroughput | None:
    """Lightning's form's measuring state when its arguments were given (validated here, not mid-run); ``None``
    for Ember's form."""
    unknown = sorted(set(options) - set(_LIGHTNING_OPTIONS))
    if unknown:
        raise TypeError(f"ThroughputMonitor got unexpected keyword arguments {unknown}. Lightning's form takes "
                        f"batch_size_fn, length_fn and {', '.join(_LIGHTNING_OPTIONS)}; Ember's form takes window.")
    if batch_size_fn is None and length_fn is None and not options:
        return None  # Ember's form
    given = [f"{name}=..." for name, value in (("length_fn", length_fn),) if value is not None] + \
        [f"{name}={value!r}" for name, value in options.items()]
    if window is not None:
        raise ValueError(f"ThroughputMonitor(window={window!r}) is Ember's form and cannot be mixed with Lightning's "
                         f"arguments (batch_size_fn, {', '.join(given) or 'length_fn'}). Use ThroughputMonitor("
                         "window=N) for samples/tokens per second, or ThroughputMonitor(batch_size_fn=..., "
                         "window_size=N) for Lightning's per-stage metrics.")
    if not callable(batch_size_fn):
        raise TypeError(f"ThroughputMonitor(batch_size_fn=...) must be a function of a batch returning its number of "
                        f"samples, such as `lambda batch: batch[0].size(0)`. Received: batch_size_fn="
                        f"{batch_size_fn!r}" + (f" (with {', '.join(given)})" if given else "") +
                        (". For Ember's window of optimizer steps pass window=N by keyword."
                         if isinstance(batch_size_fn, int) else "."))
    if length_fn is not None and not callable(length_fn):
        raise TypeError(f"ThroughputMonitor(length_fn=...) must be None or a function of a batch returning its number "
                        f"of items (tokens). Received: length_fn={length_fn!r}.")
    # the window and separator are checked now, by building one (a bad value fails here, not when fit starts)
    try:
        Throughput(**{k: v for k, v in options.items() if k in ("window_size", "separator", "world_size")})
    except ValueError as error:
        raise ValueError(f"ThroughputMonitor: {error}") from None
    flops = options.get("available_flops")
    if flops is not None and (isinstance(flops, bool) or not isinstance(flops, (int, float)) or flops <= 0):
        raise ValueError(f"ThroughputMonitor(available_flops=...) must be the peak FLOP/s of one device (a number "
                         f"> 0, such as 989e12 for an H100 in bf16) or None. Received: available_flops={flops!r}.")
    return StageThroughput(batch_size_fn, length_fn, dict(options))
