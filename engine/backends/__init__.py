"""One object per backend: what differs between running a model in one process, under DDP, FSDP2, DeepSpeed and
tensor parallelism (``ModelParallel``).

The ``Accelerator`` holds one ``Backend`` (``accelerator.backend``), chosen once from the process group and the
plugins, and delegates to it everything that differs between backends: wrapping a model, pausing gradient
sync while accumulating, backward, clipping, the full state dict of a model, and how models and optimizers are
written into and read from a checkpoint folder. Everything else (sharding data, mixed precision, the commit
protocol of checkpoints, trackers) is the same for all of them and stays in the Accelerator.

``select_backend`` imports a backend's module only when it is chosen: FSDP2's imports cost about a second.
"""

from __future__ import annotations

from typing import Any

from engine.backends.base import Backend
from engine.state import AcceleratorState, DistributedType

__all__ = ["Backend", "select_backend"]


def select_backend(state: AcceleratorState, ddp_handler: Any = None) -> Backend:
    """The backend for this process: DeepSpeed with its plugin, ModelParallel for a ParallelismConfig with tensor
    parallelism or FSDP2 shards, FSDP2 with a plugin and a process group, DDP with a process group, else a single
    process.

    Example:
        >>> from engine import Accelerator
        >>> type(Accelerator(cpu=True).backend).__name__
        'SingleProcess'
    """
    if state.distributed_type == DistributedType.DEEPSPEED:
        from engine.backends.deepspeed import DeepSpeed

        return DeepSpeed(state, state.deepspeed_plugin)
    config = state.parallelism_config
    if config is not None and (config.tp_enabled or config.dp_shard_enabled):
        from engine.backends.model_parallel import ModelParallel

        return ModelParallel(state)
    if state.distributed_type == DistributedType.FSDP:
        from engine.backends.fsdp2 import FSDP2

        return FSDP2(state)
    if state.use_distributed:
        from engine.backends.ddp import DDP

        return DDP(state, ddp_handler)
    from engine.backends.single import SingleProcess

    return SingleProcess(state)
