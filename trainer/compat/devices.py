"""Lightning's device and precision attributes of the Trainer, computed from Ember's parts.

``trainer.precision``'s name (``"32-true"``, ``"bf16-mixed"``, ``"64-true"``...), ``trainer.device_ids`` /
``num_devices`` / ``node_rank`` (this node's share of the launch) and ``trainer.default_root_dir``;
``trainer.compat.attributes`` lists them with the rest.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from engine import Accelerator
from engine.environment import read_launch

# The engine's mixed_precision -> Lightning's name for it; true (whole-model) precisions are named by dtype.
_MIXED_NAMES = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed", "fp8": "fp8"}
_TRUE_NAMES = {torch.float64: "64-true", torch.float16: "16-true", torch.bfloat16: "bf16-true"}


def precision_name(config: Any, accelerator: Accelerator) -> str:
    """Lightning's name of the precision the trainer runs in (``trainer.precision``).

    Example:
        >>> from trainer.config import TrainerConfig
        >>> precision_name(TrainerConfig(precision="64"), Accelerator(cpu=True))
        '64-true'
    """
    precision = config.resolved_precision
    if precision is not None and precision.kind == "true":
        return _TRUE_NAMES[precision.dtype]
    return _MIXED_NAMES.get(accelerator.mixed_precision, accelerator.mixed_precision)


def root_dir(project_dir: str | None) -> str:
    """``trainer.default_root_dir``: the run's project folder (the working directory when there is none)."""
    return os.path.normpath(project_dir) if project_dir else os.getcwd()


def device_ids(accelerator: Accelerator) -> list[int]:
    """This node's device indices (Lightning's ``trainer.device_ids``): one per local process (``[0]`` alone)."""
    return list(range(_local_world_size(accelerator)))


def node_rank(accelerator: Accelerator) -> int:
    """Which node this process runs on (0 on a single machine)."""
    return accelerator.process_index // _local_world_size(accelerator)


def _local_world_size(accelerator: Accelerator) -> int:
    if accelerator.num_processes == 1:
        return 1
    # The launcher's variables describe the node's share (torchrun, SLURM, MPI); read when asked, as Lightning does.
    return max(1, min(read_launch(os.environ).local_world_size, accelerator.num_processes))
