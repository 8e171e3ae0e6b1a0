"""Lightning's strategy names and objects, resolved to the engine's DDP / FSDP2 / DeepSpeed / model-parallel
settings.

``Trainer(strategy="ddp")`` and friends are accepted by name; ``DDPStrategy(...)`` / ``FSDPStrategy(...)`` /
``DeepSpeedStrategy(...)`` / ``ModelParallelStrategy(...)`` carry the options. Each becomes what the engine's
``Accelerator`` takes (``kwargs_handlers``, ``fsdp_plugin``, ``deepspeed_plugin``, ``parallelism_config``); the
processes themselves come from the launcher (see ``trainer.compat.launching``).
"""

from __future__ import annotations

from typing import Any

from trainer.strategies.base import Strategy
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.deepspeed import DeepSpeedStrategy
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.model_parallel import ModelParallelStrategy
from trainer.strategies.single_device import SingleDeviceStrategy

# Names that run Ember's DDP. Lightning's spawn / fork / notebook variants start processes differently; Ember
# always starts them through torch's launcher (the script is run again in every process).
_DDP_NAMES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_false",
              "single_device")
# Lightning's registered DeepSpeed names and the DeepSpeedStrategy keywords each stands for.
DEEPSPEED_NAMES: dict[str, dict[str, Any]] = {
    "deepspeed": {}, "deepspeed_stage_1": {"stage": 1}, "deepspeed_stage_2": {"stage": 2},
    "deepspeed_stage_2_offload": {"stage": 2, "offload_optimizer": True}, "deepspeed_stage_3": {"stage": 3},
    "deepspeed_stage_3_offload": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    "deepspeed_stage_3_offload_nvme": {"stage": 3, "offload_optimizer": True, "offload_parameters": True,
                                       "remote_device": "nvme", "offload_params_device": "nvme",
                                       "offload_optimizer_device": "nvme"},
}
STRATEGY_NAMES = (*_DDP_NAMES, "ddp_find_unused_parameters_true", "fsdp", *DEEPSPEED_NAMES)


def resolve_strategy(strategy: Any, world_size: int = 1, num_nodes: int = 1) -> tuple[str, Any, dict[str, Any]]:
    """``(kind, strategy object, Accelerator keywords)`` for a strategy name or object; ``kind`` is ``"ddp"``,
    ``"fsdp"``, ``"deepspeed"`` or ``"model_parallel"`` (a name becomes the object it stands for, as
    ``trainer.strategy`` shows it). ``world_size`` / ``num_nodes``: the processes and machines the run will have
    (a mesh is sized by them)."""
    if isinstance(strategy, str):
        name = strategy.lower()
        if name in ("auto", "single_device") and world_size == 1:
            strategy = SingleDeviceStrategy()  # Lightning's object for a one-process run
        elif name in _DDP_NAMES:
            strategy = DDPStrategy()
        elif name == "ddp_find_unused_parameters_true":
            strategy = DDPStrategy(find_unused_parameters=True)
        elif name == "fsdp":
            strategy = FSDPStrategy()
        elif name in DEEPSPEED_NAMES:
            strategy = DeepSpeedStrategy(**DEEPSPEED_NAMES[name])
        else:
            raise ValueError(f"Trainer(strategy={strategy!r}) is not a strategy Ember knows. Use one of "
                             f"{list(STRATEGY_NAMES)}, or trainer.strategies.DDPStrategy(...) / FSDPStrategy(...) / "
                             "DeepSpeedStrategy(...) for options.")
        if name in _DDP_NAMES and name != "ddp_find_unused_parameters_true":
            return "ddp", strategy, {}  # Ember's DDP as it is: no handler to add
    if isinstance(strategy, Strategy):
        return strategy.kind, strategy, strategy.accelerator_kwargs(world_size, num_nodes)
    raise TypeError(f"Trainer(strategy=...) takes a name or a DDPStrategy / FSDPStrategy / DeepSpeedStrategy / "
                    f"ModelParallelStrategy from trainer.strategies. Received: {type(strategy).__name__} "
                    f"({strategy!r:.80}).")


__all__ = ["DEEPSPEED_NAMES", "STRATEGY_NAMES", "DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy",
           "ModelParallelStrategy", "SingleDeviceStrategy", "Strategy", "resolve_strategy"]
