"""What goes into a checkpoint folder, under which name, and how each piece is read back.

File names follow Accelerate's layout so tools that look for them find them. Written by the main process:

* ``model.safetensors``, ``model_1.safetensors`` ... (``pytorch_model.bin`` ... with ``safe_serialization=False``)
* ``optimizer.bin``, ``optimizer_1.bin`` ...: ``optimizer.state_dict()``
* ``scheduler.bin``, ``scheduler_1.bin`` ...: ``scheduler.state_dict()``
* ``scaler.pt``: ``GradScaler.state_dict()``
* ``custom_checkpoint_{i}.pkl``: ``state_dict()`` of the i-th object given to ``register_for_checkpointing``
* ``manifest.json``: size and checksum of every file, step, iteration, world size (``engine.checkpoint.folders``)

Written by each rank ``r`` for itself:

* ``random_states_{r}.pkl``: ``{"step", "rng"}`` with the python, numpy, torch (and CUDA) RNG states
* ``dataloader_{i}_{r}.bin``: the i-th prepared data loader's position (epoch, batches yielded, generators)
* ``gradients_{i}_{r}.safetensors``: model i's accumulated gradients, when saved mid-accumulation

Everything except the registered objects' own values is tensors and plain values, so it loads with
``torch.load(weights_only=True)`` (the ``.pkl`` names are Accelerate's; the content is not a plain pickle).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch

from engine.checkpoint.checksum import CHUNKED, FileRecord
from engine.checkpoint.direct import read_torch_file
from engine.checkpoint.folders import check_file, check_sizes, read_manifest, start_checksums
from engine.checkpoint.io import CheckpointError, load_safetensors, load_torch, save_safetensors, save_torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

SCALER_NAME = "scaler.pt"


def _indexed(stem: str, index: int, extension: str) -> str:
    return f"{stem}{extension}" if index == 0 else f"{stem}_{index}{extension}"


def model_name(index: int, safe_serialization: bool) -> str:
    return _indexed("model", index, ".safetensors") if safe_serialization else _indexed("pytorch_model", index, ".bin")


def optimizer_name(index: int) -> str:
    return _indexed("optimizer", index, ".bin")


def scheduler_name(index: int) -> str:
    return _indexed("scheduler", index, ".bin")


def custom_name(index: int) -> str:
    return f"custom_checkpoint_{index}.pkl"


def rng_name(rank: int) -> str:
    return f"random_states_{rank}.pkl"


def dataloader_name(index: int, rank: int) -> str:
    return f"dataloader_{index}_{rank}.bin"


def gradients_name(index: int, rank: int) -> str:
    return f"gradients_{index}_{rank}.safetensors"


def _join(folder: str, name: str) -> str:
    return os.path.join(folder, name)


# -- saving -------------------------------------------------------------------------------------------------
@dataclass
class CapturedState:
    """What one rank writes into a checkpoint, as ``state_dict()`` values taken at the moment of the save.

    ``weights`` .. ``custom`` (the shared state) are empty on ranks that do not write it. The values may be the
    live tensors (a synchronous save writes them at once) or a snapshot of them (``engine.checkpoint.snapshot``).
    """

    step: int
    rng: Mapping[str, Any]
    dataloaders: dict[int, Any] = field(default_factory=dict)
    gradients: dict[int, Mapping[str, torch.Tensor]] = field(default_factory=dict)
    weights: list[Mapping[str, torch.Tensor]] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scaler: Any = None
    custom: list[Any] = field(default_factory=list)
    safe_serialization: bool = True


def capture_state(*, step: int, rng_state: Mapping[str, Any], models: list[torch.nn.Module],
                  dataloaders: list[Any], shared: bool, weights: list[Mapping[str, torch.Tensor]],
                  optimizers: list[Any], schedulers: list[Any], scaler: Any, custom: list[Any],
                  safe_serialization: bool, gradients: bool = True) -> CapturedState:
    """Collect every ``state_dict()`` a checkpoint holds for this rank (``shared``: also the shared state;
    ``gradients``: also the models' ``.grad``).

    ``custom`` holds the registered objects' states, already taken on every rank (``save_state``).
    """
    state = CapturedState(step=step, rng=dict(rng_state), safe_serialization=safe_serialization)
    for i, loader in enumerate(dataloaders):
        if callable(getattr(loader, "state_dict", None)):
            state.dataloaders[i] = loader.state_dict()
    for i, model in enumerate(models):
        # Mid-accumulation, .grad holds micro-steps not yet applied (and, under DDP, not yet all-reduced):
        # without them a resumed run would take a different optimizer step.
        # An FSDP2 / tensor-parallel gradient is a DTensor: each rank's file holds its own shard (to_local).
        grads = {name: local_gradient(p) for name, p in model.named_parameters() if p.grad is not None} \
            if gradients else {}
        if grads:
            state.gradients[i] = grads
    if shared:
        state.weights = list(weights)
        state.optimizers = [optimizer.state_dict() for optimizer in optimizers]
        state.schedulers = [scheduler.state_dict() for scheduler in schedulers]
        state.scaler = None if scaler is None else scaler.state_dict()
        state.custom = list(custom)
    return state


def write_state(folder: str, pool: Executor, state: CapturedState, rank: int,
                files: Executor | None = None) -> dict[str, FileRecord]:
    """Write ``state`` into ``folder``: this rank's own files, and the shared files if ``state`` holds them.

    ``pool`` hashes and writes back each file's chunks while it is written (``DurableWriter``); with ``files``,
    the files themselves are written concurrently on it (each file is independent, and a disk keeps up better
    with several streams than with one waiting on each write in turn).
    """
    jobs: list[tuple[str, Callable[[], FileRecord]]] = [
        (rng_name(rank), lambda: save_torch({"step": state.step, "rng": dict(state.rng)}, _join(folder, rng_name(rank))))]
    for i, position in state.dataloaders.items():
        jobs.append((dataloader_name(i, rank), partial(save_torch, position, _join(folder, dataloader_name(i, rank)))))
    for i, grads in state.gradients.items():
        jobs.append((gradients_name(i, rank), partial(save_safetensors, grads, _join(folder, gradients_name(i, rank)),
                                                      pool)))
    for i, weights in enumerate(state.weights):
        name = model_name(i, state.safe_serialization)
        if state.safe_serialization:
            jobs.append((name, partial(save_safetensors, weights, _join(folder, name), pool)))
        else:
            # As returned by state_dict(): its `_metadata` (module versions) matters to load_state_dict.
            plain = weights if isinstance(weights, dict) else dict(weights)
            jobs.append((name, partial(save_torch, plain, _join(folder, name), pool)))
    for i, optimizer in enumerate(state.optimizers):
        jobs.append((optimizer_name(i), partial(save_torch, optimizer, _join(folder, optimizer_name(i)), pool)))
    for i, scheduler in enumerate(state.schedulers):
        jobs.append((scheduler_name(i), partial(save_torch, scheduler, _join(folder, scheduler_name(i)))))
    if state.scaler is not None:
        jobs.append((SCALER_NAME, partial(save_torch, state.scaler, _join(folder, SCALER_NAME))))
    for i, custom in enumerate(state.custom):
        jobs.append((custom_name(i), partial(save_torch, custom, _join(folder, custom_name(i)), pool)))
    if files is None:
        return {name: write() for name, write in jobs}
    running = [(name, files.submit(write)) for name, write in jobs]
    return {name: future.result() for name, future in running}  # every one waited for, the first error raised


# -- loading ------------------------------------------------------------------------------------------------
@dataclass
class LoadedCheckpoint:
    """Everything read from a checkpoint folder for this rank, before any of it is applied."""

    folder: str
    manifest: dict[str, Any]
    models: dict[int, Mapping[str, torch.Tensor]] = field(default_factory=dict)
    model_files: dict[int, str] = field(default_factory=dict)
    gradients: dict[int, Mapping[str, torch.Tensor]] = field(default_factory=dict)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scaler: Any = None
    dataloaders: dict[int, Any] = field(default_factory=dict)
    custom: list[Any] = field(default_factory=list)
    rng: Mapping[str, Any] | None = None

    @property
    def world_size(self) -> int:
        return int(self.manifest.get("world_size", 1))


def _to_cpu(map_location: Any) -> bool:
    return map_location is None or str(map_location) == "cpu"


def checked_while_read(manifest: dict[str, Any], *, num_models: int, num_optimizers: int,
                       map_location: Any) -> set[str]:
    """The files ``read_checkpoint(check_while_reading=...)`` can verify, in the pass that reads them.

    Optimizer states (and ``.bin`` weights) bound for CPU with chunked checksums: each chunk is hashed right after
    it is read, from the CPU cache, instead of by a second pass through memory.
    """
    files = manifest["files"]
    if not _to_cpu(map_location):
        return set()
    names = {optimizer_name(i) for i in range(num_optimizers)}
    names |= {model_name(i, False) for i in range(num_models) if model_name(i, True) not in files}
    return {name for name in names if name in files and files[name].algorithm == CHUNKED}


def read_checkpoint(folder: str, manifest: dict[str, Any], *, rank: int, num_models: int, num_optimizers: int,
                    num_schedulers: int, num_dataloaders: int, num_custom: int, allow_unsafe_pickle: bool,
                    map_location: Any, pool: Executor | None = None,
                    check_while_reading: frozenset[str] | set[str] = frozenset()) -> LoadedCheckpoint:
    """Read (without applying) what this rank needs from ``folder``; raises before anything is changed.

    The small, pickled files come first, so a file that needs ``allow_unsafe_pickle`` is reported before the
    large ones are read. Optimizer states (and ``.bin`` weights) bound for CPU are read by ``pool``'s threads
    side by side (``engine.checkpoint.direct.read_torch_file``); the files in ``check_while_reading`` (from
    ``checked_while_read``) are verified as they are read (``CorruptCheckpointError`` if one differs).
    """
    files = manifest["files"]
    loaded = LoadedCheckpoint(folder=folder, manifest=manifest)

    def load(name: str) -> Any:
        return load_torch(_join(folder, name), allow_unsafe_pickle=allow_unsafe_pickle, map_location=map_location)

    def load_large(name: str) -> Any:
        expected = files[name] if name in check_while_reading else None
        read = read_torch_file(_join(folder, name), pool, expected) if _to_cpu(map_location) else None
        if read is not None:
            return read
        if expected is not None:  # declined: check the file the ordinary way before torch.load sees it
            check_file(folder, name, expected)()
        return load(name)

    def required(name: str, what: str) -> str:
        if name not in files:
            raise CheckpointError(f"Checkpoint {folder} has no {name}, but {what}. Load it with the same objects "
                                  "prepared / registered as when it was saved.")
        return name

    saved_custom = sorted(int(n[len("custom_checkpoint_"):-len(".pkl")]) for n in files
                          if n.startswith("custom_checkpoint_") and n.endswith(".pkl"))
    if len(saved_custom) != num_custom:
        raise RuntimeError(f"The number of saved custom objects ({len(saved_custom)}) in {folder} does not match "
                           f"the number of objects registered with register_for_checkpointing ({num_custom}): "
                           "register the same objects, in the same order, as when the checkpoint was saved.")
    loaded.custom = [load(required(custom_name(i), f"{num_custom} objects are registered")) for i in range(num_custom)]
    if rng_name(rank) in files:
        loaded.rng = load(rng_name(rank))
    for i in range(num_dataloaders):
        if dataloader_name(i, rank) in files:
            loaded.dataloaders[i] = load(dataloader_name(i, rank))
    if SCALER_NAME in files:
        loaded.scaler = load(SCALER_NAME)
    loaded.schedulers = [load(required(scheduler_name(i), f"{num_schedulers} schedulers are prepared"))
                         for i in range(num_schedulers)]
    loaded.optimizers = [load_large(required(optimizer_name(i), f"{num_optimizers} optimizers are prepared"))
                         for i in range(num_optimizers)]
    for i in range(num_models):
        for safe in (True, False):
            name = model_name(i, safe)
            if name in files:
                loaded.model_files[i] = name
                loaded.models[i] = load_safetensors(_join(folder, name)) if safe else load_large(name)
                break
        if gradients_name(i, rank) in files:
            loaded.gradients[i] = load_safetensors(_join(folder, gradients_name(i, rank)))
    return loaded


def read_model_weights(folder: str, *, allow_unsafe_pickle: bool = False) -> dict[str, torch.Tensor] | None:
    """Model 0's full weights from ``folder``, or None when it holds none (an FSDP checkpoint of shards).

    ``folder`` is a committed checkpoint (every file's size is checked against the manifest, and the weights
    file's checksum before it is read; a DeepSpeed checkpoint's partitions are all checked, then joined by
    DeepSpeed's ``zero_to_fp32``) or a manifest-less ``save_model`` folder. ``pytorch_model.bin`` is read
    like every checkpoint file: without unpickling anything but tensors unless ``allow_unsafe_pickle``.
    """
    manifest = read_manifest(folder)
    if manifest is not None and "latest" in manifest["files"]:  # DeepSpeed's layout: rebuilt from its partitions
        from engine.backends.deepspeed import is_deepspeed_checkpoint, read_full_weights

        if is_deepspeed_checkpoint(manifest["files"]):
            check_sizes(folder, manifest)
            verify = start_checksums(folder, manifest)
            verify()
            return read_full_weights(folder, allow_unsafe_pickle)
    listed = manifest["files"] if manifest is not None else {
        name: None for name in (model_name(0, True), model_name(0, False)) if os.path.exists(_join(folder, name))}
    name = next((model_name(0, safe) for safe in (True, False) if model_name(0, safe) in listed), None)
    if name is None:
        return None
    if manifest is not None:
        check_sizes(folder, manifest)
        check_file(folder, name, manifest["files"][name])()
    path = _join(folder, name)
    return load_safetensors(path) if name.endswith(".safetensors") else load_torch(
        path, allow_unsafe_pickle=allow_unsafe_pickle)


def local_gradient(param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's part of ``param.grad``, laid out as its part of ``param`` (what ``restore_gradients`` loads).

    A tensor-parallel gradient may come out of backward replicated or pending a sum where the parameter is
    sharded: it is redistributed to the parameter's placements first (a collective, in parameter order on every
    rank)."""
    grad = param.grad
    assert grad is not None
    if not hasattr(grad, "to_local"):
        return grad
    grad = cast("DTensor", grad)  # only a DTensor has to_local
    placements = getattr(param, "placements", None)
    if placements is not None and tuple(grad.placements) != tuple(placements):  # a DTensor parameter
        grad = grad.redistribute(cast("DTensor", param).device_mesh, placements)
    return grad.to_local()


def restore_gradients(model: torch.nn.Module, grads: Mapping[str, torch.Tensor] | None) -> None:
    """Give ``model`` exactly the saved gradients: saved ones copied in, all others set to None."""
    grads = grads or {}
    for name, param in model.named_parameters():
        saved = grads.get(name)
        if saved is None:
            param.grad = None
        elif hasattr(param, "device_mesh"):  # an FSDP2 (DTensor) parameter: the file holds this rank's shard
            from engine.backends.fsdp import set_local_grad

            set_local_grad(param, saved)
        elif saved.shape != param.shape:  # a shard saved by a sharded layout (FSDP2, tensor parallelism)
            from engine.backends.fsdp import gradient_layout_error

            raise gradient_layout_error(name, tuple(saved.shape), tuple(param.shape))
        elif param.grad is not None and param.grad.shape == saved.shape and param.grad.dtype == saved.dtype:
            param.grad.copy_(saved)  # keep the existing tensor: DDP may hold it as a bucket view
        else:
            param.grad = saved.to(device=param.device, dtype=param.dtype, copy=True)
