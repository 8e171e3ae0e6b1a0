"""Accelerate's ``accelerate.utils`` names that exist in Ember, in one place: port ``from accelerate.utils import X``
by changing the package name.

Everything here is a re-export; each name lives in the engine module that owns it. One name is Ember's own:
``apply_activation_checkpointing`` (``engine.memory.activation_checkpointing``).

>>> from engine.utils import gather, set_seed, is_torch_version, DistributedType
>>> set_seed(0)
>>> DistributedType.NO
<DistributedType.NO: 'NO'>
>>> from engine.utils import ProfileKwargs, find_executable_batch_size, is_schedulefree_available
>>> isinstance(is_schedulefree_available(), bool)
True
"""

from __future__ import annotations

from typing import Any

from engine.backends.deepspeed_config import HfDeepSpeedConfig
from engine.backends.deepspeed_plugin import DeepSpeedPlugin, DummyOptim, DummyScheduler
from engine.backends.parallelism_config import (
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
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
from engine.imports import (
    compare_versions,
    is_aim_available,
    is_bf16_available,
    is_bnb_available,
    is_boto3_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp16_available,
    is_hpu_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pynvml_available,
    is_pytest_available,
    is_rich_available,
    is_rocm_available,
    is_schedulefree_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_version,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_xpu_available,
)
from engine.memory.activation_checkpointing import apply_activation_checkpointing
from engine.memory.batch_size import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)
from engine.operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_outputs_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
    wait_for_everyone,
)
from engine.precision.fp8 import (
    AORecipeKwargs,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)
from engine.prepare.parallel import extract_model_from_parallel
from engine.random import RNGType, set_seed, synchronize_rng_state, synchronize_rng_states
from engine.state import DistributedType
from engine.tracking.profiler import ProfileKwargs

# Imported on first use: FSDP2 costs about a second to import, the launchers pull in torch.distributed.elastic.
_LAZY = {"FullyShardedDataParallelPlugin": "engine.backends.fsdp", "patch_environment": "engine.launch.launchers",
         "clear_environment": "engine.launch.launchers", "DeepSpeedOptimizerWrapper": "engine.backends.deepspeed",
         "DeepSpeedSchedulerWrapper": "engine.backends.deepspeed"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.utils' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedOptimizerWrapper",  # noqa: F822 - resolved lazily by __getattr__
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",  # noqa: F822 - resolved lazily by __getattr__
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",  # noqa: F822 - resolved lazily by __getattr__
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "HfDeepSpeedConfig",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "MSAMPRecipeKwargs",
    "ParallelismConfig",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "apply_activation_checkpointing",
    "broadcast",
    "broadcast_object_list",
    "clear_device_cache",
    "clear_environment",  # noqa: F822 - resolved lazily by __getattr__
    "compare_versions",
    "concatenate",
    "convert_outputs_to_fp32",
    "copy_tensor_to_devices",
    "extract_model_from_parallel",
    "find_batch_size",
    "find_device",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "is_aim_available",
    "is_bf16_available",
    "is_bnb_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp16_available",
    "is_hpu_available",
    "is_matplotlib_available",
    "is_mlflow_available",
    "is_mlu_available",
    "is_mps_available",
    "is_musa_available",
    "is_npu_available",
    "is_pandas_available",
    "is_peft_available",
    "is_pynvml_available",
    "is_pytest_available",
    "is_rich_available",
    "is_rocm_available",
    "is_schedulefree_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_version",
    "is_torch_xla_available",
    "is_torchao_available",
    "is_torchdata_available",
    "is_torchvision_available",
    "is_trackio_available",
    "is_transformers_available",
    "is_triton_available",
    "is_wandb_available",
    "is_xpu_available",
    "pad_across_processes",
    "patch_environment",  # noqa: F822 - resolved lazily by __getattr__
    "recursively_apply",
    "reduce",
    "release_memory",
    "send_to_device",
    "set_seed",
    "should_reduce_batch_size",
    "synchronize_rng_state",
    "synchronize_rng_states",
    "wait_for_everyone",
]
