"""The device mesh a backend runs on: ``resolve_parallelism``, what a new Accelerator makes of a
``ParallelismConfig`` before its state exists, and ``mesh_rank``, each process's rank along the mesh's
dimensions (what ``Backend.mesh_rank`` answers for ``accelerator.tensor_parallel_rank`` and the like)."""

from __future__ import annotations

from typing import Any

from engine.backends.parallelism_config import ParallelismConfig
from engine.environment import EngineEnvironment


def resolve_parallelism(config: Any, environment: EngineEnvironment, fsdp_plugin: Any,
                        deepspeed_plugin: Any) -> tuple[ParallelismConfig | None, Any]:
    """The config a new Accelerator runs with (the one given, or one from ``PARALLELISM_CONFIG_*`` when
    ``ACCELERATE_USE_PARALLELISM_CONFIG=true``) and its FSDP plugin (a default one when the config shards over
    ``dp_shard`` without one). What Ember cannot run is refused here, naming what to change."""
    if config is None and environment.use_parallelism_config:
        config = ParallelismConfig()
    if config is None:
        return None, fsdp_plugin
    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"Accelerator(parallelism_config=...) takes an engine.ParallelismConfig. Received: "
                        f"{type(config).__name__}.")
    if config.cp_enabled:
        raise ValueError(f"ParallelismConfig(cp_size={config.cp_size}): context parallelism is not available in "
                         "Ember: torch's context_parallel shards attention on CUDA only (none on the CPU with torch "
                         "2.13), and Ember has not been tested on a GPU with it. Set cp_size=1; for long sequences "
                         "use tensor parallelism with a sequence-parallel plan ('sequence_parallel' norms).")
    if config.sp_enabled:
        raise ValueError(f"ParallelismConfig(sp_size={config.sp_size}): DeepSpeed-Ulysses sequence parallelism is "
                         "not available in Ember. Set sp_size=1; tensor parallelism with 'sequence_parallel' "
                         "entries in the model's tp_plan shards activations along the sequence instead.")
    if deepspeed_plugin is not None and config.total_size > 1:
        raise ValueError(f"Accelerator(deepspeed_plugin=..., parallelism_config={config.active_mesh_dims}) asks "
                         "for two ways to split the model: DeepSpeed ZeRO shards over every process itself. Use "
                         "one of them.")
    if config.dp_shard_enabled and fsdp_plugin is None:
        fsdp_plugin = default_fsdp_plugin()  # dp_shard is FSDP2: its defaults (the root as one unit)
    return config, fsdp_plugin


def default_fsdp_plugin() -> Any:
    """A ``FullyShardedDataParallelPlugin`` with its defaults (imported only when asked for: FSDP2's imports
    cost about a second)."""
    from engine.backends.fsdp import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin()


# The dimensions a rank is asked along: the config's flag that the dimension is split, and its name in errors.
_DIMENSIONS = {"tp": ("tp_enabled", "Tensor parallelism"),
               "dp_replicate": ("dp_replicate_enabled", "Data parallelism"),
               "dp_shard": ("dp_shard_enabled", "Shard-based data parallelism")}
_UNSUPPORTED = {"cp": "Context parallelism is not supported in Ember (nor in Accelerate): there is no "
                      "context-parallel rank. See ParallelismConfig(cp_size=...).",
                "pp": "Pipeline parallelism is not supported in Ember (nor in Accelerate): there is no "
                      "pipeline-parallel rank."}


def mesh_rank(config: ParallelismConfig | None, mesh: Any, dimension: str) -> int:
    """This process's place along ``dimension`` (``"tp"``, ``"dp_replicate"``, ``"dp_shard"``) of ``mesh``, the
    ``DeviceMesh`` of ``config``: 0 where that dimension is not split; an error without a config, and for the
    dimensions Ember does not split along (``"cp"``, ``"pp"``)."""
    if dimension in _UNSUPPORTED:
        raise NotImplementedError(_UNSUPPORTED[dimension])
    enabled, what = _DIMENSIONS[dimension]
    if config is None:
        raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
    return mesh.get_local_rank(config.mesh_name(dimension)) if getattr(config, enabled) else 0
