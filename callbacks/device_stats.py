"""`DeviceStatsMonitor`: Lightning's callback that logs the device's statistics around every batch.

On a CUDA device: ``torch.cuda.memory_stats`` (the caching allocator's counters, in bytes); on the CPU, or
everywhere with ``cpu_stats=True``: ``psutil``'s ``cpu_percent``, ``cpu_vm_percent`` and ``cpu_swap_percent``.
Each value goes to every logger as ``DeviceStatsMonitor.<hook>/<name>`` (the logger's ``group_separator``), at the
batch start and end of training, validation and test, on the steps the trainer logs (``log_every_n_steps``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView

CPU_VM_PERCENT, CPU_PERCENT, CPU_SWAP_PERCENT = "cpu_vm_percent", "cpu_percent", "cpu_swap_percent"


def psutil_available() -> bool:
    return importlib.util.find_spec("psutil") is not None


def get_cpu_stats() -> dict[str, float]:
    """The system's CPU and memory use, in percent (Lightning's names), from ``psutil``."""
    if not psutil_available():
        raise ModuleNotFoundError("Fetching CPU device stats requires `psutil` to be installed: pip install psutil.")
    import psutil

    return {CPU_VM_PERCENT: psutil.virtual_memory().percent, CPU_PERCENT: psutil.cpu_percent(),
            CPU_SWAP_PERCENT: psutil.swap_memory().percent}


def get_device_stats(device: torch.device) -> dict[str, Any]:
    """What ``DeviceStatsMonitor`` logs for ``device`` (without ``cpu_stats``): CUDA's allocator counters, the
    CPU's ``psutil`` figures, nothing for other devices."""
    if device.type == "cuda":
        return dict(torch.cuda.memory_stats(device))
    if device.type == "cpu":
        return get_cpu_stats()
    return {}


def prefix_metric_keys(metrics: dict[str, Any], prefix: str, separator: str) -> dict[str, Any]:
    """``{prefix + separator + name: value}``.

    Example:
        >>> prefix_metric_keys({"cpu_percent": 3.0}, "DeviceStatsMonitor.on_train_batch_end", "/")
        {'DeviceStatsMonitor.on_train_batch_end/cpu_percent': 3.0}
    """
    return {f"{prefix}{separator}{name}": value for name, value in metrics.items()}


class DeviceStatsMonitor(Callback):
    """Log the device's statistics at the start and end of every training, validation and test batch.

    Args:
        cpu_stats: ``None``: the CPU's figures when training on the CPU; ``True``: also on an accelerator;
            ``False``: never (on the CPU nothing is logged then).

    Needs a logger (``Trainer(logger=False)`` is refused when fit is set up) and, for the CPU's figures,
    ``psutil``.

    Example:
        >>> DeviceStatsMonitor(cpu_stats=True).state_key
        'DeviceStatsMonitor'
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        if cpu_stats not in (None, True, False):
            raise ValueError(f"DeviceStatsMonitor(cpu_stats=...) takes None, True or False. Received: {cpu_stats!r}.")
        self._cpu_stats = cpu_stats
        self._step_before_batch: int | None = None

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        # The step logged: Lightning's count of optimizer steps *before* the current training batch (it grows
        # after the batch's end hooks and after a validation run inside that batch); outside fit, the trainer's.
        self._step_before_batch = None
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationException("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`. "
                                            "Give the Trainer a logger (e.g. logger=CSVLogger('logs')), or remove "
                                            "the callback.")
        if self._cpu_stats is None and trainer.accelerator.device.type == "cpu" and not psutil_available():
            raise ModuleNotFoundError("`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed: pip "
                                      "install psutil, or pass DeviceStatsMonitor(cpu_stats=False).")

    def _log_device_stats(self, trainer: TrainerView, hook: str, due: int) -> None:
        """Log the stats under ``hook`` when ``due`` (the batch's 1-based count) falls on ``log_every_n_steps``."""
        every = trainer.log_every_n_steps
        if not every or not (due % every == 0 or trainer.should_stop):
            return
        device = trainer.accelerator.device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = get_device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(get_cpu_stats())
        step = self._step_before_batch
        for logger in trainer.loggers:
            separator = getattr(logger, "group_separator", "/")
            logger.log_metrics(prefix_metric_keys(stats, f"{type(self).__qualname__}.{hook}", separator),
                               step=trainer.global_step if step is None else step)

    def on_train_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any,
                             batch_idx: int) -> None:
        self._step_before_batch = trainer.global_step
        self._log_device_stats(trainer, "on_train_batch_start", trainer.global_step + 1)

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = self._step_before_batch
        self._log_device_stats(trainer, "on_train_batch_end", (trainer.global_step if step is None else step) + 1)

    def on_validation_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log_device_stats(trainer, "on_validation_batch_start", batch_idx + 1)

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log_device_stats(trainer, "on_validation_batch_end", batch_idx + 1)

    def on_test_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._log_device_stats(trainer, "on_test_batch_start", batch_idx + 1)

    def on_test_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log_device_stats(trainer, "on_test_batch_end", batch_idx + 1)
