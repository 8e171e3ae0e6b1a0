"""``Preparer``: what ``Accelerator.prepare`` does to each object for this setup and precision.

Models get the autocast wrapper, their device and the backend's wrapper (DDP, FSDP2, ...); optimizers and
schedulers their Accelerate wrappers; data loaders their shard. Everything prepared is recorded in the run's
``PreparedObjects``. The Accelerator's settings that a script may change between calls (``device_placement``,
``rng_types``, ...) come with each call as a ``PrepareOptions`` value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch.utils.data import DataLoader

from engine.accelerator.registry import PreparedObjects
from engine.backends.base import Backend
from engine.config import AutocastKwargs, DataLoaderConfiguration
from engine.gradient_state import GradientState
from engine.precision.fp8 import NoFp8
from engine.precision.mixed import wrap_forward
from engine.prepare.optimizer import AcceleratedOptimizer
from engine.prepare.preparable import check_preparable, is_scheduler
from engine.prepare.scheduler import AcceleratedScheduler
from engine.state import AcceleratorState

if TYPE_CHECKING:
    from engine.backends.deepspeed import Prepared



class JointBackend(Protocol):
    """What a backend that ``prepares_jointly`` adds to ``Backend`` (``engine.backends.deepspeed.DeepSpeed``)."""

    def accumulation_steps(self, requested: int) -> int: ...
    def prepare(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, loaders: Sequence[Any], *,
                num_processes: int, split_batches: bool) -> Prepared: ...

@dataclass(frozen=True)
class PrepareOptions:
    """The Accelerator's backend and the settings ``prepare`` reads, as they are at the call (Accelerate's
    attributes, which a script may change after building the Accelerator)."""

    backend: Backend  # what differs between backends: wrapping, sharding data, DeepSpeed's joint preparation
    device_placement: bool
    dataloader_config: DataLoaderConfiguration
    rng_types: list[str]
    dynamo_backend: str
    step_scheduler_with_optimizer: bool
    native_amp: bool
    autocast_handler: AutocastKwargs | None


class Preparer:
    """Prepares models, optimizers, schedulers and data loaders, and records them in ``prepared``.

    Args:
        state: the process's state (device, processes, precision).
        prepared: the registry every prepared object is recorded in.
        gradient_state: the accumulation window (DeepSpeed's config may set its length at prepare).
        scaler: the fp16 ``GradScaler`` the optimizers step through (None without one).
        fp8: fp8 training (a no-op unless ``mixed_precision="fp8"``).
    """

    def __init__(self, state: AcceleratorState, prepared: PreparedObjects, gradient_state: GradientState,
                 scaler: Any, fp8: NoFp8) -> None:
        self.state = state
        self.prepared = prepared
        self.gradient_state = gradient_state
        self.scaler = scaler
        self.fp8 = fp8
        self.deepspeed_config: dict[str, Any] | None = None  # DeepSpeed's config, once its engine is built

    def prepare(self, args: tuple[Any, ...], device_placement: list[bool] | None, options: PrepareOptions) -> Any:
        """Prepare each object and return them in the same order (a bare object if only one).

        Data loaders, models and optimizers are prepared first; schedulers second, since they need the
        prepared optimizers.
        """
        # After AcceleratorState._reset_state() this raises, in Accelerate's words (its own tests expect them).
        self.state.mixed_precision  # noqa: B018
        placements: list[Any] = [None] * len(args) if device_placement is None else list(device_placement)
        if len(placements) != len(args):
            raise ValueError(f"`device_placement` has {len(placements)} entries but {len(args)} objects were "
                             "passed to prepare(): give one bool per object.")
        # Anything else (None for a missing scheduler, a tokenizer, ...) is returned unchanged, as in Accelerate,
        # except objects that look preparable but would silently stay unprepared: those fail now.
        for obj in args:
            check_preparable(obj)
        if options.backend.prepares_jointly:
            return self._prepare_jointly(args, placements, options)
        first = [self._prepare_one(obj, placement, options, first_pass=True) for obj, placement in zip(args, placements)]
        result = [self._prepare_one(obj, placement, options) for obj, placement in zip(first, placements)]
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_jointly(self, args: tuple[Any, ...], device_placement: list[Any], options: PrepareOptions) -> Any:
        """``prepare`` for a backend that builds the model, optimizer and scheduler together (DeepSpeed)."""
        if any(placement is not None for placement in device_placement):
            raise ValueError("You can't customize device placements with DeepSpeed or Megatron-LM.")
        if sum(isinstance(obj, torch.nn.Module) for obj in args) > 1:  # Accelerate's type and words
            raise AssertionError("You can't use same `Accelerator()` instance with multiple models when using "
                                 "DeepSpeed")
        result = [self._prepare_one(obj, None, options, first_pass=True) if isinstance(obj, DataLoader) else obj
                  for obj in args]
        from engine.backends.deepspeed_plugin import DummyOptim, DummyScheduler

        backend = cast(JointBackend, options.backend)  # prepares_jointly: it has JointBackend's methods

        model = next((obj for obj in result if isinstance(obj, torch.nn.Module)), None)
        if model is None:
            return result[0] if len(result) == 1 else tuple(result)
        optimizer = next((obj for obj in result if isinstance(obj, (torch.optim.Optimizer, DummyOptim))), None)
        scheduler = next((obj for obj in result if is_scheduler(obj) or isinstance(obj, DummyScheduler)), None)
        # The DeepSpeed config's accumulation steps win over the Accelerator's (as in Accelerate, with a warning).
        self.gradient_state.num_steps = backend.accumulation_steps(self.gradient_state.num_steps)
        if options.native_amp:
            wrap_forward(model, self.state.device, self.state.mixed_precision, options.autocast_handler)
        loaders = [obj for obj in args if isinstance(obj, DataLoader)]
        split_batches = options.dataloader_config.split_batches
        prepared = backend.prepare(model, optimizer, scheduler, loaders, num_processes=self.state.num_processes,
                                   split_batches=split_batches)
        self.prepared.models.append(prepared.engine)
        prepared.engine._is_accelerate_prepared = True
        swaps: dict[int, Any] = {id(model): prepared.engine}
        if optimizer is not None and prepared.optimizer is not None:
            self.prepared.optimizers.append(prepared.optimizer)
            swaps[id(optimizer)] = prepared.optimizer
        if scheduler is not None:
            if not prepared.deepspeed_scheduler:  # a torch scheduler: stepped by the user, as under DDP
                prepared.scheduler = AcceleratedScheduler(prepared.scheduler, self.prepared.optimizers,
                                                          step_with_optimizer=options.step_scheduler_with_optimizer,
                                                          split_batches=split_batches)
                self.prepared.schedulers.append(prepared.scheduler)
            swaps[id(scheduler)] = prepared.scheduler
        plugin = self.state.deepspeed_plugin
        assert plugin is not None  # a backend that prepares jointly is DeepSpeed's
        self.deepspeed_config = plugin.deepspeed_config
        result = [swaps.get(id(obj), obj) for obj in result]
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_one(self, obj: Any, device_placement: bool | None, options: PrepareOptions,
                     first_pass: bool = False) -> Any:
        if getattr(obj, "_is_accelerate_prepared", False):
            self.prepared.register(obj)
            return obj
        if first_pass:
            if isinstance(obj, DataLoader):
                return self.prepare_data_loader(obj, device_placement, options)
            if isinstance(obj, torch.nn.Module):
                return self.prepare_model(obj, device_placement, options)
            if isinstance(obj, torch.optim.Optimizer):
                return self.prepare_optimizer(obj, device_placement, options)
        elif is_scheduler(obj):
            return self.prepare_scheduler(obj, options)
        return obj

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None, options: PrepareOptions,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Autocast wrapper (mixed precision), device placement, then DDP / FSDP2 and torch.compile."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"prepare_model() needs a torch.nn.Module, got {type(model).__name__}.")
        if device_placement is None:
            device_placement = options.device_placement and options.backend.places_models
        model = self.fp8.convert(model, self.prepared.optimizers)  # fp8: Float8Linear layers, before any wrapper
        self.prepared.models.append(model)
        if options.native_amp:
            wrap_forward(model, self.state.device, self.state.mixed_precision, options.autocast_handler)
        if device_placement:
            model = model.to(self.state.device)
        if not evaluation_mode:  # an evaluation-only model needs no gradient sync (nor sharding)
            model = options.backend.wrap_model(model, [prepared.optimizer for prepared in self.prepared.optimizers])
        if options.dynamo_backend != "no":
            # A module in gives a module out (an OptimizedModule); torch's overloads type it as a callable.
            model = cast(torch.nn.Module, torch.compile(model, backend=options.dynamo_backend))
        model._is_accelerate_prepared = True  # type: ignore[assignment]  # nn.Module's stub: Tensor | Module only
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None,
                          options: PrepareOptions) -> AcceleratedOptimizer:
        if isinstance(optimizer, AcceleratedOptimizer):
            self.prepared.register(optimizer)
            return optimizer
        if device_placement is None:
            device_placement = options.device_placement
        self.fp8.link(optimizer)  # fp8: to the converted weights first, which a backend may then replace in turn
        options.backend.prepare_optimizer(optimizer, self.prepared.models)
        prepared = AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=self.scaler,
                                        device=self.state.device)
        prepared._is_accelerate_prepared = True
        self.prepared.optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any, options: PrepareOptions) -> AcceleratedScheduler:
        if isinstance(scheduler, AcceleratedScheduler):
            self.prepared.register(scheduler)
            return scheduler
        inner = getattr(scheduler, "optimizer", None)
        optimizers: Sequence[AcceleratedOptimizer] = self.prepared.optimizers
        matching = [opt for opt in optimizers if opt.optimizer is inner]
        prepared = AcceleratedScheduler(scheduler, matching or self.prepared.optimizers,
                                        step_with_optimizer=options.step_scheduler_with_optimizer,
                                        split_batches=options.dataloader_config.split_batches)
        prepared._is_accelerate_prepared = True
        self.prepared.schedulers.append(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None, options: PrepareOptions,
                            slice_fn_for_dispatch: Callable[..., Any] | None = None) -> DataLoader:
        """Shard ``data_loader`` across processes (see ``engine.data.loader.prepare_data_loader``)."""
        from engine.data.loader import prepare_data_loader

        if device_placement is None:
            device_placement = options.device_placement
        config = options.dataloader_config
        num_processes = self.state.num_processes
        shards, index = options.backend.data_shard()  # tensor-parallel processes share their batches
        if config.dispatch_batches and shards != num_processes:
            raise ValueError(f"dispatch_batches=True sends each process its own slice of rank 0's batch, but the "
                             f"{num_processes} processes of this ParallelismConfig form {shards} data-parallel "
                             "groups (tensor-parallel processes share batches): use dispatch_batches=False.")
        prepared = prepare_data_loader(
            data_loader, self.state.device, num_processes=shards, process_index=index,
            split_batches=config.split_batches, put_on_device=device_placement, rng_types=list(options.rng_types),
            dispatch_batches=config.dispatch_batches, even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed, non_blocking=config.non_blocking, worker_timeout=config.worker_timeout)
        prepared._is_accelerate_prepared = True
        self.prepared.dataloaders.append(prepared)
        return prepared
