"""Ember's engine: an Accelerate-compatible ``Accelerator`` on plain torch / torch.distributed.

A script written for Hugging Face Accelerate ports by changing ``from accelerate import ...`` to
``from engine import ...``.
"""

from __future__ import annotations

from typing import Any

from ember_packages import check_siblings

check_siblings("engine", __file__)  # first: a user's own file that hides a package imported below is named

from engine.launch.watch import watch_launcher

# Before the heavy imports below: a launched worker whose launcher dies while it still imports torch (seconds on a
# busy machine) must not wait torch's 30-minute timeout. A no-op in a process no launcher started.
watch_launcher()

from engine.accelerator import Accelerator
from engine.backends.deepspeed_plugin import DeepSpeedPlugin
from engine.backends.parallelism_config import ParallelismConfig
from engine.config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
)
from engine.operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    send_to_device,
)
from engine.prepare.optimizer import AcceleratedOptimizer
from engine.prepare.scheduler import AcceleratedScheduler
from engine.random import set_seed
from engine.state import AcceleratorState, DistributedType, GradientState, PartialState
from engine.tracking.profiler import ProfileKwargs
from engine.version import __version__ as __version__  # re-exported

# Imported on first use so `import engine` stays cheap and free of optional packages.
_LAZY = {
    "prepare_data_loader": "engine.data.loader", "skip_first_batches": "engine.data.loader",
    "BatchSamplerShard": "engine.data.loader", "IterableDatasetShard": "engine.data.loader",
    "DataLoaderShard": "engine.data.loader", "DataLoaderDispatcher": "engine.data.loader",
    "SeedableRandomSampler": "engine.data.loader", "FullyShardedDataParallelPlugin": "engine.backends.fsdp",
    "notebook_launcher": "engine.launch.launchers", "debug_launcher": "engine.launch.launchers",
    "find_executable_batch_size": "engine.memory.batch_size",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    # resolved lazily by __getattr__ below
    "BatchSamplerShard",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "IterableDatasetShard",
    "KwargsHandler",
    "ParallelismConfig",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "SeedableRandomSampler",
    "broadcast",
    "broadcast_object_list",
    "debug_launcher",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "notebook_launcher",
    "pad_across_processes",
    "prepare_data_loader",
    "reduce",
    "send_to_device",
    "set_seed",
    "skip_first_batches",
]
