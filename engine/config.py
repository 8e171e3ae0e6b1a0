"""Small configuration dataclasses with Accelerate's names and defaults.

Each validates its own values on construction, so a bad setting fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal


class KwargsHandler:
    """Base of the ``*Kwargs`` handlers passed through ``Accelerator(kwargs_handlers=[...])``."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields that differ from the defaults (what the user actually asked for)."""
        default = type(self)()
        return {k: v for k, v in self.to_dict().items() if getattr(default, k) != v}


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves.

    Args:
        num_steps: micro-batches per optimizer step.
        adjust_scheduler: count skipped micro-steps in the scheduler's step counter (documented default True,
            honoured here, unlike Accelerate where it is silently always off).
        sync_with_dataloader: always sync (and reset the counter) on the last batch of a data loader.
        sync_each_batch: sync gradients on every micro-batch (less memory, more communication).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or isinstance(self.num_steps, bool) or self.num_steps < 1:
            raise ValueError(f"GradientAccumulationPlugin(num_steps=...) must be a positive integer, got "
                             f"{self.num_steps!r}.")


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards data loaders across processes (see ENGINE.md 2.4)."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    """Where logs and checkpoints go, and how checkpoints are named and rotated.

    With ``automatic_checkpoint_naming``, ``save_state()`` writes ``{project_dir}/checkpoints/checkpoint_{iteration}``
    and keeps at most ``total_limit`` committed checkpoints.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        elif self.logging_dir is not None:
            self.logging_dir = os.fspath(self.logging_dir)
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"ProjectConfiguration(total_limit=...) must be a positive integer or None, got "
                             f"{self.total_limit!r}.")

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir`` and, when it was not given separately, ``logging_dir``."""
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


CommHook = Literal["no", "fp16", "bf16", "power_sgd", "batched_power_sgd"]


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel`` and an optional communication hook."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: CommHook = "no"
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        allowed = ("no", "fp16", "bf16", "power_sgd", "batched_power_sgd")
        hook = str(getattr(self.comm_hook, "value", self.comm_hook)).lower()
        if hook not in allowed:
            raise ValueError(f"DistributedDataParallelKwargs(comm_hook={self.comm_hook!r}) is not one of {allowed}.")
        self.comm_hook = hook  # type: ignore[assignment]

    def ddp_kwargs(self) -> dict[str, Any]:
        kwargs = self.to_kwargs()
        kwargs.pop("comm_hook", None)
        kwargs.pop("comm_state_option", None)
        return kwargs


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for ``torch.amp.GradScaler`` under fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``; ``timeout`` is applied to every collective."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            if isinstance(self.timeout, (int, float)):
                self.timeout = timedelta(seconds=self.timeout)
            else:
                raise ValueError(f"InitProcessGroupKwargs(timeout=...) must be a datetime.timedelta or seconds, "
                                 f"got {self.timeout!r}.")


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``torch.autocast`` in the forward wrapper and ``Accelerator.autocast()``."""

    enabled: bool = True
    cache_enabled: bool | None = None
