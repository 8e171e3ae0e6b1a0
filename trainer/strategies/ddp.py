"""``DDPStrategy``: Lightning's DDP options that Ember's DDP honours."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from engine import DistributedDataParallelKwargs, InitProcessGroupKwargs
from trainer.strategies.base import Strategy


@dataclass
class DDPStrategy(Strategy):
    """Lightning's ``DDPStrategy`` options that Ember's DDP honours.

    Example:
        >>> DDPStrategy(find_unused_parameters=True).accelerator_kwargs()["kwargs_handlers"][0].find_unused_parameters
        True
    """

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: int = 25
    broadcast_buffers: bool = True
    process_group_backend: str | None = None
    timeout: timedelta | None = None
    kind: ClassVar[str] = "ddp"

    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        handlers: list[Any] = [DistributedDataParallelKwargs(
            find_unused_parameters=self.find_unused_parameters, static_graph=self.static_graph,
            gradient_as_bucket_view=self.gradient_as_bucket_view, bucket_cap_mb=self.bucket_cap_mb,
            broadcast_buffers=self.broadcast_buffers)]
        if self.process_group_backend is not None or self.timeout is not None:
            handlers.append(InitProcessGroupKwargs(backend=self.process_group_backend, timeout=self.timeout))
        return {"kwargs_handlers": handlers}
