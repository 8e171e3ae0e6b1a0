"""``DeepSpeed``: ZeRO stages 0-3 (optionally offloading optimizer states and parameters to the CPU) through the
real ``deepspeed`` engine, driven the way Accelerate drives it, inside Ember's checkpoint protocol.

``prepare`` hands the model, the optimizer (or ``DummyOptim``) and a DeepSpeed-owned scheduler to
``deepspeed.initialize`` together, with the plugin's config once its ``"auto"`` values are filled. Each
``backward`` tells the engine whether this micro-step closes the accumulation window, runs the engine's backward
(which divides the loss by the window itself) and, on the window's last micro-step, ``engine.step()``: clipping
(the config's ``gradient_clipping``), the optimizer step, zeroing. The optimizer the user holds is a wrapper whose
``step`` / ``zero_grad`` do nothing, as in Accelerate.

Checkpoints keep DeepSpeed's own layout (``latest``, ``pytorch_model/*_model_states.pt`` and
``*_optim_states.pt``, ``zero_to_fp32.py``), written by ``engine.save_checkpoint`` into Ember's temporary folder,
so the folder is checksummed and committed atomically like any other and DeepSpeed's tools read it. DeepSpeed
reads its files with full unpickling; Ember gives the engine a checkpoint reader that loads them with
``torch.load(weights_only=True)`` and the few DeepSpeed classes they hold (``SAFE_GLOBALS``) allowed, unless the
caller opts in with ``load_state(..., allow_unsafe_pickle=True)``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import torch

from engine.backends.base import Backend, ModelsToSave
from engine.backends.deepspeed_groups import track_engine
from engine.backends.deepspeed_plugin import DeepSpeedPlugin, DummyOptim, DummyScheduler
from engine.checkpoint.io import CheckpointError, fsync_dir
from engine.logging import get_logger
from engine.prepare.optimizer import AcceleratedOptimizer
from engine.state import AcceleratorState, DistributedType, process_group_of_one

TAG = "pytorch_model"  # Accelerate's tag for the first model: {folder}/pytorch_model/..., `latest` names it
_NO_CONTEXT = contextlib.nullcontext()


def import_deepspeed() -> Any:
    """``import deepspeed``, or a clear error naming the extra to install."""
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(f"DeepSpeed was asked for (deepspeed_plugin=, strategy='deepspeed...', --use_deepspeed) "
                          f"but the deepspeed package is not installed ({error}): pip install "
                          "\"ember-train[deepspeed]\".") from None
    return deepspeed


def safe_globals() -> list[Any]:
    """The classes DeepSpeed's checkpoint files hold besides tensors and plain values (observed with DeepSpeed
    0.19.8: the optimizer states' loss scaler, the ZeRO stage enum and the fragment addresses)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer a user holds under DeepSpeed: the engine steps and zeroes it in ``backward``, so ``step`` and
    ``zero_grad`` do nothing here (Accelerate's name and behaviour)."""

    def __init__(self, optimizer: Any, engine: Any) -> None:
        super().__init__(optimizer, device_placement=False)
        self.engine = engine

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        return None

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        return None

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine's last step was skipped (fp16 overflow)."""
        return not self.engine.was_step_applied()


class DeepSpeedSchedulerWrapper:
    """A scheduler DeepSpeed steps inside ``engine.step()`` (from the config or ``lr_scheduler_callable``):
    ``step()`` here does nothing (Accelerate's name and behaviour)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)


@dataclass
class Prepared:
    """What ``DeepSpeed.prepare`` made of one ``Accelerator.prepare`` call's model, optimizer and scheduler."""

    engine: Any
    optimizer: DeepSpeedOptimizerWrapper | None
    scheduler: Any  # a DeepSpeedSchedulerWrapper, the user's torch scheduler (the Accelerator wraps it), or None
    deepspeed_scheduler: bool  # the scheduler is stepped by DeepSpeed


class DeepSpeed(Backend):
    """ZeRO through ``deepspeed.initialize``; see the module docstring.

    Args:
        state: the process's state (its ``distributed_type`` is ``DEEPSPEED``).
        plugin: the ``DeepSpeedPlugin`` with the config.
    """

    distributed_type = DistributedType.DEEPSPEED
    places_models = False  # deepspeed.initialize moves (and under ZeRO-3 partitions) the parameters itself
    saves_mid_accumulation = False  # the engine keeps accumulated (partitioned) gradients in its own buffers
    allows_inference_mode = False  # ZeRO-3 gathers parameters in forward; they must stay trainable
    prepares_jointly = True  # model, optimizer and scheduler are given to deepspeed.initialize together
    scales_loss = True  # the engine divides each micro-step's loss by the accumulation steps itself
    fixes_accumulation_at_setup = True  # deepspeed.initialize takes gradient_accumulation_steps once

    def __init__(self, state: AcceleratorState, plugin: DeepSpeedPlugin) -> None:
        super().__init__(state)
        self.deepspeed = import_deepspeed()
        self.plugin = plugin
        self.engine: Any = None
        self._configured_steps: int | None = None  # the window a training loop set (configure_training)
        process_group_of_one(state.device)  # DeepSpeed needs a process group even for one process

    # -- prepare ----------------------------------------------------------------------------------------------
    def configure_training(self, *, accumulation_steps: int, micro_batch_size: int | None, clip_value: float | None,
                           clip_algorithm: str) -> None:
        """What a training loop that owns these settings (the Trainer) fills in the config before ``prepare``,
        as Lightning's DeepSpeedStrategy does: the accumulation window, the micro batch, norm clipping (0: none).
        Keys the user's config sets explicitly are kept."""
        if clip_value and clip_algorithm != "norm":
            raise ValueError(f"Trainer(gradient_clip_algorithm={clip_algorithm!r}) under DeepSpeed: the engine clips "
                             "by norm only (the config's gradient_clipping). Use gradient_clip_algorithm='norm'.")
        self.plugin.fill({"gradient_accumulation_steps": accumulation_steps,
                          "train_micro_batch_size_per_gpu": micro_batch_size or 1,
                          "gradient_clipping": float(clip_value or 0.0)})
        self._configured_steps = accumulation_steps

    def accumulation_steps(self, requested: int) -> int:
        """The accumulation steps the engine will use: the config's, its ``"auto"`` filled with ``requested``
        (the Accelerator's); a config that says otherwise wins, with Accelerate's warning."""
        self.plugin.fill({"gradient_accumulation_steps": requested})
        steps = int(self.plugin.get_value("gradient_accumulation_steps"))
        if steps != requested and steps != self._configured_steps:
            get_logger(__name__).warning(
                f"Gradient accumulation steps mismatch: GradientAccumulationPlugin has {requested}, DeepSpeed config "
                f"has {steps}. Using DeepSpeed's value.", main_process_only=False)
        return steps

    def prepare(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, loaders: Sequence[Any], *,
                num_processes: int, split_batches: bool) -> Prepared:
        """Check the objects against the config, fill its ``"auto"`` values and build the engine.

        ``loaders`` are the DataLoaders of the same ``prepare`` call (as given): their batch size is the
        config's ``"auto"`` micro batch.
        """
        if self.engine is not None:
            raise AssertionError("You can't use same `Accelerator()` instance with multiple models when using "
                                 "DeepSpeed")
        config = self.plugin.deepspeed_config
        _check_objects(config, optimizer, scheduler)
        self.plugin.fill_auto(micro_batch_size=self._micro_batch_size(loaders, num_processes, split_batches),
                              gradient_accumulation_steps=int(self.plugin.get_value("gradient_accumulation_steps")),
                              num_processes=num_processes, split_batches=split_batches, model=model,
                              optimizer=optimizer, scheduler=scheduler)
        _check_offload(config, optimizer)
        kwargs: dict[str, Any] = {"model": model, "config_params": config}
        deepspeed_scheduler = False
        if isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
            if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None:
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        elif optimizer is not None:
            kwargs["optimizer"] = optimizer
            if scheduler is not None and type(scheduler).__name__ in self._deepspeed_schedules():
                kwargs["lr_scheduler"] = scheduler
        engine, ds_optimizer, _, ds_scheduler = self.deepspeed.initialize(**kwargs)
        self.engine = engine
        track_engine(engine)  # its references to the process groups go when the engine destroys them
        prepared_optimizer = DeepSpeedOptimizerWrapper(ds_optimizer, engine) if ds_optimizer is not None else None
        prepared_scheduler: Any = scheduler
        if scheduler is not None and ds_scheduler is not None:
            prepared_scheduler, deepspeed_scheduler = DeepSpeedSchedulerWrapper(ds_scheduler), True
        return Prepared(engine, prepared_optimizer, prepared_scheduler, deepspeed_scheduler)

    def _micro_batch_size(self, loaders: Sequence[Any], num_processes: int, split_batches: bool) -> int | None:
        """The micro batch for the config's ``"auto"``: the loaders' batch size (the smallest by default)."""
        plugin = self.plugin
        if not plugin.is_auto("train_micro_batch_size_per_gpu"):
            return plugin.get_value("train_micro_batch_size_per_gpu")
        where = ("`AcceleratorState().deepspeed_plugin.deepspeed_config['train_micro_batch_size_per_gpu']`.")
        if not loaders:
            raise ValueError("When using DeepSpeed, `accelerate.prepare()` requires you to pass at least one of "
                             "training or evaluation dataloaders with `batch_size` attribute returning an integer "
                             "value or alternatively set an integer value in `train_micro_batch_size_per_gpu` in the "
                             f"deepspeed config file or assign integer value to {where}")
        sizes = [loader.batch_size for loader in loaders]
        if any(size is None for size in sizes):
            raise ValueError("At least one of the dataloaders passed to `accelerate.prepare()` has `None` as batch "
                             "size. Please set an integer value in `train_micro_batch_size_per_gpu` in the deepspeed "
                             f"config file or assign integer value to {where}")
        if split_batches:
            sizes = [size // num_processes for size in sizes]
        return min(sizes) if plugin.is_train_batch_min else max(sizes)

    def _deepspeed_schedules(self) -> Sequence[str]:
        from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES

        return VALID_LR_SCHEDULES

    def unwrap(self, model: Any, keep_torch_compile: bool = True) -> Any:
        if isinstance(model, self.deepspeed.DeepSpeedEngine):
            model = model.module
        return super().unwrap(model, keep_torch_compile)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full weights: under ZeRO-3 gathered (16-bit) to rank 0 (None on the others), else every rank's."""
        engine = self.engine
        if engine is None or self.unwrap(model) is not engine.module:
            return model.state_dict()
        if engine.zero_optimization_stage() == 3:
            if not self.plugin.get_value("zero_optimization.stage3_gather_16bit_weights_on_model_save", False):
                raise ValueError("Cannot get 16bit model weights because `stage3_gather_16bit_weights_on_model_save` "
                                 "in DeepSpeed config is False. To save the model weights in 16bit, set "
                                 "`stage3_gather_16bit_weights_on_model_save` to True in DeepSpeed config file or "
                                 "set `zero3_save_16bit_model` to True when using `accelerate config`. To save the "
                                 "full checkpoint, run `model.save_checkpoint(save_dir)` and use `zero_to_fp32.py` "
                                 "to recover weights.")
            return engine._zero3_consolidated_16bit_state_dict()  # None on every rank but 0, as in Accelerate
        return {name: tensor.clone() for name, tensor in engine.module.state_dict().items()}

    # -- the training step ------------------------------------------------------------------------------------
    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        return _NO_CONTEXT  # the engine holds back the reduction until the boundary it is told about

    def backward(self, loss: torch.Tensor, scaler: Any, sync: bool = True, **kwargs: Any) -> None:
        engine = self.engine
        if engine is None:
            raise RuntimeError("backward() under DeepSpeed needs a prepared model: call accelerator.prepare(model, "
                               "optimizer, ...) first.")
        engine.set_gradient_accumulation_boundary(is_boundary=sync)
        engine.backward(loss, **kwargs)
        if sync:
            engine.step()

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> Any:
        """The engine's global gradient norm of its latest step (it clips with the config's
        ``gradient_clipping`` inside ``engine.step()``; ``max_norm`` is not used, as in Accelerate)."""
        if self.engine is None:
            return None
        norm = self.engine.get_global_grad_norm()  # a tensor under ZeRO 1/2, a float under 3; None before a step
        return float(norm) if isinstance(norm, torch.Tensor) else norm

    def clip_grad_value_(self, parameters: list[torch.Tensor], clip_value: float) -> None:
        raise RuntimeError("DeepSpeed and FSDP  do not support `clip_grad_value_`. Use `clip_grad_norm_` instead.")

    # -- checkpoints --------------------------------------------------------------------------------------------
    def models_to_save(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                       sync_gradients: bool) -> ModelsToSave:
        if self.engine is None:
            return super().models_to_save(models, optimizers, sync_gradients)
        if not sync_gradients:
            raise ValueError("save_state() was called in the middle of gradient accumulation under DeepSpeed: the "
                             "engine keeps the accumulated gradients in buffers that cannot be saved, so the resumed "
                             "run would differ. Save after an optimizer step (when accelerator.sync_gradients is "
                             "True).")
        return ModelsToSave(sharded=True)

    def write_shards(self, folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                     rank: int) -> list[str]:
        """``engine.save_checkpoint`` into ``folder`` (a collective); returns the files this rank wrote, fsynced."""
        self.engine.save_checkpoint(folder, tag=TAG, client_state={}, save_latest=True)
        mine = f"zero_pp_rank_{rank}_"
        written = []
        for root, _, names in os.walk(folder):
            for name in names:
                relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
                # Each rank's own partitions carry its rank in the name; the rest is written by rank 0.
                if mine in name or (rank == 0 and "zero_pp_rank_" not in name):
                    written.append(relative)
        for relative in written:
            with open(os.path.join(folder, relative), "rb+") as handle:
                os.fsync(handle.fileno())  # DeepSpeed's torch.save does not; the commit renames only what is durable
        fsync_dir(os.path.join(folder, TAG))
        return sorted(written)

    def write_shards_async(self, folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                           rank: int, channel: Callable[[str], tuple[Any, Any]]) -> Callable[[], list[str]]:
        # The engine saves from the training thread only (its save is collective and reads live buffers): written
        # now; the rest of the checkpoint (RNG, data positions, the commit) still goes in the background.
        written = self.write_shards(folder, models, optimizers, rank)
        return lambda: written

    def load_models(self, folder: str, manifest: Mapping[str, Any], weights: Mapping[int, Any],
                    weight_files: Mapping[int, str], models: Sequence[torch.nn.Module], optimizer_states: list[Any],
                    optimizers: Sequence[Any], owners: Sequence[torch.nn.Module], strict: bool,
                    pool: Executor | None, allow_unsafe_pickle: bool = False) -> None:
        if self.engine is None or not is_deepspeed_checkpoint(manifest["files"]):
            raise CheckpointError(f"Checkpoint {folder} was not written by a DeepSpeed run (no {TAG}/ folder), or "
                                  "no model was prepared: prepare the model, optimizer and scheduler as when it was "
                                  "saved, under the same DeepSpeed config.")
        self.engine.checkpoint_engine = _SafeReader(self.engine.checkpoint_engine, allow_unsafe_pickle)
        path, _ = self.engine.load_checkpoint(folder, tag=TAG, load_module_strict=strict, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load the checkpoint in {folder} (tag {TAG!r}).")


def is_deepspeed_checkpoint(files: Any) -> bool:
    """Whether a checkpoint's files (a manifest's names) are DeepSpeed's layout."""
    return "latest" in files and any(str(name).startswith(f"{TAG}/") for name in files)


def read_full_weights(folder: str, allow_unsafe_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The full fp32 weights of a DeepSpeed checkpoint folder, rebuilt from its ZeRO partitions by DeepSpeed's
    own ``zero_to_fp32`` (any stage, any number of processes that wrote it).

    DeepSpeed's reader unpickles its files fully: each is first checked to hold nothing but tensors, plain values
    and ``safe_globals()`` (the globals its pickle references), unless ``allow_unsafe_pickle``.
    """
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from engine.checkpoint.io import UnsafeCheckpointError

    if not allow_unsafe_pickle:
        allowed = {f"{cls.__module__}.{cls.__qualname__}" for cls in safe_globals()}
        for root, _, names in os.walk(os.path.join(folder, TAG)):
            for name in names:
                path = os.path.join(root, name)
                unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - allowed
                if unsafe:
                    raise UnsafeCheckpointError(f"{path} references {sorted(unsafe)}, beyond tensors, plain values "
                                                "and DeepSpeed's own classes: load it with allow_unsafe_pickle=True "
                                                "(weights_only=False) only if you trust it.")
    state = get_fp32_state_dict_from_zero_checkpoint(folder, tag=TAG)
    return {name: tensor.detach().clone() for name, tensor in state.items()}


class _SafeReader:
    """DeepSpeed's checkpoint engine, but reading with ``torch.load(weights_only=True)`` and ``safe_globals()``
    (full unpickling only with ``allow_unsafe_pickle``)."""

    def __init__(self, inner: Any, allow_unsafe_pickle: bool) -> None:
        self._inner = getattr(inner, "_inner", inner)
        self._unsafe = allow_unsafe_pickle

    def load(self, path: str, map_location: Any = None) -> Any:
        from engine.checkpoint.io import UnsafeCheckpointError

        if self._unsafe:
            return torch.load(path, map_location=map_location, weights_only=False)
        try:
            with torch.serialization.safe_globals(safe_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as error:
            if "weights_only" not in str(error) and "Unsupported global" not in str(error):
                raise
            raise UnsafeCheckpointError(f"{path} holds objects beyond tensors, plain values and DeepSpeed's own "
                                        f"classes ({str(error).splitlines()[0]}). Load it with "
                                        "load_state(..., allow_unsafe_pickle=True) only if you trust it.") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _check_objects(config: Mapping[str, Any], optimizer: Any, scheduler: Any) -> None:
    """Accelerate's checks of the optimizer and scheduler against the config, with its messages."""
    if optimizer is not None:
        if "optimizer" in config and not isinstance(optimizer, DummyOptim):
            raise ValueError("You cannot specify an optimizer in the config file and in the code at the same time. "
                             "Please remove the optimizer from the config file or create `accelerate.utils.DummyOptim`"
                             " in the code.")
        if "optimizer" not in config and isinstance(optimizer, DummyOptim):
            raise ValueError("You cannot create a `DummyOptim` without specifying an optimizer in the config file.")
    if scheduler is not None:
        if "scheduler" in config and not isinstance(scheduler, DummyScheduler):
            raise ValueError("You cannot specify a scheduler in the config file and in the code at the same time. "
                             "Please remove the scheduler from the config file or create "
                             "`accelerate.utils.DummyScheduler` in the code.")
        if "scheduler" not in config and isinstance(scheduler, DummyScheduler) and \
                scheduler.lr_scheduler_callable is None:
            raise ValueError("Either specify a scheduler in the config file or pass in the `lr_scheduler_callable` "
                             "parameter when using `accelerate.utils.DummyScheduler`.")
    if isinstance(optimizer, DummyOptim) and scheduler is not None and not isinstance(scheduler, DummyScheduler):
        raise ValueError("You can only specify `accelerate.utils.DummyScheduler` in the code when using "
                         "`accelerate.utils.DummyOptim`.")


def _check_offload(config: Mapping[str, Any], optimizer: Any) -> None:
    """Optimizer offload with a torch optimizer needs ``zero_force_ds_cpu_optimizer: false`` (Ember does not swap
    the optimizer for DeepSpeed's compiled CPU Adam, as Accelerate does: building that op takes minutes)."""
    offload = config["zero_optimization"].get("offload_optimizer", {}).get("device", "none")
    if offload != "none" and isinstance(optimizer, torch.optim.Optimizer) and \
            config.get("zero_force_ds_cpu_optimizer", True) is not False:
        raise ValueError(f"DeepSpeed offloads the optimizer states to {offload!r}, and the optimizer is "
                         f"{type(optimizer).__name__}, a torch optimizer: DeepSpeed refuses that pairing unless the "
                         "config says \"zero_force_ds_cpu_optimizer\": false (then the torch optimizer steps on the "
                         "CPU copy). Set it in the config (plugin.deepspeed_config[\"zero_force_ds_cpu_optimizer\"] = "
                         "False), or pass deepspeed.ops.adam.DeepSpeedCPUAdam (a compiled op) as the optimizer.")
