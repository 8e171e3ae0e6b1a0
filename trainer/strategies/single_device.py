"""``SingleDeviceStrategy``: Lightning's strategy object for a run on one device (one process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from trainer.strategies.base import Strategy


@dataclass
class SingleDeviceStrategy(Strategy):
    """One process on one device: what ``trainer.strategy`` is for a one-process run with ``strategy="auto"``
    (as in Lightning), and what ``Trainer(strategy=SingleDeviceStrategy())`` asks for. The engine's one-process
    path runs it; the device itself comes from ``Trainer(accelerator=...)``.

    Args:
        device: the device Lightning's signature names (``"cpu"``, ``"cuda:0"``...); the Trainer's
            ``accelerator=`` / ``devices=`` choose it here, so a different one is refused when the run starts.

    Example:
        >>> SingleDeviceStrategy().accelerator_kwargs(world_size=1)
        {}
    """

    device: Any = "cpu"
    accelerator: Any = None
    checkpoint_io: Any = None
    precision_plugin: Any = None
    kind: ClassVar[str] = "ddp"  # the engine's DDP path, which is a plain one-process run with one process

    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        if world_size > 1:
            raise ValueError(f"SingleDeviceStrategy runs one process, but the run has {world_size}: use "
                             "strategy='ddp' (or DDPStrategy(...)) for several processes.")
        return {}
