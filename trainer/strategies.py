"""Lightning's strategy names and objects, resolved to the engine's DDP / FSDP2 settings.

``Trainer(strategy="ddp")`` and friends are accepted by name; ``DDPStrategy(...)`` / ``FSDPStrategy(...)``
carry the options. Each becomes what the engine's ``Accelerator`` takes (``kwargs_handlers``,
``fsdp_plugin``); the processes themselves come from the launcher (see ``trainer.compat.launching``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from engine import DistributedDataParallelKwargs, InitProcessGroupKwargs

# Names that run Ember's DDP. Lightning's spawn / fork / notebook variants start processes differently; Ember
# always starts them through torch's launcher (the script is run again in every process).
_DDP_NAMES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_false",
              "single_device")
STRATEGY_NAMES = (*_DDP_NAMES, "ddp_find_unused_parameters_true", "fsdp")


@dataclass
class DDPStrategy:
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

    def accelerator_kwargs(self) -> dict[str, Any]:
        handlers: list[Any] = [DistributedDataParallelKwargs(
            find_unused_parameters=self.find_unused_parameters, static_graph=self.static_graph,
            gradient_as_bucket_view=self.gradient_as_bucket_view, bucket_cap_mb=self.bucket_cap_mb,
            broadcast_buffers=self.broadcast_buffers)]
        if self.process_group_backend is not None or self.timeout is not None:
            handlers.append(InitProcessGroupKwargs(backend=self.process_group_backend, timeout=self.timeout))
        return {"kwargs_handlers": handlers}


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
        from engine.fsdp import FullyShardedDataParallelPlugin  # lazy: keeps `import trainer` cheap

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(**self.plugin_kwargs)}


def resolve_strategy(strategy: Any) -> tuple[str, dict[str, Any]]:
    """``(kind, Accelerator keywords)`` for a strategy name or object; ``kind`` is ``"ddp"`` or ``"fsdp"``."""
    if isinstance(strategy, DDPStrategy):
        return "ddp", strategy.accelerator_kwargs()
    if isinstance(strategy, FSDPStrategy):
        return "fsdp", strategy.accelerator_kwargs()
    if isinstance(strategy, str):
        name = strategy.lower()
        if name in _DDP_NAMES:
            return "ddp", {}
        if name == "ddp_find_unused_parameters_true":
            return "ddp", DDPStrategy(find_unused_parameters=True).accelerator_kwargs()
        if name == "fsdp":
            return "fsdp", FSDPStrategy().accelerator_kwargs()
        hint = (" DeepSpeed is not supported: use strategy='fsdp' (FSDP2) to shard a large model."
                if "deepspeed" in name else "")
        raise ValueError(f"Trainer(strategy={strategy!r}) is not a strategy Ember knows. Use one of "
                         f"{list(STRATEGY_NAMES)}, or trainer.strategies.DDPStrategy(...) / FSDPStrategy(...) for "
                         f"options.{hint}")
    raise TypeError(f"Trainer(strategy=...) takes a name or a DDPStrategy / FSDPStrategy from trainer.strategies. "
                    f"Received: {type(strategy).__name__} ({strategy!r:.80}).")
