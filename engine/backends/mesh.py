"""The Accelerator's device-mesh surface (Accelerate's names): the ``ParallelismConfig`` it runs with, its mesh,
and each process's rank along the mesh's dimensions; and ``resolve_parallelism``, what a new Accelerator makes
of a ``ParallelismConfig`` before its state exists."""

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
        from engine.backends.fsdp import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin()  # dp_shard is FSDP2: its defaults (the root as one unit)
    return config, fsdp_plugin


class MeshMixin:
    """``parallelism_config``, ``torch_device_mesh`` and the per-dimension ranks of an Accelerator."""

    state: Any

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The ``DeviceMesh`` of the ``ParallelismConfig`` (``None`` without one, or when every size is 1)."""
        return self.state.device_mesh

    def _mesh_rank(self, dimension: str, enabled: bool, what: str) -> int:
        if self.parallelism_config is None:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        return self.torch_device_mesh.get_local_rank(dimension) if enabled else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's place in its tensor-parallel group (0 when ``tp_size`` is 1)."""
        config = self.parallelism_config
        return self._mesh_rank("tp", config is not None and config.tp_enabled, "Tensor parallelism")

    @property
    def data_parallel_rank(self) -> int:
        """This process's replica along ``dp_replicate`` (0 when ``dp_replicate_size`` is 1)."""
        config = self.parallelism_config
        return self._mesh_rank("dp_replicate", config is not None and config.dp_replicate_enabled,
                               "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's shard along ``dp_shard`` (0 when ``dp_shard_size`` is 1)."""
        config = self.parallelism_config
        return self._mesh_rank("dp_shard", config is not None and config.dp_shard_enabled,
                               "Shard-based data parallelism")

    @property
    def context_parallel_rank(self) -> int:
        raise NotImplementedError("Context parallelism is not supported in Ember (nor in Accelerate): there is no "
                                  "context-parallel rank. See ParallelismConfig(cp_size=...).")

    @property
    def pipeline_parallel_rank(self) -> int:
        raise NotImplementedError("Pipeline parallelism is not supported in Ember (nor in Accelerate): there is no "
                                  "pipeline-parallel rank.")
