"""``Strategy``: what the Trainer asks of every strategy object, so that it never asks which class it holds.

A strategy is resolved once, from a name or an object (``trainer.strategies.resolve_strategy``), into one of these;
the Trainer then only asks questions: the engine keywords it stands for, its ``kind`` (for the launcher and the
messages), the precisions it refuses, what to set up once the processes exist, and the module's device mesh.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class Strategy(ABC):
    """The questions every strategy answers; subclasses override where they differ."""

    #: ``"ddp"``, ``"fsdp"``, ``"deepspeed"`` or ``"model_parallel"``.
    kind: ClassVar[str]
    #: The module must split itself in ``configure_model`` (Lightning refuses a module without one).
    requires_configure_model: ClassVar[bool] = False

    @abstractmethod
    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        """The ``Accelerator`` keywords this strategy stands for (``world_size`` / ``num_nodes``: the run's)."""

    def check_precision(self, precision: Any) -> None:
        """Raise if the strategy cannot train in ``precision`` (Lightning's refusals); most take every one."""

    def setup(self, accelerator: Any) -> None:
        """Called once the processes exist, before any module is seen; most strategies need nothing then."""

    @property
    def module_mesh(self) -> Any:
        """The module's ``device_mesh`` under this strategy (``None``: the module has none)."""
        return None

    def check_parallelized(self, module: Any) -> None:
        """After ``configure_model``: raise if the module split itself in a way this strategy cannot run."""
