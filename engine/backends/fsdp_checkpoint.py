"""Checkpoint I/O for FSDP2 models: sharded (torch.distributed.checkpoint) and full (gathered on rank 0).

Sharded: every rank writes its own shards of each model and optimizer into one folder per object
(``pytorch_model_fsdp_{i}/``, ``optimizer_{i}/``, Accelerate's names) with ``torch.distributed.checkpoint``
(DCP). DCP reshards on load, so a checkpoint saved by N processes loads on M, including a single process with
a plain model. These folders sit inside the checkpoint's temporary folder and are committed with it.

DCP itself unpickles its ``.metadata`` file and its non-tensor values with full unpickling; here both are read
through restricted loaders (an allow-list of DCP's own metadata classes, and ``torch.load(weights_only=True)``),
so loading a checkpoint never runs code stored in it.

Full: the optimizer state is gathered to rank 0 and converted to the ordinary ``optimizer.state_dict()`` layout
(parameters numbered in ``param_groups`` order), so the files are the ones a single process writes and reads.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import pickle
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from engine.backends.fsdp import at_rest
from engine.checkpoint.io import CheckpointError, UnsafeCheckpointError

METADATA_FILE = ".metadata"
_SAFE_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                 "torch.distributed.checkpoint.planner")
_SAFE_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                 ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                 ("pathlib", "PureWindowsPath"), ("pathlib", "Path")}


def sharded_model_dir(index: int) -> str:
    """Folder name of model ``index``'s shards inside a checkpoint."""
    return f"pytorch_model_fsdp_{index}"


def sharded_optimizer_dir(index: int) -> str:
    """Folder name of optimizer ``index``'s shards inside a checkpoint."""
    return f"optimizer_{index}"


def is_sharded_checkpoint(folder: str, index: int = 0) -> bool:
    """Whether ``folder`` holds model ``index`` as DCP shards."""
    return os.path.isfile(os.path.join(folder, sharded_model_dir(index), METADATA_FILE))


