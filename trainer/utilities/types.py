"""Type aliases with Lightning's names (``lightning.pytorch.utilities.types``), for annotations in ported code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainer.optim import SchedulerConfig

STEP_OUTPUT = Tensor | Mapping[str, Any] | None
"""What a ``*_step`` returns: the loss, a dict with a ``"loss"`` key, or ``None``."""
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerPLType = LRSchedulerTypeUnion
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerConfig = SchedulerConfig


class LRSchedulerConfigType(TypedDict, total=False):
    """The ``"lr_scheduler"`` dict of ``configure_optimizers``."""

    scheduler: LRSchedulerTypeUnion
    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerLRSchedulerConfig(TypedDict, total=False):
    """The dict form of ``configure_optimizers``' return value."""

    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: str


OptimizerLRScheduler = (Optimizer | Sequence[Optimizer]
                        | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfig]]
                        | OptimizerLRSchedulerConfig | Sequence[OptimizerLRSchedulerConfig] | None)
"""Every form ``configure_optimizers`` may return."""

__all__ = [
    "EVAL_DATALOADERS",
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
    "LRSchedulerConfig",
    "LRSchedulerConfigType",
    "LRSchedulerPLType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
]
