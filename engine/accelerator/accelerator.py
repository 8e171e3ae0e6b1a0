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
from torch.utils.hooks import RemovableHandle

from engine import operations
from engine.accelerator.checkpointer import Checkpointer
from engine.accelerator.preparer import PrepareOptions, Preparer
from engine.accelerator.process_control import ProcessControl, mesh_rank
from engine.accelerator.registry import PreparedObjects
from engine.backends import Backend, select_backend
from engine.backends.deepspeed_plugin import DeepSpeedPlugin, choose_deepspeed_plugin
from engine.backends.mesh import default_fsdp_plugin, resolve_parallelism
from engine.backends.parallelism_config import ParallelismConfig
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
    resolve_accumulation_plugin,
    sort_kwargs_handlers,
)
from engine.environment import EngineEnvironment
from engine.keywords import suggest_keywords
from engine.precision.fp8 import AORecipeKwargs, Fp8Training
from engine.precision.mixed import (
    autocast_context,
    check_autocast_support,
    make_grad_scaler,
    validate_precision,
)
from engine.prepare.optimizer import AcceleratedOptimizer, unscale_gradients
from engine.prepare.parallel import extract_model_from_parallel
from engine.prepare.scheduler import AcceleratedScheduler
from engine.state import AcceleratorState, DistributedType, GradientState
from engine.tracking.hub import TrackerHub
from engine.tracking.profiler import ProfileKwargs, profile

_NO_CONTEXT = contextlib.nullcontext()  # reusable: accumulate() returns it on every syncing step
_UNSET: Any = object()  # sentinel: "keyword not given" (distinct from an explicit False/None)
_UNSUPPORTED = "Ember supports DDP, FSDP2 (FullyShardedDataParallelPlugin) and DeepSpeed (DeepSpeedPlugin)"


