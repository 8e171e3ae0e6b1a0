"""``ModelParallel``: tensor parallelism on a device mesh, with FSDP2 (or HSDP) over its data-parallel dimensions.

``Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))`` on 4 processes: each Linear
the model's ``tp_plan`` names is split over the ``tp`` dimension (``parallelize_module``), then every parameter
is sharded over ``dp_shard`` (``fully_shard`` on ``mesh[fsdp_dim_names]``; with ``dp_replicate_size > 1`` as
well, a 2-D HSDP mesh). A model that arrives with ``DTensor`` parameters was split already and is taken as it is.

Data is sharded over the data-parallel dimensions only: the processes of one tensor-parallel group get the same
batches. Checkpoints are ``torch.distributed.checkpoint`` shards by default (the same layout FSDP2 writes), which
load into any other layout; ``FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")`` (or the
Trainer's ``save_distributed_checkpoint=False``) gathers full files on rank 0 instead. A model the user sharded
with ``fully_shard`` already (Lightning's ``configure_model``) is not sharded again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from engine.backends import fsdp, tensor_parallel
from engine.backends.base import ModelsToSave
from engine.backends.fsdp2 import FSDP2
from engine.backends.parallelism_config import ParallelismConfig
from engine.state import AcceleratorState

LOCAL = "local"  # data_parallel_group(): every process of the run already holds all the data-parallel results


class ModelParallel(FSDP2):
    """Tensor parallelism (``tp``), with FSDP2 / HSDP over the data-parallel mesh dimensions when they exist.

    Args:
        state: the process's state; ``state.parallelism_config`` and ``state.device_mesh`` describe the mesh.
    """

    def __init__(self, state: AcceleratorState) -> None:
        super().__init__(state)
        config = state.parallelism_config
        assert isinstance(config, ParallelismConfig) and state.device_mesh is not None
        self.config = config
        self.distributed_type = state.distributed_type
        # Checkpoints: DCP shards unless an FSDP plugin asks for full files (the Trainer's
        # save_distributed_checkpoint=False passes one).
        self.sharded_checkpoints = self.plugin.sharded_state_dict if self.plugin is not None else True

    # -- models ------------------------------------------------------------------------------------------------
    def wrap_model(self, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> torch.nn.Module:
        before = fsdp.parameter_names(model)
        plugin = self.plugin if self.plugin is not None else fsdp.FullyShardedDataParallelPlugin()
        if plugin.sync_module_states and not fsdp.holds_dtensors(model):
            # Every process starts from rank 0's weights (as DDP does), before they are split: a split tensor
            # cannot be broadcast whole.
            fsdp.broadcast_from_rank0(model, self.state.device)
        if self.config.tp_enabled:
            self._split(model)
        if self.config.dp_shard_enabled and not any(fsdp.is_sharded(m) for m in model.modules()):
            fsdp.apply_fsdp2(model, dataclasses.replace(plugin, sync_module_states=False),
                             self.state.mixed_precision, self.state.device,
                             mesh=self._dims(*self.config.fsdp_dim_names))
        fsdp.remember_replaced(model, before)
        for optimizer in optimizers:  # prepared earlier: still pointing at the whole parameters
            fsdp.retarget_optimizer(optimizer, [model])
        return model

    def _dims(self, *dimensions: str) -> Any:
        """The mesh's slice over ``dimensions``, asked by Accelerate's names (a caller may have renamed some)."""
        return self.mesh[tuple(self.config.mesh_name(name) for name in dimensions)]

    def _split(self, model: torch.nn.Module) -> None:
        tp_size = self.config.tp_size
        if fsdp.holds_dtensors(model):  # split before prepare (by the user, or transformers' tp_plan="auto")
            declared = tensor_parallel.declared_tp_size(model)
            if declared is not None and declared != tp_size:
                raise ValueError(f"tp_size in the plugin {tp_size} should be same as model's tp size {declared}")
            return
        tensor_parallel.apply_plan(model, self._dims("tp"))

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        # Gathered to rank 0, on the CPU; the other ranks get an empty dict (as FSDP2's).
        return fsdp.full_state_dict(self.unwrap(model, keep_torch_compile=False))

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
        return tensor_parallel.clip_grad_norm_(parameters, max_norm, norm_type)

    # -- data ----------------------------------------------------------------------------------------------------
    def data_shard(self) -> tuple[int, int]:
        if not self.config.dp_dim_names:
            return 1, 0
        return self.config.data_parallel_size, self._dims("dp").get_local_rank()

    def data_parallel_group(self) -> Any:
        return self._dims("dp").get_group() if self.config.dp_dim_names else LOCAL

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def models_to_save(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                       sync_gradients: bool) -> ModelsToSave:
        from engine.backends import fsdp_checkpoint

        if any(fsdp.is_sharded(m) for m in models) and not sync_gradients:
            fsdp_checkpoint.prepare_save(None, models, optimizers, sync_gradients)  # raises: FSDP2's own words
        if self.sharded_checkpoints:
            return ModelsToSave(sharded=True)
        _, gathered = fsdp_checkpoint.prepare_save(None, models, optimizers, sync_gradients)
        return ModelsToSave(weights=[self.full_state_dict(model) for model in models], optimizers=gathered)
