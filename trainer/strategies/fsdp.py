"""``FSDPStrategy``: FSDP2 sharding through the engine's ``FullyShardedDataParallelPlugin``, from Lightning's
keywords or the plugin's.

Lightning's ``FSDPStrategy`` is FSDP1 (``FullyShardedDataParallel`` wrappers); Ember's shards with FSDP2
(``fully_shard``). Each Lightning keyword is translated to its FSDP2 meaning where there is one, and refused,
naming what to use, where there is none (``translate``); the plugin's own keywords pass through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from engine import InitProcessGroupKwargs
from trainer.strategies.base import Strategy

# The plugin's keywords (engine.backends.fsdp.FullyShardedDataParallelPlugin), accepted as they are.
_PLUGIN = {"transformer_cls_names_to_wrap", "min_num_params", "reshard_after_forward", "cpu_offload",
           "mixed_precision_policy", "state_dict_type", "sync_module_states", "fsdp_version",
           "activation_checkpointing", "activation_checkpointing_offload"}
_SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # FSDP1's strategy -> FSDP2's reshard_after_forward
_STATE_DICT = {"full": "FULL_STATE_DICT", "sharded": "SHARDED_STATE_DICT"}
# Lightning keywords with no FSDP2 counterpart here, and what to do instead.
_REFUSED = {
    "mixed_precision": "set Trainer(precision='bf16-mixed') (or '16-mixed'): the engine casts the forward pass",
    "device_mesh": "hybrid sharding over a 2-D mesh is not offered by FSDPStrategy; use ModelParallelStrategy "
                   "for a 2-D (data x tensor) mesh",
    "accelerator": "set Trainer(accelerator=...)",
    "parallel_devices": "set Trainer(devices=...)",
    "cluster_environment": "pass the environment as Trainer(plugins=[...])",
    "checkpoint_io": "Ember writes its own atomic, checksummed checkpoints",
    "precision_plugin": "set Trainer(precision=...)",
}


@dataclass
class FSDPStrategy(Strategy):
    """FSDP2 sharding (``torch.distributed.fsdp.fully_shard``) from Lightning's keywords or the plugin's.

    Lightning's ``auto_wrap_policy`` (a set of block classes), ``activation_checkpointing_policy`` (the same set),
    ``sharding_strategy`` (``"FULL_SHARD"`` / ``"SHARD_GRAD_OP"``), ``state_dict_type`` (``"full"`` /
    ``"sharded"``), ``cpu_offload``, ``process_group_backend`` and ``timeout`` are translated; the plugin's
    keywords (``transformer_cls_names_to_wrap``, ``reshard_after_forward``, ...) pass through.

    Example:
        >>> strategy = FSDPStrategy(auto_wrap_policy={torch.nn.TransformerEncoderLayer}, sharding_strategy="SHARD_GRAD_OP")
        >>> strategy.plugin_kwargs
        {'reshard_after_forward': False, 'transformer_cls_names_to_wrap': ['TransformerEncoderLayer']}
        >>> type(strategy.accelerator_kwargs()["fsdp_plugin"]).__name__
        'FullyShardedDataParallelPlugin'
    """

    plugin_kwargs: dict[str, Any] = field(default_factory=dict)
    process_group_kwargs: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = "fsdp"

    def __init__(self, **kwargs: Any) -> None:
        self.plugin_kwargs, self.process_group_kwargs = translate(kwargs)

    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        from engine.backends.fsdp import FullyShardedDataParallelPlugin  # lazy: keeps `import trainer` cheap

        built: dict[str, Any] = {"fsdp_plugin": FullyShardedDataParallelPlugin(**self.plugin_kwargs)}
        if self.process_group_kwargs:
            built["kwargs_handlers"] = [InitProcessGroupKwargs(**self.process_group_kwargs)]
        return built


def translate(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(plugin keywords, process-group keywords)`` for ``FSDPStrategy(**kwargs)``; a keyword without an FSDP2
    meaning raises ``ValueError`` naming what to use instead."""
    plugin: dict[str, Any] = {}
    group: dict[str, Any] = {}
    wrap: list[str] | None = None
    checkpointed: list[str] | None = None
    for name, value in kwargs.items():
        # Names both vocabularies have come first: Lightning's values are told apart from the plugin's.
        if name == "state_dict_type":
            if str(value).upper() not in _STATE_DICT.values() and value not in _STATE_DICT:
                raise ValueError(f"FSDPStrategy(state_dict_type={value!r}): Lightning's values are 'full' and "
                                 "'sharded' (the plugin's: 'FULL_STATE_DICT', 'SHARDED_STATE_DICT').")
            plugin["state_dict_type"] = _STATE_DICT.get(value, value)
        elif name == "cpu_offload":
            plugin["cpu_offload"] = bool(getattr(value, "offload_params", value))  # a bool or FSDP1's CPUOffload
        elif name == "activation_checkpointing" and not isinstance(value, bool):  # Lightning's: block classes
            checkpointed = _class_names(value, name)
        elif name in _PLUGIN:
            plugin[name] = value
        elif name == "auto_wrap_policy":
            wrap = _class_names(value, name)
        elif name == "activation_checkpointing_policy":
            checkpointed = _class_names(value, name)
        elif name == "sharding_strategy":
            plugin["reshard_after_forward"] = _reshard(value)
        elif name == "process_group_backend":
            group["backend"] = value
        elif name == "timeout":
            group["timeout"] = value  # a timedelta or seconds, as InitProcessGroupKwargs takes it
        elif name in _REFUSED:
            raise ValueError(f"FSDPStrategy({name}=...) has no counterpart in Ember's FSDP2 sharding: "
                             f"{_REFUSED[name]}.")
        else:
            raise TypeError(f"FSDPStrategy() got an unexpected keyword argument {name!r}. It takes Lightning's "
                            f"auto_wrap_policy, activation_checkpointing_policy, sharding_strategy, state_dict_type, "
                            f"cpu_offload, process_group_backend, timeout, or the plugin's {sorted(_PLUGIN)}.")
    if wrap is not None:
        if "transformer_cls_names_to_wrap" in plugin:
            raise ValueError("FSDPStrategy got both auto_wrap_policy and transformer_cls_names_to_wrap: pass one.")
        plugin["transformer_cls_names_to_wrap"] = wrap
    if checkpointed is not None:
        units = plugin.get("transformer_cls_names_to_wrap")
        units = [units] if isinstance(units, str) else units
        # FSDP2 here checkpoints exactly the sharding units: the two policies must name the same classes.
        if units is None or sorted(units) != sorted(checkpointed):
            raise ValueError(f"FSDPStrategy(activation_checkpointing_policy={checkpointed}) must name the same block "
                             f"classes as auto_wrap_policy (got {units}): Ember checkpoints each sharding unit. "
                             "Pass the same set to both.")
        plugin["activation_checkpointing"] = True
    return plugin, group