# -- loading without unpickling code ------------------------------------------------------------------------
class _MetadataUnpickler(pickle.Unpickler):
    """Rebuilds DCP's ``Metadata`` from its pickle, refusing every global that is not part of it."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _SAFE_MODULES:
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and found.__module__ == module:
                return found
        elif (module, name) in _SAFE_GLOBALS:
            return getattr(importlib.import_module(module), name)
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"The checkpoint metadata refers to {module}.{name}, which "
                                     "torch.distributed.checkpoint metadata never contains: refusing to unpickle "
                                     "it, since unpickling can run code. Only load sharded checkpoints written by "
                                     "Ember or torch.distributed.checkpoint.")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is read with ``_MetadataUnpickler`` instead of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} does not hold torch.distributed.checkpoint Metadata.")
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


def _safe_load_bytes(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
    # DCP stores non-tensor values (learning rates, betas, param names) with torch.save: weights_only reads them.
    loaded = torch.load(value, weights_only=True)
    if planner.flatten_state_dict:
        from torch.distributed.checkpoint._nested_dict import set_element

        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` reading non-tensor values with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _safe_load_bytes(self, read_item, value)


class _SafeEmptyLoadPlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _safe_load_bytes(self, read_item, value)


# -- sharded save / load (collectives: every rank calls them) -----------------------------------------------
def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    # DCP warns on every single-process save / load; here that is intended (a 1-process run), not a mistake.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


@contextlib.contextmanager
def _as_checkpoint_errors(path: str) -> Iterator[None]:
    """Re-raise DCP's ``CheckpointException`` (a ``BaseException``, which ``except Exception`` would miss) as a
    ``CheckpointError`` naming the first failing rank."""
    try:
        yield
    except CheckpointException as err:
        rank, (cause, _) = min(err.failures.items(), key=lambda item: item[0])
        detail = f"{type(cause).__name__}: {cause}"
        raise CheckpointError(f"torch.distributed.checkpoint failed on {path} (rank {rank}): {detail}") from err


def _write(state: dict[str, Any], path: str) -> None:
    writer = FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=1)
    with _quiet_single_process(), _as_checkpoint_errors(path):
        dcp.save(state, storage_writer=writer, no_dist=_no_dist())


def _check_metadata(path: str) -> None:
    """Read the metadata once up front, so a refused unpickle is reported plainly rather than through DCP."""
    if not os.path.isfile(os.path.join(path, METADATA_FILE)):
        raise FileNotFoundError(f"{path} is not a sharded checkpoint folder (no {METADATA_FILE}): it was not saved "
                                "with FullyShardedDataParallelPlugin(state_dict_type='SHARDED_STATE_DICT').")
    try:
        SafeFileSystemReader(path).read_metadata()
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(f"{path}: {err}") from None


def _read(state: dict[str, Any], path: str, strict: bool = True) -> None:
    _check_metadata(path)
    planner = SafeLoadPlanner(allow_partial_load=not strict)
    with _quiet_single_process(), _as_checkpoint_errors(path):
        dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=planner, no_dist=_no_dist())


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer keeps the real one inside


def owner_model(optimizer: Any, models: Sequence[torch.nn.Module]) -> torch.nn.Module:
    """The model whose parameters ``optimizer`` updates (DCP names optimizer state by parameter name)."""
    wanted = {id(p) for group in _inner(optimizer).param_groups for p in group["params"]}
    for model in models:
        if wanted <= {id(p) for p in model.parameters()}:
            return model
    raise ValueError(f"The optimizer {type(_inner(optimizer)).__name__} updates parameters that do not all belong "
                     f"to one prepared model ({len(models)} prepared); sharded checkpoints store optimizer state by "
                     "parameter name within one model. Use one optimizer per model.")


def save_sharded(folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any]) -> list[str]:
    """Write each model's and optimizer's shards under ``folder``; returns the folder names written."""
    written = []
    at_rest(*models)
    for i, model in enumerate(models):
        _write(dict(get_model_state_dict(model)), os.path.join(folder, sharded_model_dir(i)))
        written.append(sharded_model_dir(i))
    for i, optimizer in enumerate(optimizers):
        owner = owner_model(optimizer, models)
        _write(dict(get_optimizer_state_dict(owner, _inner(optimizer))),
               os.path.join(folder, sharded_optimizer_dir(i)))
        written.append(sharded_optimizer_dir(i))
    return written


def load_sharded_model(folder: str, index: int, model: torch.nn.Module, strict: bool = True) -> None:
    """Load model ``index``'s shards from ``folder`` into ``model`` (sharded or not, any number of ranks)."""
    at_rest(model)
    state = dict(get_model_state_dict(model))
    _read(state, os.path.join(folder, sharded_model_dir(index)), strict=strict)
    set_model_state_dict(model, state, options=StateDictOptions(strict=strict))


def load_sharded_optimizer(folder: str, index: int, optimizer: Any, models: Sequence[torch.nn.Module]) -> None:
    """Load optimizer ``index``'s shards from ``folder`` into ``optimizer`` (any number of ranks)."""
    owner = owner_model(optimizer, models)
    at_rest(owner)
    # get_optimizer_state_dict creates the lazily built state (zero steps) so DCP has tensors to fill.
    state = dict(get_optimizer_state_dict(owner, _inner(optimizer)))
    _read(state, os.path.join(folder, sharded_optimizer_dir(index)))
    set_optimizer_state_dict(owner, _inner(optimizer), state)


