"""What callbacks see of the trainer: ``TrainerView``, a ``typing.Protocol`` listing exactly the names they use.

Callbacks never import ``trainer`` (not even for type checking), so ``callbacks/`` sits below ``trainer/`` in the
import graph; ``trainer.Trainer`` satisfies this protocol structurally. A callback written for a Lightning
``Trainer`` reads the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from engine import Accelerator


class StateView(Protocol):
    """The counters callbacks read from ``trainer.state`` (``trainer.TrainState``)."""

    stage: str
    epoch: int
    batch_in_epoch: int
    global_step: int
    micro_step: int
    samples_seen: int

    @property
    def fn(self) -> str | None: ...  # the entry point running or last run: "fit", "validate", ... (a str enum)


class SchedulerControl(Protocol):
    """The run's scheduler stepping as callbacks use it (``trainer.loop.schedulers.SchedulerStepper``)."""

    def pause(self) -> None: ...  # the learning-rate finder owns the learning rate while it sweeps


class TrainerView(Protocol):
    """The trainer as callbacks use it (see ``trainer.Trainer`` for what each name means)."""

    accelerator: Accelerator
    state: StateView
    accumulate_grad_batches: int  # GradientAccumulationScheduler sets it at epoch starts
    should_stop: bool  # set True on any process: every process stops at the same step

    @property
    def current_epoch(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def max_epochs(self) -> int | None: ...
    @property
    def max_steps(self) -> int | None: ...
    @property
    def fast_dev_run(self) -> int: ...
    @property
    def log_every_n_steps(self) -> int: ...
    @property
    def val_check_interval(self) -> int | float: ...
    @property
    def check_val_every_n_epoch(self) -> int | None: ...
    @property
    def is_global_zero(self) -> bool: ...
    @property
    def global_rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def sanity_checking(self) -> bool: ...
    @property
    def callback_metrics(self) -> dict[str, Any]: ...
    @property
    def progress_bar_metrics(self) -> dict[str, float]: ...
    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...
    @property
    def lr_scheduler_configs(self) -> list[Any]: ...
    @property
    def train_dataloader(self) -> Any: ...
    @property
    def val_dataloaders(self) -> Any: ...  # as Lightning: one loader, a list of several, or None
    @property
    def predict_dataloaders(self) -> Any: ...
    @property
    def num_training_batches(self) -> int | None: ...
    @property
    def num_val_batches(self) -> list[int | None]: ...
    @property
    def num_sanity_val_batches(self) -> list[int | None]: ...
    @property
    def num_test_batches(self) -> list[int | None]: ...
    @property
    def num_predict_batches(self) -> list[int | None]: ...
    @property
    def default_checkpoint_dir(self) -> str: ...
    @property
    def default_root_dir(self) -> str: ...
    @property
    def loggers(self) -> list[Any]: ...
    @property
    def callbacks(self) -> list[Any]: ...  # the run's callbacks, in the order their hooks are called
    @property
    def schedulers(self) -> SchedulerControl: ...

    def log_metrics(self, values: dict[str, Any], step: int | None = None) -> None: ...
    def save_checkpoint(self, filepath: Any, weights_only: bool = False, storage_options: Any = None, *,
                        async_save: bool = False) -> None: ...
    def run_at_boundary(self, fn: Callable[[], Any]) -> None: ...
    def lr_find(self, module: torch.nn.Module, **options: Any) -> Any: ...
    def scale_batch_size(self, module: Any, method: str, **options: Any) -> int | None: ...
