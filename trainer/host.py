"""``ModuleHost``: the contract between a ``TrainModule`` and the trainer running it, as a ``typing.Protocol``.

A module reaches its trainer only through these names (``self.log`` through ``log_value``, ``self.optimizers()``
through ``module_optimizers``, ``manual_backward`` through ``backward``...), so ``trainer/module.py`` never
imports the ``Trainer``: ``trainer.Trainer`` satisfies the protocol structurally. The protocol has no catch-all:
the module's own code asks only what is listed here. User code reads ``self.trainer.<anything>`` as in Lightning
(``TrainModule.trainer`` is typed ``Any`` for that: the whole ``Trainer``, which ``trainer/module.py`` cannot name
without an import circle).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engine import Accelerator
from trainer.config import TrainerConfig
from trainer.metrics.logger import LogOptions


class ModuleHost(Protocol):
    """What a ``TrainModule`` asks of the trainer it is attached to."""

    accelerator: Accelerator  # gather, reduce, print, clipping...
    strategy: Any  # Lightning's strategy object: manual_backward goes through its backward, as in Lightning

    @property
    def global_rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def current_epoch(self) -> int: ...
    @property
    def logger(self) -> Any: ...
    @property
    def loggers(self) -> list[Any]: ...
    @property
    def lr_scheduler_configs(self) -> list[Any]: ...
    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...
    @property
    def config(self) -> TrainerConfig: ...  # the run's settings (clipping: TrainModule.clip_gradients)

    def log_value(self, name: str, value: Any, options: LogOptions) -> None:
        """Record one ``self.log`` value."""

    def module_optimizers(self) -> list[torch.optim.Optimizer]:
        """What ``module.optimizers()`` returns (wrapped for manual optimisation)."""

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``manual_backward``: the hooks around the module's ``backward``."""

    def engine_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The engine's backward of ``loss`` (``TrainModule.backward``'s default)."""

