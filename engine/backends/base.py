"""``Backend``: the behaviour every backend shares, and the seams where one differs (see ``engine.backends``)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.backends.mesh import mesh_rank
from engine.checkpoint.direct import read_into_module
from engine.checkpoint.folders import holds_shards
from engine.checkpoint.io import CheckpointError
from engine.prepare.parallel import unwrap
from engine.state import AcceleratorState, DistributedType

_NO_CONTEXT = contextlib.nullcontext()


@dataclass
class ModelsToSave:
    """What ``save_state`` writes for the models and optimizers, taken by ``Backend.models_to_save``.

    ``weights`` (full state dicts) become ``model.safetensors``..., each of ``optimizers`` has its
    ``state_dict()`` written as ``optimizer.bin``...; with ``sharded`` both lists are empty and the backend writes
    its own files instead (``Backend.write_shards``).
    """

    weights: list[Mapping[str, torch.Tensor]] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    sharded: bool = False


class Backend:
    """How models run here; this base is the behaviour shared by every backend, which override what differs.

    Args:
        state: the process's ``AcceleratorState`` (device, process group, plugins).
    """

    distributed_type: DistributedType = DistributedType.NO
    #: ``prepare`` moves models to the device unless told otherwise (FSDP2 places shards itself).
    places_models: bool = True
    #: ``save_state`` may run between the micro-steps of an accumulation window (not where the gradients
    #: accumulated under ``no_sync`` live in buffers that cannot be saved: FSDP2).
    saves_mid_accumulation: bool = True
    #: Evaluation may run under ``torch.inference_mode`` (not where an evaluation forward gathers parameters
    #: that the next training step must update in place: FSDP2).
    allows_inference_mode: bool = True
    #: ``prepare`` builds the model, optimizer and scheduler together (``DeepSpeed.prepare``), not one by one.
    prepares_jointly: bool = False
    #: The accumulation window is fixed when the backend sets up (DeepSpeed's engine is built with its
    #: ``gradient_accumulation_steps``): a factor that changes during a run cannot be honoured.
    fixes_accumulation_at_setup: bool = False
    #: ``backward`` divides each micro-step's loss by the accumulation steps itself (the caller must not).
    scales_loss: bool = False

    def __init__(self, state: AcceleratorState) -> None:
        self.state = state

    @property
    def mesh(self) -> Any:
        """The ``DeviceMesh`` this backend runs on (a ``ParallelismConfig``'s, built with the process group; None
        without one, or when every size is 1): the tensor-parallel backend splits and shards over it."""
        return self.state.device_mesh

    def mesh_rank(self, dimension: str) -> int:
        """This process's rank along ``dimension`` of the mesh (``"tp"``, ``"dp_replicate"``, ``"dp_shard"``)."""
        return mesh_rank(self.state.parallelism_config, self.mesh, dimension)

    # -- models and optimizers ----------------------------------------------------------------------------------
    def wrap_model(self, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> torch.nn.Module:
        """``model`` made ready to train here (``optimizers``: those prepared earlier, which may need to follow
        its parameters). One process: the model itself."""
        return model

    def configure_training(self, *, accumulation_steps: int, micro_batch_size: int | None, clip_value: float | None,
                           clip_algorithm: str) -> None:
        """Told by a training loop that owns these settings (the Trainer) before it prepares its objects: most
        backends need nothing (DeepSpeed writes them into its config)."""

    def data_shard(self) -> tuple[int, int]:
        """``(how many different batches one step sees, which of them is this process's)``: one per process,
        unless processes share batches (tensor parallelism)."""
        return self.state.num_processes, self.state.process_index

    def data_parallel_group(self) -> Any:
        """The process group ``gather_for_metrics`` gathers over: ``None`` for every process, ``"local"`` when this
        process already holds every data-parallel result."""
        return None

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]) -> None:
        """Make ``optimizer`` update the parameters ``models`` train with (after ``wrap_model``)."""

    def unwrap(self, model: Any, keep_torch_compile: bool = True) -> Any:
        """The user's module inside what ``wrap_model`` (or DDP / DataParallel elsewhere) put around it."""
        return unwrap(model, keep_torch_compile=keep_torch_compile)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s complete state dict (a collective where parameters are sharded: every rank calls it)."""
        if _holds_dtensors([model]):  # split by the user (parallelize_module on a mesh of one, in configure_model)
            from engine.backends.fsdp import full_state_dict

            return full_state_dict(model)
        return model.state_dict()

    # -- the training step --------------------------------------------------------------------------------------
    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Accumulate gradients locally inside the block (nothing to pause in one process)."""
        return _NO_CONTEXT

    @contextlib.contextmanager
    def sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward synchronise gradients even inside ``no_sync`` (nothing to do here)."""
        yield

    def backward(self, loss: torch.Tensor, scaler: Any, sync: bool = True, **kwargs: Any) -> None:
        """``loss.backward()``, scaled by ``scaler`` (fp16) when there is one; ``sync``: this micro-step closes the
        accumulation window (a backend that steps inside backward needs it)."""
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
        """Clip the (unscaled) gradients to a total norm; returns the norm before clipping, as a plain tensor."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: list[torch.Tensor], clip_value: float) -> None:
        """Clamp every (unscaled) gradient element to ``[-clip_value, clip_value]``."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def models_to_save(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                       sync_gradients: bool) -> ModelsToSave:
        """What ``save_state`` writes for ``models`` and ``optimizers`` (a collective: every rank calls it).

        Full weights and optimizer states, unless an FSDP plugin asks for ``SHARDED_STATE_DICT``: then models and
        optimizers are written as ``torch.distributed.checkpoint`` shards (by any number of processes, one
        included, so every run of a script writes the layout the others read).
        """
        plugin = self.state.fsdp_plugin
        if plugin is None and _holds_dtensors(models):
            # DTensor parameters the user made (tensor parallelism on a mesh of one process): written as
            # torch.distributed.checkpoint shards, as the tensor-parallel backend writes them, so they load anywhere.
            return ModelsToSave(sharded=True)
        if plugin is None:
            return ModelsToSave(weights=[self.full_state_dict(model) for model in models],
                                optimizers=list(optimizers))
        from engine.backends import (
            fsdp_checkpoint,  # torch.distributed.checkpoint: imported only with a plugin
        )

        sharded, to_save = fsdp_checkpoint.prepare_save(plugin, models, optimizers, sync_gradients)
        if sharded:
            return ModelsToSave(sharded=True)
        return ModelsToSave(weights=[self.full_state_dict(model) for model in models], optimizers=to_save)

    def write_shards(self, folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                     rank: int) -> list[str]:
        """Write this rank's shards into ``folder`` (when ``models_to_save`` said so); returns their paths."""
        from engine.backends import fsdp_checkpoint

        return fsdp_checkpoint.save_shards(folder, models, optimizers, rank)

    def write_shards_async(self, folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                           rank: int, channel: Callable[[str], tuple[Any, Any]]) -> Callable[[], list[str]]:
        """``write_shards`` in the background; the returned function waits for it and gives the files."""
        from engine.backends import fsdp_checkpoint

        return fsdp_checkpoint.async_save_shards(folder, models, optimizers, rank, channel)

    def load_models(self, folder: str, manifest: Mapping[str, Any], weights: Mapping[int, Any],
                    weight_files: Mapping[int, str], models: Sequence[torch.nn.Module], optimizer_states: list[Any],
                    optimizers: Sequence[Any], owners: Sequence[torch.nn.Module], strict: bool,
                    pool: Executor | None, allow_unsafe_pickle: bool = False) -> None:
        """Load what ``load_state`` read into the live models and optimizers.

        ``weights[i]`` / ``weight_files[i]`` are model ``i``'s full state and its file, ``optimizer_states`` the
        optimizers' states; a checkpoint of FSDP shards (any number of processes may have written it) is read
        from ``folder`` here instead, into sharded models or not. ``owners`` are every prepared model (the
        optimizers' parameters are named within them).
        """
        if holds_shards(manifest):  # the portable layout; the reader refuses a backend's own (DeepSpeed's)
            from engine.backends import fsdp_checkpoint

            fsdp_checkpoint.load_shards(folder, manifest, models, optimizers, owners, strict=strict)
            return
        for i, model in enumerate(models):
            if i not in weights:
                raise CheckpointError(f"Checkpoint {folder} has no weights for model {i} (model.safetensors / "
                                      "pytorch_model.bin): prepare the same models as when it was saved.")
            self._load_weights(model, weights[i], os.path.join(folder, weight_files[i]), strict, pool)
        for optimizer, state in zip(optimizers, optimizer_states):
            self._load_optimizer(optimizer, state, owners)

    def _load_weights(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor], path: str, strict: bool,
                      pool: Executor | None) -> None:
        # Safetensors weights are read straight into the parameters when the layout allows (no second copy).
        if not (path.endswith(".safetensors") and read_into_module(model, path, strict, pool)):
            model.load_state_dict(state, strict=strict)

    def _load_optimizer(self, optimizer: Any, state: Any, owners: Sequence[torch.nn.Module]) -> None:
        optimizer.load_state_dict(state)


def _holds_dtensors(models: Sequence[torch.nn.Module]) -> bool:
    """Whether any of ``models`` has DTensor parameters (never, until something imported DTensor)."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from engine.backends.fsdp import holds_dtensors

    return any(holds_dtensors(model) for model in models)
