"""``FSDPStrategy``: FSDP2 sharding through the engine's ``FullyShardedDataParallelPlugin``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FSDPStrategy:
    """FSDP2 sharding (``torch.distributed.fsdp.fully_shard``); keywords go to ``FullyShardedDataParallelPlugin``.

    Example:
        >>> type(FSDPStrategy().accelerator_kwargs()["fsdp_plugin"]).__name__
        'FullyShardedDataParallelPlugin'
    """

    plugin_kwargs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, **plugin_kwargs: Any) -> None:
        self.plugin_kwargs = plugin_kwargs

    def accelerator_kwargs(self) -> dict[str, Any]:
        from engine.backends.fsdp import FullyShardedDataParallelPlugin  # lazy: keeps `import trainer` cheap

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(**self.plugin_kwargs)}