@suggest_keywords
class Accelerator:
    """Prepares models, optimizers, schedulers and data loaders for the current distributed setup and precision.

    A host of owned parts, each with one job, to which its methods delegate: the backend (and its device mesh), the
    registry of what was prepared, the preparer, the checkpointer, the trackers and process control.

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

        handlers = sort_kwargs_handlers(kwargs_handlers or [], (DistributedDataParallelKwargs, GradScalerKwargs,
                                       InitProcessGroupKwargs, AutocastKwargs, ProfileKwargs, AORecipeKwargs))
        self.ddp_handler: DistributedDataParallelKwargs | None = handlers.get(DistributedDataParallelKwargs)
        self.scaler_handler: GradScalerKwargs | None = handlers.get(GradScalerKwargs)
        self.init_handler: InitProcessGroupKwargs | None = handlers.get(InitProcessGroupKwargs)
        self.autocast_handler: AutocastKwargs | None = handlers.get(AutocastKwargs)
        self.profile_handler: ProfileKwargs | None = handlers.get(ProfileKwargs)
        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}

        if fsdp_plugin is None and environment.use_fsdp:
            fsdp_plugin = default_fsdp_plugin()
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

        gradient_accumulation_plugin = resolve_accumulation_plugin(gradient_accumulation_plugin,
                                                                   gradient_accumulation_steps, environment)
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
        self.log_with = log_with
        prepared = self._prepared = PreparedObjects()
        # Accelerate's names for what was prepared (spec: "initial internals"): the registry's own lists, which
        # it only ever empties in place.
        self._models, self._optimizers, self._schedulers = prepared.models, prepared.optimizers, prepared.schedulers
        self._dataloaders, self._custom_objects = prepared.dataloaders, prepared.custom
        self._preparer = Preparer(self.state, prepared, self.gradient_state, self.scaler, self.fp8)
        self._checkpointer = Checkpointer(self.state, self.project_configuration, prepared, self.gradient_state,
                                          self.scaler)
        self._tracker_hub = TrackerHub(log_with, self.logging_dir, self.is_main_process)
        self._processes = ProcessControl(self.state, self._use_distributed)

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
        return self._prepared.optimizer_step_was_skipped

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The ``DeepSpeedPlugin`` (None without DeepSpeed)."""
        return self.state.deepspeed_plugin

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config the engine was built with (set by ``prepare``, as in Accelerate)."""
        if self._preparer.deepspeed_config is None:
            raise AttributeError("'Accelerator' object has no attribute 'deepspeed_config' (set by prepare()).")
        return self._preparer.deepspeed_config

    # -- the device mesh (the backend's) ----------------------------------------------------------------------
    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The ``DeviceMesh`` of the ``ParallelismConfig`` (``None`` without one, or when every size is 1)."""
        return self.backend.mesh

    # This process's place along each dimension of the mesh (0 where that dimension has size 1); context and
    # pipeline parallelism raise: Ember has neither (nor has Accelerate).
    tensor_parallel_rank = mesh_rank("tp")
    data_parallel_rank = mesh_rank("dp_replicate")
    data_parallel_shard_rank = mesh_rank("dp_shard")
    context_parallel_rank = mesh_rank("cp")
    pipeline_parallel_rank = mesh_rank("pp")

    # -- prepare (the preparer's) -----------------------------------------------------------------------------
    def _prepare_options(self) -> PrepareOptions:
        return PrepareOptions(self.backend, self.device_placement, self.dataloader_config, self.rng_types, self.dynamo_backend,
                              self.step_scheduler_with_optimizer, self.native_amp, self.autocast_handler)

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare each object for this setup; returns them in the same order (a bare object if only one)."""
        return self._preparer.prepare(args, device_placement, self._prepare_options())

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Autocast wrapper (mixed precision), device placement, then DDP / FSDP2 and torch.compile."""
        return self._preparer.prepare_model(model, device_placement, self._prepare_options(), evaluation_mode)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          device_placement: bool | None = None) -> AcceleratedOptimizer:
        return self._preparer.prepare_optimizer(optimizer, device_placement, self._prepare_options())

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        return self._preparer.prepare_scheduler(scheduler, self._prepare_options())

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable[..., Any] | None = None) -> DataLoader:
        """Shard ``data_loader`` across processes (see ``engine.data.loader.prepare_data_loader``)."""
        return self._preparer.prepare_data_loader(data_loader, device_placement, self._prepare_options(),
                                                  slice_fn_for_dispatch)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load ``objects`` (anything with ``state_dict`` / ``load_state_dict``) with the checkpoint."""
        self._prepared.register_for_checkpointing(*objects)

    def replace_dataloaders(self, old: list[DataLoader], new: list[DataLoader]) -> None:
        """Checkpoint the prepared loaders ``new`` in the places of ``old`` (a loop that rebuilds its loaders keeps
        a checkpoint's loader numbering: see ``PreparedObjects.replace_dataloaders``); not in Accelerate."""
        self._prepared.replace_dataloaders(old, new)

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
        if self.scaler is not None:
            unscale_gradients(self.scaler, self._prepared.optimizers if optimizer is None else optimizer)

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
        # Over data-parallel processes only (Accelerate counts each tensor-parallel group's samples tp_size times).
        gradient_state = self.gradient_state
        return operations.gather_for_metrics(input_data, use_gather_object, self.backend.data_parallel_group(),
                                             gradient_state.remainder if gradient_state.end_of_dataloader else -1)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce across processes: ``"sum"`` (default), ``"mean"``, ``"max"``, ``"min"``; ``"none"`` is a no-op."""
        return operations.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    # -- memory -----------------------------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[None]:
        """Forget everything prepared (registered objects stay), collect garbage, reset ``step``; ``[None] * n``."""
        self._prepared.clear()
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def clear(self, *objects: Any) -> list[None]:
        """Alias of ``free_memory``."""
        return self.free_memory(*objects)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's state dict (of the bare module by default). Under FSDP2 a collective (call it on every rank):
        gathered to rank 0, on the CPU; the other ranks get an empty dict (as in Accelerate)."""
        return self.backend.full_state_dict(self.unwrap_model(model) if unwrap else model)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Ember does not do big-model dispatch: a model never carries a multi-device map."""
        return len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1

    # -- process control (the ProcessControl's) --------------------------------------------------------------
    @property
    def flag_tensor(self) -> torch.Tensor | None:
        return self._processes.flag_tensor

    @flag_tensor.setter
    def flag_tensor(self, value: torch.Tensor | None) -> None:
        self._processes.flag_tensor = value

    def wait_for_everyone(self) -> None:
        self._processes.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self._processes.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self._processes.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager[Any]:
        return self._processes.split_between_processes(inputs, apply_padding=apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self._processes.print(*args, **kwargs)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._processes.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._processes.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._processes.on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        return self._processes.on_process(function, process_index=process_index)

    def on_local_process(self, function: Callable[..., Any] | None = None,
                         local_process_index: int | None = None) -> Any:
        return self._processes.on_local_process(function, local_process_index=local_process_index)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next ``check_trigger`` returns True on every process."""
        self._processes.set_trigger()

    def check_trigger(self) -> bool:
        """True on all processes if any process called ``set_trigger`` since the last check (then resets it)."""
        return self._processes.check_trigger()

    def join_uneven_inputs(self, joinables: list[Any],
                           even_batches: bool | None = None) -> contextlib.AbstractContextManager[None]:
        """``torch.distributed.algorithms.Join`` over ``joinables`` for uneven inputs (multi-GPU DDP only)."""
        return self._processes.join_uneven_inputs(joinables, self._prepared.dataloaders, even_batches)

    def profile(self, profile_handler: ProfileKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Profile the block with ``torch.profiler``; ``profile_handler`` overrides the Accelerator's."""
        return profile(profile_handler or self.profile_handler, self.process_index, self.wait_for_everyone)

    # -- checkpoints (the Checkpointer's) ---------------------------------------------------------------------
    def save_state(self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True, *,
                   async_save: bool = False, include_gradients: bool = True, local_parts: bool = False,
                   **save_model_func_kwargs: Any) -> str:
        """Save everything needed to resume exactly, committed atomically; see ``Checkpointer.save_state``."""
        return self._checkpointer.save_state(output_dir, safe_serialization, step=self.step, backend=self.backend,
                                             async_save=async_save, include_gradients=include_gradients,
                                             local_parts=local_parts, **save_model_func_kwargs)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, load_kwargs: dict[str, Any] | None = None,
                   *, allow_unsafe_pickle: bool = False, **load_model_func_kwargs: Any) -> str:
        """Restore everything ``save_state`` saved, exactly; returns the folder loaded (``Checkpointer.load_state``)."""
        folder, self.step = self._checkpointer.load_state(input_dir, load_kwargs, backend=self.backend,
                                                          allow_unsafe_pickle=allow_unsafe_pickle, **load_model_func_kwargs)
        return folder

    def state_values(self, *, include_gradients: bool = True) -> dict[str, Any] | None:
        """``save_state``'s content as values on the main process (``Checkpointer.state_values``)."""
        return self._checkpointer.state_values(step=self.step, backend=self.backend, include_gradients=include_gradients)

    def load_state_values(self, values: dict[str, Any], source: str, *, strict: bool = True) -> None:
        """Restore what ``state_values`` returned (``Checkpointer.load_state_values``)."""
        self.step = self._checkpointer.load_state_values(values, source, backend=self.backend, strict=strict)

    def wait_for_checkpoint(self) -> str | None:
        """Block until the asynchronous save in flight (if any) is committed; returns its folder, or None."""
        return self._checkpointer.wait_for_checkpoint()

    @property
    def checkpoint_snapshot_bytes(self) -> int:
        """Host memory held for asynchronous saves (the state's snapshot buffers, reused by every save)."""
        return self._checkpointer.checkpoint_snapshot_bytes

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before the models are written; returns a removable handle."""
        return self._checkpointer.register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before the models are loaded; returns a removable handle."""
        return self._checkpointer.register_load_state_pre_hook(hook)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors) ``obj`` to ``f`` once per machine, replacing ``f`` atomically."""
        self._checkpointer.save(obj, f, safe_serialization)

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str],
                   max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
        """Save the bare model's weights for inference (sharded above ``max_shard_size``)."""
        self._checkpointer.save_model(lambda: self.get_state_dict(model), save_directory, max_shard_size,
                                      safe_serialization)

    # -- trackers (the TrackerHub's) --------------------------------------------------------------------------
    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Start every tracker for ``project_name`` and store ``config`` as the run configuration."""
        self._tracker_hub.init(project_name, config=config, init_kwargs=init_kwargs)

    def log(self, values: dict[str, Any], step: int | None = None,
            log_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Log ``values`` at ``step`` to every tracker (``log_kwargs[tracker_name]`` passed through)."""
        self._tracker_hub.log(values, step=step, log_kwargs=log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its raw run object with ``unwrap``); a blank tracker on other ranks."""
        return self._tracker_hub.get(name, unwrap=unwrap)

    @property
    def trackers(self) -> list[Any]:
        return self._tracker_hub.trackers

    def finish_trackers(self) -> None:
        """Finish every tracker but keep the process group (``end_training`` does both); safe to call twice."""
        self._tracker_hub.finish()

    def tracker_state_dict(self) -> dict[str, dict[str, Any]]:
        """The trackers' run identities by name (JSON-able), for ``load_tracker_state_dict`` after a resume."""
        return self._tracker_hub.state_dict()

    def load_tracker_state_dict(self, states: dict[str, dict[str, Any]]) -> None:
        """Continue the runs ``tracker_state_dict`` named; call before ``init_trackers`` (it raises after)."""
        self._tracker_hub.load_state_dict(states)

    def end_training(self) -> None:
        """Wait for an asynchronous save in flight, finish every tracker, then destroy the process group unless it
        was adopted (Ray Train's, the user's own): its owner still needs it, unlike in Accelerate."""
        try:
            self.wait_for_checkpoint()
        finally:
            self._tracker_hub.finish()
            if not self.state.adopted_process_group:
                self.state.destroy_process_group()