def _class_names(value: Any, keyword: str) -> list[str]:
    """The class names of a set / list of ``nn.Module`` classes (or a ``ModuleWrapPolicy`` built from one)."""
    if isinstance(value, type):
        value = {value}
    classes = getattr(value, "_module_classes", value)  # torch's ModuleWrapPolicy keeps the set it was given
    if isinstance(classes, (set, frozenset, list, tuple)) and classes and all(
            isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
        return sorted(c.__name__ for c in classes)
    kind = "a function" if callable(value) else type(value).__name__
    raise ValueError(f"FSDPStrategy({keyword}=...) takes a set of module classes (e.g. {{Block}}), as Lightning "
                     f"does; got {kind} ({value!r:.80}). FSDP2 shards whole blocks: a custom policy function "
                     "has no counterpart; name the block classes.")


def _reshard(value: Any) -> bool:
    name = getattr(value, "name", value)  # torch's ShardingStrategy enum or its name
    if name in _SHARDING:
        return _SHARDING[name]
    advice = ("use DDPStrategy" if name == "NO_SHARD" else
              "hybrid sharding needs a 2-D mesh, which FSDPStrategy does not offer")
    raise ValueError(f"FSDPStrategy(sharding_strategy={value!r}): FSDP2 here takes 'FULL_SHARD' (reshard after "
                     f"forward) or 'SHARD_GRAD_OP' (keep the gathered parameters until backward); {advice}.")
