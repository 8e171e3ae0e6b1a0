"""``FSDP2``: several processes, each holding a shard of every parameter (``torch.distributed.fsdp.fully_shard``).

Parameters become ``DTensor`` shards gathered for each forward and backward; gradients are reduce-scattered.
Checkpoints hold either full weights gathered to rank 0 or per-rank shards written with
``torch.distributed.checkpoint`` (``FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")``);
both load into any number of processes, sharded or not (``engine.backends.fsdp_checkpoint``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from engine.backends import fsdp, fsdp_checkpoint
from engine.backends.base import Backend
from engine.state import AcceleratorState, DistributedType


class FSDP2(Backend):
    """``fully_shard`` on the plugin's units and the root; optimizers follow the sharded parameters.

    Args:
        state: the process's state; ``state.fsdp_plugin`` is the ``FullyShardedDataParallelPlugin``.
    """

    distributed_type = DistributedType.FSDP
    places_models = False  # fully_shard moves each rank's shard to the device itself
    saves_mid_accumulation = False  # gradients under set_requires_gradient_sync(False) are private buffers
    allows_inference_mode = False  # gathered parameters would be inference tensors the next step cannot update

    def __init__(self, state: AcceleratorState) -> None:
        super().__init__(state)
        self.plugin = state.fsdp_plugin

    def wrap_model(self, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> torch.nn.Module:
        model = fsdp.apply_fsdp2(model, self.plugin, self.state.mixed_precision, self.state.device)
        for optimizer in optimizers:  # prepared earlier: still pointing at the unsharded parameters
            fsdp.retarget_optimizer(optimizer, [model])
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]) -> None:
        fsdp.retarget_optimizer(optimizer, models)  # FSDP2 replaced the parameters it was built with

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        # Gathered to rank 0, on the CPU; the other ranks get an empty dict (as in Accelerate).
        bare = self.unwrap(model, keep_torch_compile=False)
        return fsdp.full_state_dict(bare) if fsdp.is_sharded(bare) else model.state_dict()

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        if not isinstance(model, FSDPModule):  # fsdp.is_sharded, spelled out for the type checker
            yield
            return
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
        total = super().clip_grad_norm_(parameters, max_norm, norm_type)
        # Over sharded gradients the norm is a replicated DTensor; callers expect a plain tensor.
        return total.full_tensor() if hasattr(total, "full_tensor") else total

    # -- checkpoints (the layout, full or sharded, is the plugin's choice: see Backend.models_to_save) ---------
    def _load_weights(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor], path: str, strict: bool,
                      pool: Executor | None) -> None:
        fsdp_checkpoint.load_model_weights(model, state, strict=strict)  # each rank keeps its shard

    def _load_optimizer(self, optimizer: Any, state: Any, owners: Sequence[torch.nn.Module]) -> None:
        fsdp_checkpoint.load_optimizer_state(optimizer, state, owners)
