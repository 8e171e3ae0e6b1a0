"""Small configuration dataclasses with Accelerate's names and defaults.

Each validates its own values on construction, so a bad setting fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from engine.data.workers import DEFAULT_WORKER_TIMEOUT_S, check_worker_timeout
from engine.keywords import suggest_keywords


class KwargsHandler:
    """Base of the ``*Kwargs`` handlers passed through ``Accelerator(kwargs_handlers=[...])``."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every handler is a dataclass (declared for dataclasses.fields)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields that differ from the defaults (what the user actually asked for)."""
        default = type(self)()
        return {k: v for k, v in self.to_dict().items() if getattr(default, k) != v}


@suggest_keywords
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


@suggest_keywords
@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards data loaders across processes (see ENGINE.md 2.4).

    ``worker_timeout`` (Ember's, not Accelerate's): the seconds a process waits for a batch from a loader worker
    before it raises ``LoaderWorkerTimeout`` with the workers' stacks, when the DataLoader sets no ``timeout`` of
    its own (a user's ``timeout`` wins). None waits without a limit, as a plain DataLoader does; the default, 10
    minutes, is far beyond any batch's read and ends a run whose worker is stuck instead of leaving every rank
    waiting (engine/data/workers.py).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    worker_timeout: float | None = DEFAULT_WORKER_TIMEOUT_S

    def __post_init__(self) -> None:
        self.worker_timeout = check_worker_timeout(self.worker_timeout)


@suggest_keywords
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


class DDPCommunicationHookType(str, enum.Enum):
    """A DDP communication hook (``comm_hook``) or a compression wrapper around one (``comm_wrapper``).

    ``FP16`` / ``BF16`` all-reduce gradients in half precision; ``POWER_SGD`` / ``BATCHED_POWER_SGD`` send a low-rank
    approximation (``torch.distributed.algorithms.ddp_comm_hooks``). As a ``comm_wrapper``, ``FP16`` / ``BF16``
    cast what a PowerSGD hook sends. ``BF16`` needs NCCL (torch refuses it on gloo).

    >>> DDPCommunicationHookType("power_sgd") is DDPCommunicationHookType.POWER_SGD
    True
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self) -> str:
        return self.value


_POWER_SGD_HOOKS = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
_WRAPPERS = (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16)


def _hook_type(value: Any, argument: str, allowed: tuple[DDPCommunicationHookType, ...]) -> DDPCommunicationHookType:
    try:
        member = DDPCommunicationHookType(str(getattr(value, "value", value)).lower())
    except ValueError:
        member = None
    if member not in allowed:
        names = [m.value for m in allowed]
        raise ValueError(f"DistributedDataParallelKwargs({argument}={value!r}) is not one of {names}.")
    return member


@suggest_keywords
@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel`` and an optional communication hook.

    ``comm_hook`` picks a hook from ``torch.distributed.algorithms.ddp_comm_hooks``; ``comm_wrapper`` (``"fp16"`` or
    ``"bf16"``) compresses what a PowerSGD hook sends; ``comm_state_option`` holds ``PowerSGDState`` arguments
    (``matrix_approximation_rank``, ``start_powerSGD_iter``, ...). Settings that would have no effect are refused
    here (Accelerate ignores them).

    >>> kwargs = DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper="fp16",
    ...                                        comm_state_option={"matrix_approximation_rank": 2})
    >>> kwargs.comm_hook, kwargs.to_kwargs()
    (<DDPCommunicationHookType.POWER_SGD: 'power_sgd'>, {})
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = _hook_type(self.comm_hook, "comm_hook", tuple(DDPCommunicationHookType))
        self.comm_wrapper = _hook_type(self.comm_wrapper, "comm_wrapper", _WRAPPERS)
        if self.comm_wrapper != DDPCommunicationHookType.NO and self.comm_hook == DDPCommunicationHookType.NO:
            raise ValueError(f"DistributedDataParallelKwargs(comm_wrapper={self.comm_wrapper.value!r}) wraps a "
                             "communication hook, but comm_hook='no': set comm_hook='power_sgd' (for example), or "
                             "use comm_hook='fp16' / 'bf16' alone to compress a plain all-reduce.")
        if not isinstance(self.comm_state_option, dict):
            raise TypeError(f"DistributedDataParallelKwargs(comm_state_option=...) must be a dict of PowerSGDState "
                             f"arguments, got {self.comm_state_option!r}.")
        if self.comm_state_option:
            if self.comm_hook not in _POWER_SGD_HOOKS:
                raise ValueError(f"DistributedDataParallelKwargs(comm_state_option={self.comm_state_option!r}) only "
                                 f"applies to PowerSGD hooks, but comm_hook={self.comm_hook.value!r}: set "
                                 "comm_hook='power_sgd' or 'batched_power_sgd', or remove comm_state_option.")
            _check_power_sgd_options(self.comm_state_option)

    def to_dict(self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")) -> dict[str, Any]:
        """The ``DistributedDataParallel`` arguments (the hook settings are not DDP arguments)."""
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}

    def ddp_kwargs(self) -> dict[str, Any]:
        return self.to_kwargs()

    def register_comm_hook(self, model: Any) -> None:
        """Register the configured hook (wrapped by ``comm_wrapper``) on a ``DistributedDataParallel`` ``model``."""
        if self.comm_hook == DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks: dict[DDPCommunicationHookType, Callable[..., Any]] = {
                 DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
                 DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
                 DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
                 DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook}
        wrappers: dict[DDPCommunicationHookType, Callable[..., Any]] = {
                    DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
                    DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper}
        hook = hooks[self.comm_hook]
        if self.comm_wrapper in wrappers:
            hook = wrappers[self.comm_wrapper](hook)
        # PowerSGD keeps its error feedback and warm-start matrices in this state object, one per model.
        state = (powerSGD_hook.PowerSGDState(None, **self.comm_state_option) if self.comm_hook in _POWER_SGD_HOOKS
                 else None)
        model.register_comm_hook(state=state, hook=hook)


def _check_power_sgd_options(options: dict[str, Any]) -> None:
    """Name an unknown ``PowerSGDState`` argument now, not at ``prepare`` on every rank."""
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    accepted = [name for name in inspect.signature(PowerSGDState.__init__).parameters
                if name not in ("self", "process_group")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"DistributedDataParallelKwargs(comm_state_option=...) has unknown PowerSGDState "
                         f"arguments {unknown}; accepted: {accepted}.")


@suggest_keywords
@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for ``torch.amp.GradScaler`` under fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@suggest_keywords
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


@suggest_keywords
@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``torch.autocast`` in the forward wrapper and ``Accelerator.autocast()``."""

    enabled: bool = True
    cache_enabled: bool | None = None


def merge_dataloader_config(config: DataLoaderConfiguration | None, given: dict[str, Any]) -> DataLoaderConfiguration:
    """The data loader settings from ``Accelerator(split_batches=..., ...)`` keywords (``given``: only those passed)
    and ``dataloader_config``; a conflict between the two raises (Accelerate ignores ``split_batches=``)."""
    if config is None:
        return DataLoaderConfiguration(**given)
    for key, value in given.items():
        # A dataclass cannot tell an explicit False from its default, so any disagreement between the two
        # places is a conflict: which one was meant cannot be known.
        configured = getattr(config, key)
        if configured != value:
            raise ValueError(f"Accelerator({key}={value!r}) contradicts dataloader_config=DataLoaderConfiguration"
                             f"({key}={configured!r}): set {key} in one place only (the keyword, or the "
                             "DataLoaderConfiguration).")
    return config


def sort_kwargs_handlers(handlers: list[KwargsHandler], known: tuple[type, ...]) -> dict[type, Any]:
    """``handlers`` by their kind (one of ``known``); an unknown kind, or two of one kind, is refused."""
    found: dict[type, Any] = {}
    for handler in handlers:
        kind = next((k for k in known if isinstance(handler, k)), None)
        if kind is None:
            raise ValueError(f"Unsupported kwargs handler {handler!r}: pass instances of "
                             f"{', '.join(k.__name__ for k in known)}.")
        if kind in found:
            raise ValueError(f"You can only pass one {kind.__name__} in `kwargs_handlers`, got two.")
        found[kind] = handler
    return found


def resolve_accumulation_plugin(plugin: GradientAccumulationPlugin | None, steps: int,
                                environment: Any) -> GradientAccumulationPlugin:
    """The plugin an Accelerator runs with: the one given, else one of ``steps`` micro-steps (the launcher's
    ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` in ``environment``, an ``EngineEnvironment``, wins)."""
    if plugin is not None:
        if steps != 1:
            raise ValueError(f"Both gradient_accumulation_steps={steps} and a GradientAccumulationPlugin were "
                             "given: set the number of steps in the plugin only.")
        return plugin
    # Parsed from text as Accelerate does: 2.0 or True is a ValueError, "2" is accepted.
    env_steps = environment.gradient_accumulation_steps
    return GradientAccumulationPlugin(num_steps=int(env_steps if env_steps is not None else str(steps)))
