"""The ``Accelerator``: Accelerate's training API on plain torch / torch.distributed.

A script written for ``accelerate.Accelerator`` runs after changing ``from accelerate import ...`` to
``from engine import ...``. Where Accelerate's behaviour is a trap, Ember differs as ``spec/ENGINE.md`` decides.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from engine import operations
from engine.accelerator_tracking import TrackingMixin
from engine.backends import Backend, select_backend
from engine.backends.deepspeed_plugin import DeepSpeedPlugin, choose_deepspeed_plugin
from engine.backends.mesh import MeshMixin, resolve_parallelism
from engine.checkpoint.checkpointer import CheckpointingMixin
from engine.config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
    merge_dataloader_config,
)
from engine.environment import EngineEnvironment
from engine.keywords import suggest_keywords
from engine.precision.fp8 import AORecipeKwargs, Fp8Training
from engine.precision.mixed import (
    autocast_context,
    check_autocast_support,
    make_grad_scaler,
    validate_precision,
    wrap_forward,
)
from engine.prepare.optimizer import AcceleratedOptimizer
from engine.prepare.parallel import extract_model_from_parallel, unwrap
from engine.prepare.preparable import check_preparable, is_scheduler
from engine.prepare.scheduler import AcceleratedScheduler
from engine.process_control import ProcessControlMixin
from engine.state import AcceleratorState, DistributedType, GradientState
from engine.tracking.profiler import ProfileKwargs, ProfilerMixin

_NO_CONTEXT = contextlib.nullcontext()  # reusable: accumulate() returns it on every syncing step
_UNSET: Any = object()  # sentinel: "keyword not given" (distinct from an explicit False/None)
_UNSUPPORTED = "Ember supports DDP, FSDP2 (FullyShardedDataParallelPlugin) and DeepSpeed (DeepSpeedPlugin)"


@suggest_keywords
class Accelerator(ProcessControlMixin, CheckpointingMixin, TrackingMixin, ProfilerMixin, MeshMixin):
    """Prepares models, optimizers, schedulers and data loaders for the current distributed setup and precision.

    >>> accelerator = Accelerator(cpu=True)
    >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
    >>> accelerator.num_processes, accelerator.device.type
    (1, 'cpu')
    """

    def __init__(self, device_placement: bool = True, split_batches: bool = _UNSET,
                 mixed_precision: str | None = None, gradient_accumulation_steps: int = 1, cpu: bool = False,
                 dataloader_config: DataLoaderConfiguration | None = None, deepspeed_plugin: Any = None,
                 fsdp_plugin: Any = None, megatron_lm_plugin: Any = None, rng_types: list[str] | None = None,
                 log_with: Any = None, project_dir: str | os.PathLike[str] | None = None,
                 project_config: ProjectConfiguration | None = None,
                 gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
                 dispatch_batches: bool | None = _UNSET, even_batches: bool = _UNSET,
                 use_seedable_sampler: bool = _UNSET, step_scheduler_with_optimizer: bool = True,
                 kwargs_handlers: list[KwargsHandler] | None = None, dynamo_backend: str | None = None,
                 dynamo_plugin: Any = None, parallelism_config: Any = None) -> None:
        if megatron_lm_plugin is not None:
            raise NotImplementedError(f"megatron_lm_plugin is not supported: {_UNSUPPORTED}. Remove "
                                      "`megatron_lm_plugin=`; tensor parallelism is ParallelismConfig(tp_size=...).")
        mixed_precision = validate_precision(mixed_precision)
        # The ACCELERATE_* / launcher variables, read once here and passed down (they override the keywords).
        environment = EngineEnvironment.from_env()
        if mixed_precision is None and environment.mixed_precision:
            mixed_precision = validate_precision(environment.mixed_precision.lower())

        self.project_configuration = project_config if project_config is not None else ProjectConfiguration()
        if project_dir is not None and self.project_configuration.project_dir is None:  # the config wins
            self.project_configuration.set_directories(project_dir)

        handlers = self._sort_kwargs_handlers(kwargs_handlers or [])
        self.ddp_handler: DistributedDataParallelKwargs | None = handlers.get(DistributedDataParallelKwargs)
        self.scaler_handler: GradScalerKwargs | None = handlers.get(GradScalerKwargs)
        self.init_handler: InitProcessGroupKwargs | None = handlers.get(InitProcessGroupKwargs)
        self.autocast_handler: AutocastKwargs | None = handlers.get(AutocastKwargs)
        self.profile_handler: ProfileKwargs | None = handlers.get(ProfileKwargs)
        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}

        if fsdp_plugin is None and environment.use_fsdp:
            from engine.backends.fsdp import FullyShardedDataParallelPlugin

            fsdp_plugin = FullyShardedDataParallelPlugin()
        deepspeed_plugin, mixed_precision = choose_deepspeed_plugin(deepspeed_plugin, environment, fsdp_plugin,
                                                                    mixed_precision)
        parallelism_config, fsdp_plugin = resolve_parallelism(parallelism_config, environment, fsdp_plugin,
                                                              deepspeed_plugin)
        self.state = AcceleratorState(mixed_precision=mixed_precision, cpu=cpu, fsdp_plugin=fsdp_plugin,
                                      deepspeed_plugin=deepspeed_plugin, parallelism_config=parallelism_config,
                                      dynamo_plugin=dynamo_plugin, _from_accelerator=True, _environment=environment,
                                      **init_kwargs)
        self._use_distributed = self.state.use_distributed  # fixed for the life of the process group
        self.backend: Backend = select_backend(self.state, self.ddp_handler)  # what differs between backends
        self.device_placement = device_placement
        given = {k: v for k, v in (("split_batches", split_batches), ("dispatch_batches", dispatch_batches),
                                   ("even_batches", even_batches), ("use_seedable_sampler", use_seedable_sampler))
                 if v is not _UNSET}
        self.dataloader_config = merge_dataloader_config(dataloader_config, given)

        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps != 1:
                raise ValueError(f"Both gradient_accumulation_steps={gradient_accumulation_steps} and a "
                                 "GradientAccumulationPlugin were given: set the number of steps in the plugin only.")
        else:
            # Parsed from text as Accelerate does: 2.0 or True is a ValueError, "2" is accepted.
            env_steps = environment.gradient_accumulation_steps
            steps = int(env_steps if env_steps is not None else str(gradient_accumulation_steps))
            gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)
        self.gradient_state = GradientState(gradient_accumulation_plugin=gradient_accumulation_plugin)

        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.dynamo_backend = (dynamo_backend or "no").lower()
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]

        precision = self.state.mixed_precision
        check_autocast_support(self.device, precision, environment.cpu_bf16)
        self.native_amp = precision in ("fp16", "bf16", "fp8")  # fp8: float8 matrix products in a bf16 autocast
        self.scaler = make_grad_scaler(self.device, precision, self.scaler_handler)
        self.fp8 = Fp8Training.create(precision, handlers.get(AORecipeKwargs), environment, self.is_fsdp2)

        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[DataLoader] = []
        self._custom_objects: list[Any] = []
        self._init_checkpointing()
        self._init_tracking(log_with)

    @staticmethod
    def _sort_kwargs_handlers(handlers: list[KwargsHandler]) -> dict[type, Any]:
        known = (DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs, AutocastKwargs,
                 ProfileKwargs, AORecipeKwargs)
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

    # -- what the process is ----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self._use_distributed

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def is_fsdp2(self) -> bool:
        return self.backend.distributed_type == DistributedType.FSDP

    @property
    def should_save_model(self) -> bool:
        return self.is_main_process or self.is_fsdp2

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = value

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    # -- prepare ----------------------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare each object for this setup and return them in the same order (a bare object if only one).

        Data loaders, models and optimizers are prepared first; schedulers second, since they need the
        prepared optimizers.
        """
        # After AcceleratorState._reset_state() this raises, in Accelerate's words (its own tests expect them).
        self.state.mixed_precision  # noqa: B018
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(f"`device_placement` has {len(device_placement)} entries but {len(args)} objects were "
                             "passed to prepare(): give one bool per object.")
        # Anything else (None for a missing scheduler, a tokenizer, ...) is returned unchanged, as in Accelerate,
        # except objects that look preparable but would silently stay unprepared: those fail now.
        for obj in args:
            check_preparable(obj)
        if self.backend.prepares_jointly:
            return self._prepare_jointly(args, device_placement)
        first = [self._prepare_one(obj, placement, first_pass=True) for obj, placement in zip(args, device_placement)]
        result = [self._prepare_one(obj, placement) for obj, placement in zip(first, device_placement)]
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_jointly(self, args: tuple[Any, ...], device_placement: list[Any]) -> Any:
        """``prepare`` for a backend that builds the model, optimizer and scheduler together (DeepSpeed)."""
        if any(placement is not None for placement in device_placement):
            raise ValueError("You can't customize device placements with DeepSpeed or Megatron-LM.")
        if sum(isinstance(obj, torch.nn.Module) for obj in args) > 1:  # Accelerate's type and words
            raise AssertionError("You can't use same `Accelerator()` instance with multiple models when using "
                                 "DeepSpeed")
        result = [self._prepare_one(obj, None, first_pass=True) if isinstance(obj, DataLoader) else obj
                  for obj in args]
        from engine.backends.deepspeed_plugin import DummyOptim, DummyScheduler

        model = next((obj for obj in result if isinstance(obj, torch.nn.Module)), None)
        if model is None:
            return result[0] if len(result) == 1 else tuple(result)
        optimizer = next((obj for obj in result if isinstance(obj, (torch.optim.Optimizer, DummyOptim))), None)
        scheduler = next((obj for obj in result if is_scheduler(obj) or isinstance(obj, DummyScheduler)), None)
        # The DeepSpeed config's accumulation steps win over the Accelerator's (as in Accelerate, with a warning).
        self.gradient_accumulation_steps = self.backend.accumulation_steps(self.gradient_accumulation_steps)
        if self.native_amp:
            wrap_forward(model, self.device, self.mixed_precision, self.autocast_handler)
        loaders = [obj for obj in args if isinstance(obj, DataLoader)]
        prepared = self.backend.prepare(model, optimizer, scheduler, loaders, num_processes=self.num_processes,
                                        split_batches=self.split_batches)
        self._models.append(prepared.engine)
        prepared.engine._is_accelerate_prepared = True
        swaps: dict[int, Any] = {id(model): prepared.engine}
        if optimizer is not None and prepared.optimizer is not None:
            self._optimizers.append(prepared.optimizer)
            swaps[id(optimizer)] = prepared.optimizer
        if scheduler is not None:
            if not prepared.deepspeed_scheduler:  # a torch scheduler: stepped by the user, as under DDP
                prepared.scheduler = AcceleratedScheduler(prepared.scheduler, self._optimizers,
                                                          step_with_optimizer=self.step_scheduler_with_optimizer,
                                                          split_batches=self.split_batches)
                self._schedulers.append(prepared.scheduler)
            swaps[id(scheduler)] = prepared.scheduler
        self.deepspeed_config = self.state.deepspeed_plugin.deepspeed_config
        result = [swaps.get(id(obj), obj) for obj in result]
        return result[0] if len(result) == 1 else tuple(result)

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The ``DeepSpeedPlugin`` (None without DeepSpeed)."""
        return self.state.deepspeed_plugin

    def _prepare_one(self, obj: Any, device_placement: bool | None, first_pass: bool = False) -> Any:
        if getattr(obj, "_is_accelerate_prepared", False):
            self._register_prepared(obj)
            return obj
        if first_pass:
            if isinstance(obj, DataLoader):
                return self.prepare_data_loader(obj, device_placement=device_placement)
            if isinstance(obj, torch.nn.Module):
                return self.prepare_model(obj, device_placement=device_placement)
            if isinstance(obj, torch.optim.Optimizer):
                return self.prepare_optimizer(obj, device_placement=device_placement)
        elif is_scheduler(obj):
            return self.prepare_scheduler(obj)
        return obj

    def _register_prepared(self, obj: Any) -> None:
        registry: list[Any] | None = None
        if isinstance(obj, AcceleratedOptimizer):
            registry = self._optimizers
        elif isinstance(obj, AcceleratedScheduler):
            registry = self._schedulers
        elif isinstance(obj, DataLoader):
            registry = self._dataloaders
        elif isinstance(obj, torch.nn.Module):
            registry, obj = self._models, unwrap(obj, keep_torch_compile=False)
        if registry is not None and not any(o is obj for o in registry):
            registry.append(obj)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Autocast wrapper (mixed precision), device placement, then DDP / FSDP2 and torch.compile."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"prepare_model() needs a torch.nn.Module, got {type(model).__name__}.")
        if device_placement is None:
            device_placement = self.device_placement and self.backend.places_models
        model = self.fp8.convert(model, self._optimizers)  # fp8: Float8Linear layers, before any wrapper
        self._models.append(model)
        if self.native_amp:
            wrap_forward(model, self.device, self.mixed_precision, self.autocast_handler)
        if device_placement:
            model = model.to(self.device)
        if not evaluation_mode:  # an evaluation-only model needs no gradient sync (nor sharding)
            model = self.backend.wrap_model(model, [prepared.optimizer for prepared in self._optimizers])
        if self.dynamo_backend != "no":
            model = torch.compile(model, backend=self.dynamo_backend)
        model._is_accelerate_prepared = True  # type: ignore[assignment]
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          device_placement: bool | None = None) -> AcceleratedOptimizer:
        if isinstance(optimizer, AcceleratedOptimizer):
            self._register_prepared(optimizer)
            return optimizer
        if device_placement is None:
            device_placement = self.device_placement
        self.fp8.link(optimizer)  # fp8: to the converted weights first, which a backend may then replace in turn
        self.backend.prepare_optimizer(optimizer, self._models)
        prepared = AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=self.scaler,
                                        device=self.device)
        prepared._is_accelerate_prepared = True  # type: ignore[attr-defined]
        self._optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        if isinstance(scheduler, AcceleratedScheduler):
            self._register_prepared(scheduler)
            return scheduler
        inner = getattr(scheduler, "optimizer", None)
        matching = [opt for opt in self._optimizers if opt.optimizer is inner]
        prepared = AcceleratedScheduler(scheduler, matching or self._optimizers,
                                        step_with_optimizer=self.step_scheduler_with_optimizer,
                                        split_batches=self.split_batches)
        prepared._is_accelerate_prepared = True  # type: ignore[attr-defined]
        self._schedulers.append(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable[..., Any] | None = None) -> DataLoader:
        """Shard ``data_loader`` across processes (see ``engine.data.loader.prepare_data_loader``)."""
        from engine.data.loader import prepare_data_loader

        if device_placement is None:
            device_placement = self.device_placement
        config = self.dataloader_config
        shards, index = self.backend.data_shard()  # tensor-parallel processes share their batches
        if config.dispatch_batches and shards != self.num_processes:
            raise ValueError(f"dispatch_batches=True sends each process its own slice of rank 0's batch, but the "
                             f"{self.num_processes} processes of this ParallelismConfig form {shards} data-parallel "
                             "groups (tensor-parallel processes share batches): use dispatch_batches=False.")
        prepared = prepare_data_loader(
            data_loader, self.device, num_processes=shards, process_index=index,
            split_batches=config.split_batches, put_on_device=device_placement, rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches, even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed, non_blocking=config.non_blocking, worker_timeout=config.worker_timeout)
        prepared._is_accelerate_prepared = True  # type: ignore[attr-defined]
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """A loader over the same data that starts ``num_batches`` (per-process) batches later."""
        from engine.data.loader import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> torch.nn.Module:
        """The user's module without the DDP / DeepSpeed (and, optionally, autocast / compile) wrappers."""
        return extract_model_from_parallel(self.backend.unwrap(model, keep_torch_compile=keep_torch_compile),
                                           keep_fp32_wrapper, keep_torch_compile)

    # -- the training step ------------------------------------------------------------------------------------
    def _do_sync(self) -> None:
        gradient_state = self.gradient_state
        if gradient_state.sync_with_dataloader and gradient_state.end_of_dataloader:
            self.step = 0
            gradient_state._set_sync_gradients(True)
        else:
            self.step += 1
            gradient_state._set_sync_gradients(self.step % gradient_state.num_steps == 0)

    def accumulate(self, *models: torch.nn.Module, sync: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """Decide whether this micro-step syncs gradients; models skip DDP's all-reduce while accumulating.

        By default the engine counts micro-steps (``gradient_accumulation_steps``) and the last batch of a data
        loader always syncs, as in Accelerate. ``sync=True`` / ``False`` (an Ember addition) is for a caller that
        owns the accumulation window itself, such as the Trainer: this micro-step syncs exactly when told, and
        the engine's own counter does not decide. (Returns a plain context manager rather than a generator: this
        runs every step, and the generator machinery costs more than the decision itself.)
        """
        if sync is None:
            self._do_sync()
        else:
            self.step += 1
            self.gradient_state._set_sync_gradients(sync)
            if sync or not self._use_distributed:
                return _NO_CONTEXT
        if self.gradient_state.sync_gradients or not self._use_distributed or self.gradient_state.sync_each_batch:
            return _NO_CONTEXT
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.backend.no_sync(model))
        return stack

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient synchronisation of ``model`` inside the block (a no-op unless distributed)."""
        return self.backend.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Make the next backward of a DDP ``model`` all-reduce, even inside ``no_sync``."""
        return self.backend.sync_in_backward(model)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled under fp16."""
        steps = self.gradient_state.num_steps
        if steps > 1 and not self.backend.scales_loss:
            loss = loss / steps
        self.backend.backward(loss, self.scaler, sync=self.gradient_state.sync_gradients, **kwargs)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        raise NotImplementedError("lomo_backward is not supported by Ember: LOMO optimizers are out of scope. Use "
                                  "a torch.optim optimizer with accelerator.backward(loss).")

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide the gradients by the fp16 loss scale (a no-op without a GradScaler)."""
        if self.scaler is None:
            return
        if optimizer is None:
            optimizers = self._optimizers
        else:
            optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        for opt in optimizers:
            self.scaler.unscale_(opt.optimizer if isinstance(opt, AcceleratedOptimizer) else opt)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` on unscaled gradients; returns the total norm."""
        parameters = list(parameters)
        self.unscale_gradients()
        return self.backend.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """``torch.nn.utils.clip_grad_value_`` on unscaled gradients."""
        parameters = list(parameters)
        self.unscale_gradients()
        self.backend.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of this Accelerator's mixed precision (a null context without one)."""
        if not self.native_amp:
            return contextlib.nullcontext()
        return autocast_context(self.device, self.mixed_precision, autocast_handler or self.autocast_handler)

    # -- collectives ------------------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` from all processes along dim 0 (unchanged in a single process)."""
        return operations.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather``, minus the samples the sharded loader duplicated to even out the last batch."""
        try:
            operations.recursively_apply(lambda x: x, input_data, error_on_other_type=True)
            all_tensors = True
        except TypeError:
            all_tensors = False
        use_gather_object = use_gather_object or not all_tensors
        # Over the data-parallel processes only: tensor-parallel ones hold the same results (Accelerate gathers
        # them all, counting each tensor-parallel group's samples tp_size times).
        group = self.backend.data_parallel_group()
        if group == "local":
            data = input_data
        else:
            data = (operations.gather_object(input_data, group=group) if use_gather_object
                    else operations.gather(input_data, group=group))
        if not self.gradient_state.end_of_dataloader:
            return data
        remainder = self.gradient_state.remainder
        if remainder <= 0:
            return data  # -1: unknown (nothing to drop that we know of); 0: no padding was added
        if use_gather_object:
            return data[:remainder]
        # A 0-d tensor is only ever left so by a single process's gather, where nothing was padded.
        return operations.first_samples(data, remainder)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce across processes: ``"sum"`` (default), ``"mean"``, ``"max"``, ``"min"``; ``"none"`` is a no-op."""
        return operations.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    # -- memory -----------------------------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[None]:
        """Drop references to everything prepared (registered custom objects stay), collect garbage, reset
        ``step``; returns ``[None] * len(objects)`` to assign back."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def clear(self, *objects: Any) -> list[None]:
        """Alias of ``free_memory``."""
        return self.free_memory(*objects)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's state dict (of the bare module by default).

        Under FSDP2 this is a collective (call it on every rank): the full state is gathered to rank 0, on the CPU,
        and the other ranks get an empty dict (as in Accelerate).
        """
        return self.backend.full_state_dict(self.unwrap_model(model) if unwrap else model)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Ember does not do big-model dispatch: a model never carries a multi-device map."""
        return getattr(model, "hf_device_map", None) is not None and len(set(model.hf_device_map.values())) > 1