def read_sharded_model(path: str) -> dict[str, torch.Tensor]:
    """The full tensors of a sharded model folder, read in this process alone (no process group needed).

    This is how a sharded checkpoint becomes one file: ``save_safetensors(read_sharded_model(dir), path)``.
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _check_metadata(path)
    state: dict[str, Any] = {}
    # dcp.load only fills keys already present; the private loader (what torch's own dcp_to_torch_save uses)
    # lets the planner build the state dict from the metadata.
    with _as_checkpoint_errors(path):
        _load_state_dict(state, storage_reader=SafeFileSystemReader(path), planner=_SafeEmptyLoadPlanner(),
                         no_dist=True)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


# -- full (gathered) optimizer state ------------------------------------------------------------------------
def _param_names(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state_dict(optimizer: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The optimizer's full state in ``optimizer.state_dict()`` layout, on rank 0 (other ranks get ``{}``).

    A collective: every rank must call it.
    """
    inner = _inner(optimizer)
    at_rest(model)
    # Keyed by parameter name in optimizer.state_dict()'s layout ("state", "param_groups").
    full: dict[str, Any] = get_optimizer_state_dict(model, inner,
                                                   options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not full:
        return {}
    index = {name: i for i, name in enumerate(_param_names(inner, model))}
    state = {index[name]: value for name, value in full["state"].items()}
    groups = [{**group, "params": [index[name] for name in group["params"]]} for group in full["param_groups"]]
    return {"state": state, "param_groups": groups}


def load_full_optimizer_state_dict(optimizer: Any, model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Load a full ``optimizer.state_dict()`` (from any number of processes) into the optimizer of a sharded model.

    Every rank passes the same full state; each keeps its own shard.
    """
    inner = _inner(optimizer)
    names = _param_names(inner, model)
    saved_groups = state["param_groups"]
    if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in inner.param_groups]:
        raise ValueError(f"The saved optimizer state has parameter groups of sizes "
                         f"{[len(g['params']) for g in saved_groups]}, this optimizer "
                         f"{[len(g['params']) for g in inner.param_groups]}: build the optimizer as when saving.")
    position = {saved: i for i, saved in enumerate(p for g in saved_groups for p in g["params"])}
    at_rest(model)
    by_name: dict[str, Any] = {"state": {names[position[k]]: v for k, v in state["state"].items()},
               "param_groups": [{**g, "params": [names[position[p]] for p in g["params"]]} for g in saved_groups]}
    set_optimizer_state_dict(model, inner, by_name, options=StateDictOptions(full_state_dict=True))


# -- the seam used by save_state / load_state ---------------------------------------------------------------
def uses_sharded_checkpoint(plugin: Any) -> bool:
    """Whether ``save_state`` writes models and optimizers as DCP shards (an FSDP plugin asking for them)."""
    return plugin is not None and bool(getattr(plugin, "sharded_state_dict", False))


def _rank_files(folder: str, subs: Sequence[str], rank: int) -> list[str]:
    files = []
    for sub in subs:
        for name in sorted(os.listdir(os.path.join(folder, sub))):
            # DCP names each rank's data file __{rank}_{n}.distcp; the coordinator (rank 0) writes .metadata.
            if name.startswith(f"__{rank}_") or (rank == 0 and name == METADATA_FILE):
                files.append(f"{sub}/{name}")
    return files


def save_shards(folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any], rank: int) -> list[str]:
    """``save_sharded`` into ``folder``; returns the files this rank wrote (relative paths, for the manifest).

    A collective: every rank calls it, before anything else that could fail on one rank only.
    """
    return _rank_files(folder, save_sharded(folder, models, optimizers), rank)


def async_save_shards(folder: str, models: Sequence[torch.nn.Module], optimizers: Sequence[Any], rank: int,
                      channel: Callable[[str], tuple[Any, Any]]) -> Callable[[], list[str]]:
    """Stage every model's and optimizer's shards to host memory and write them with DCP's ``async_save``.

    ``channel(name)`` gives the process group and stager of one sharded object: each upload runs on a thread of
    its own, so each needs a group of its own, and a stager kept from save to save reuses its host buffers.
    Returns a function that waits for the uploads and returns the files this rank wrote (as ``save_shards``).
    A collective: every rank calls it.
    """
    uploads: list[tuple[str, Future[Any]]] = []
    at_rest(*models)

    def optimizer_state(optimizer: Any) -> Mapping[str, Any]:
        return get_optimizer_state_dict(owner_model(optimizer, models), _inner(optimizer))

    # Each state is taken when its upload starts (not all first).
    states: list[tuple[str, Callable[[], Mapping[str, Any]]]]
    states = [(sharded_model_dir(i), functools.partial(get_model_state_dict, model)) for i, model in enumerate(models)]
    states += [(sharded_optimizer_dir(i), functools.partial(optimizer_state, optimizer))
               for i, optimizer in enumerate(optimizers)]
    for sub, state in states:
        group, stager = channel(sub)
        path = os.path.join(folder, sub)
        writer = FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        with _quiet_single_process(), _as_checkpoint_errors(path):
            upload = dcp.async_save(dict(state()), storage_writer=writer, process_group=group, async_stager=stager,
                                    no_dist=_no_dist())
        uploads.append((path, upload.upload_completion if hasattr(upload, "upload_completion") else upload))

    def finish() -> list[str]:
        for path, upload in uploads:
            with _as_checkpoint_errors(path):
                upload.result()
        return _rank_files(folder, [sub for sub, _ in states], rank)

    return finish


class _GatheredOptimizer:
    """A stand-in for an optimizer whose full state was gathered: ``state_dict()`` returns that state."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def prepare_save(plugin: Any, models: Sequence[torch.nn.Module], optimizers: Sequence[Any],
                 sync_gradients: bool) -> tuple[bool, list[Any]]:
    """Decide how ``save_state`` writes models and optimizers under FSDP (a collective: every rank calls it).

    Returns ``(sharded, optimizers)``: with ``sharded`` the models and optimizers go through ``save_shards`` and
    the checkpoint writer gets no optimizer; otherwise it calls ``state_dict()`` on each returned object, whose
    state, for an optimizer over an FSDP2 model, was gathered to rank 0 here.
    """
    from engine.backends.fsdp import holds_dtensors, is_sharded

    if any(is_sharded(m) for m in models) and not sync_gradients:
        raise ValueError("save_state() was called in the middle of gradient accumulation under FSDP2: FSDP2 keeps "
                         "the gradients accumulated under no_sync in private buffers that cannot be saved, so the "
                         "resumed run would differ. Save after an optimizer step (when accelerator.sync_gradients "
                         "is True).")
    if uses_sharded_checkpoint(plugin):
        return True, []
    distributed = [m for m in models if holds_dtensors(m)]
    result: list[Any] = []
    for optimizer in optimizers:
        owner = owner_model(optimizer, models) if distributed else None
        result.append(_GatheredOptimizer(full_optimizer_state_dict(optimizer, owner))
                      if owner is not None and holds_dtensors(owner) else optimizer)
    return False, result


def load_model_weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
    """``model.load_state_dict(state)`` from a full state; an FSDP2 model keeps its own shard of each tensor."""
    from engine.backends.fsdp import load_full_state_dict

    load_full_state_dict(model, state, strict=strict)


def load_optimizer_state(optimizer: Any, state: Mapping[str, Any], models: Sequence[torch.nn.Module]) -> None:
    """``optimizer.load_state_dict(state)`` from a full state; over an FSDP2 model each rank keeps its shard."""
    from engine.backends.fsdp import holds_dtensors

    owner = owner_model(optimizer, models) if any(holds_dtensors(m) for m in models) else None
    if owner is None or not holds_dtensors(owner):
        optimizer.load_state_dict(state)
    else:
        load_full_optimizer_state_dict(optimizer, owner, state)


def load_shards(folder: str, manifest: Mapping[str, Any], models: Sequence[torch.nn.Module],
                optimizers: Sequence[Any], owners: Sequence[torch.nn.Module], strict: bool = True) -> None:
    """Load every model's and optimizer's shards from ``folder`` (a collective, any number of ranks).

    ``models[i]`` gets folder ``pytorch_model_fsdp_{i}``; each optimizer's parameters are named within the one of
    ``owners`` that holds them. A folder in DeepSpeed's own layout (its ``latest`` file, listed in ``manifest``)
    is refused: only its own backend reads it.
    """
    if "latest" in manifest["files"]:
        raise CheckpointError(f"Checkpoint {folder} was written by DeepSpeed: load it with the same "
                              "DeepSpeedPlugin, or get its full weights with the zero_to_fp32.py it holds.")
    for i, model in enumerate(models):
        load_sharded_model(folder, i, model, strict=strict)
    for i, optimizer in enumerate(optimizers):
        load_sharded_optimizer(folder, i, optimizer, owners)
