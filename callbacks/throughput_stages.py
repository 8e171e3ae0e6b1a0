"""Lightning's form of ``ThroughputMonitor`` (``batch_size_fn=...``): one ``Throughput`` per running stage.

What it logs and when, as recorded on Lightning 2.6.5 (``lightning.pytorch.callbacks.ThroughputMonitor``):

- keys are ``<stage><separator><Throughput key>`` for the stages ``train``, ``validate``, ``test`` and ``predict``
  (``train/time``, ``train/samples``, ``train/device/samples_per_sec``, ...);
- training: after a batch that ended with an optimizer step, when the optimizer steps taken are a multiple of
  ``log_every_n_steps`` (or training is stopping), at the trainer's step;
- evaluation: after every batch whose number in this run is a multiple of ``log_every_n_steps``, at the step
  "batches this loop has run so far" (so a second ``trainer.validate`` does not log over the first);
- the training clock stops from the last training batch to the last batch of a validation inside ``fit``;
- inside ``fit`` each run starts its counters afresh; separate ``validate`` / ``test`` / ``predict`` calls keep
  counting from the previous call (Lightning's behaviour), with a fresh window each call;
- everything is measured and logged by the global-rank-0 process only, with this device's batch size scaled by
  ``world_size`` for the totals over devices.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from callbacks.protocols import TrainerView
from engine.throughput import Throughput, get_available_flops

# Ember's mixed-precision names -> the dtype the matmuls run in (for the device's peak FLOP/s).
_COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


@dataclass
class _Counts:
    """Running totals of one stage, and where its clock started."""

    batches: int = 0
    samples: int = 0
    lengths: int = 0
    run_batches: int = 0  # batches of the current run (when to log in evaluation)
    started: float = 0.0  # perf_counter() at the start, moved later by the validation pauses (training)
    elapsed: float = 0.0  # seconds at the last update


class StageThroughput:
    """The measuring state of a Lightning-form ``ThroughputMonitor`` (the callback forwards its hooks here)."""

    def __init__(self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None,
                 options: dict[str, Any]) -> None:
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.options = options
        self.available_flops: float | None = options.get("available_flops")
        self.meters: dict[str, Throughput] = {}
        self.counts: dict[str, _Counts] = {}
        self.logged_steps: dict[tuple[str, str], int] = {}  # (entry point, stage) -> batches run, the log step
        self.entry = "fit"
        self.module_has_flops: bool | None = None
        self.steps_seen = 0

    def setup(self, trainer: TrainerView, module: torch.nn.Module, entry: str,
              flops_of: Callable[[torch.device, torch.dtype], int | None] = get_available_flops) -> None:
        """A new ``fit`` / ``validate`` / ``test`` / ``predict`` call: fresh windows for the stages it runs
        (``flops_of``: the peak-FLOP/s lookup, the callback's module's own name for it)."""
        self.entry = entry
        if "available_flops" not in self.options and trainer.is_global_zero:
            self.available_flops = flops_of(trainer.accelerator.device, _compute_dtype(trainer, module))
        world_size = self.options.get("world_size", trainer.world_size)
        window = {k: v for k, v in self.options.items() if k in ("window_size", "separator")}
        stages = ("train", "validate") if entry == "fit" else {"validate": ("validate",), "test": ("test",),
                                                               "predict": ("predict",)}.get(entry, ())
        for stage in stages:
            self.meters[stage] = Throughput(available_flops=self.available_flops, world_size=world_size, **window)

    def start(self, trainer: TrainerView, stage: str) -> None:
        """``stage`` starts running: its clock starts (its counters too, inside ``fit`` or the first time)."""
        if self.entry == "fit" or stage not in self.counts:
            self.meters[stage].reset()
            self.counts[stage] = _Counts()
        counts = self.counts[stage]
        counts.run_batches = 0
        counts.started = time.perf_counter()
        if stage == "train":
            self.steps_seen = trainer.global_step

    def pause_training(self) -> None:
        """A validation inside ``fit`` ended: its time (from the last training batch) is not training time."""
        train, val = self.counts.get("train"), self.counts.get("validate")
        if train is None or val is None:
            return
        # the gap between the last training batch and the validation's start, then the validation itself
        train.started += (val.started - (train.started + train.elapsed)) + val.elapsed

    def train_batch_end(self, trainer: TrainerView, module: torch.nn.Module, batch: Any) -> dict[str, float] | None:
        """Measure a training batch; the metrics when they were logged, else ``None``."""
        self.update(trainer, module, "train", batch)
        stepped, self.steps_seen = trainer.global_step != self.steps_seen, trainer.global_step
        every = trainer.log_every_n_steps
        # Lightning measures whole optimizer steps only: a batch inside an accumulation window logs nothing
        if stepped and every and (trainer.global_step % every == 0 or trainer.should_stop):
            return self.log(trainer, "train", None)
        return None

    def eval_batch_end(self, trainer: TrainerView, module: torch.nn.Module, stage: str,
                       batch: Any) -> dict[str, float] | None:
        """Measure an evaluation batch; the metrics when they were logged, else ``None``."""
        self.update(trainer, module, stage, batch)
        key = (self.entry, stage)
        self.logged_steps[key] = step = self.logged_steps.get(key, 0) + 1
        every = trainer.log_every_n_steps
        if every and (self.counts[stage].run_batches % every == 0 or trainer.should_stop):
            return self.log(trainer, stage, step)
        return None

    def update(self, trainer: TrainerView, module: torch.nn.Module, stage: str, batch: Any) -> None:
        if trainer.accelerator.device.type == "cuda":
            torch.cuda.synchronize()  # time what the device did, not what was queued
        counts = self.counts[stage]
        counts.elapsed = time.perf_counter() - counts.started
        with torch.inference_mode():  # the user's functions may compute on tensors that require grad
            if self.length_fn is not None:
                counts.lengths += self.length_fn(batch)
            counts.samples += self.batch_size_fn(batch)
        counts.batches += 1
        counts.run_batches += 1
        self.meters[stage].update(time=counts.elapsed, batches=counts.batches, samples=counts.samples,
                                  lengths=None if self.length_fn is None else counts.lengths,
                                  flops=self._flops_per_batch(module))

    def log(self, trainer: TrainerView, stage: str, step: int | None) -> dict[str, float]:
        meter = self.meters[stage]
        metrics = {f"{stage}{meter.separator}{k}": v for k, v in meter.compute().items()}
        trainer.log_metrics(metrics, step=step)  # a no-op in predict: Ember runs no trackers there
        return metrics

    def _flops_per_batch(self, module: torch.nn.Module) -> float | None:
        if self.module_has_flops is None:  # asked once per monitor: the warning is given once
            self.module_has_flops = hasattr(module, "flops_per_batch")
            if not self.module_has_flops:
                warnings.warn("When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute "
                              f"or property in {type(module).__name__} to compute the FLOPs.", UserWarning,
                              stacklevel=2)
        # read at every batch: the module may change it (a new sequence length, a new batch size)
        # getattr: a user attribute, typed Any (nn.Module's own typing would say Tensor | Module)
        return getattr(module, "flops_per_batch") if self.module_has_flops else None  # noqa: B009


def _compute_dtype(trainer: TrainerView, module: torch.nn.Module) -> torch.dtype:
    """The dtype the module's matmuls run in: the mixed-precision one, else its parameters' (``bf16-true``)."""
    mixed = _COMPUTE_DTYPES.get(trainer.accelerator.mixed_precision)
    if mixed is not None:
        return mixed
    parameter = next(module.parameters(), None)
    return torch.float32 if parameter is None or not parameter.is_floating_point() else parameter.dtype
