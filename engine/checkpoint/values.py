"""A checkpoint as values instead of files: what ``save_state`` writes, gathered on the main process, and back.

``Accelerator.state_values`` / ``load_state_values`` are for callers that store a whole checkpoint in one file of
their own format (the trainer's ``.ckpt`` files, as Lightning writes them where one process holds the whole state).
The values are exactly what ``save_state`` would write, as plain containers and CPU tensors (so ``torch.load``
with ``weights_only=True`` reads them back)::

    {"step": int, "world_size": int,
     "models": [state_dict, ...], "optimizers": [state_dict, ...], "schedulers": [state_dict, ...],
     "scaler": state_dict | None, "custom": [registered object's state_dict, ...],
     "ranks": [{"rng": {"step", "rng"}, "dataloaders": {i: position}, "gradients": {i: {name: tensor}}}, ...]}

Each rank's own part (RNG states, loader positions, pending gradients) is gathered to the main process, so one
file holds every rank's exact-resume state and a resume on the same number of processes continues bitwise.
Only backends whose main process holds the whole state can give values: sharded ones (FSDP2, DeepSpeed, tensor
parallelism) write folders of shards with ``save_state``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from engine.checkpoint.io import CheckpointError
from engine.checkpoint.state import LoadedCheckpoint, capture_state

VALUES_FILE = "checkpoint values"  # what LoadedCheckpoint.model_files names: not a safetensors file


def _cpu(value: Any) -> Any:
    """``value`` with every tensor detached and on CPU (a copy only where it was not on CPU already)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(item) for item in value)
    return value


def capture_values(*, step: int, rng_state: Mapping[str, Any], rank: int, world_size: int, main: bool,
                   distributed: bool, models: list[torch.nn.Module], dataloaders: list[Any], to_save: Any,
                   schedulers: list[Any], scaler: Any, custom: list[Any], gradients: bool) -> dict[str, Any] | None:
    """This rank's state, gathered with every other rank's part on the main process (``None`` elsewhere).

    ``to_save`` is the backend's ``models_to_save`` answer; a collective: every rank calls this.
    """
    if to_save.sharded:
        raise CheckpointError("This backend writes the models as shards (FSDP2, DeepSpeed, tensor parallelism): "
                              "no process holds the whole state, so it cannot be one file. Use save_state(folder).")
    state = capture_state(step=step, rng_state=rng_state, models=models, dataloaders=dataloaders, shared=main,
                          weights=to_save.weights, optimizers=to_save.optimizers, schedulers=schedulers,
                          scaler=scaler, custom=custom, safe_serialization=True, gradients=gradients)
    own = _cpu({"rng": {"step": step, "rng": dict(state.rng)}, "dataloaders": dict(state.dataloaders),
                "gradients": {i: dict(grads) for i, grads in state.gradients.items()}})
    if distributed:
        # To the main process only (not all_gather: other ranks need none of it); pickled over the process
        # group, never to disk.
        parts: list[Any] | None = [None] * world_size if main else None
        dist.gather_object(own, parts, dst=0)
    else:
        parts = [own]
    if not main:
        return None
    return {"step": step, "world_size": world_size, "models": [_cpu(dict(w)) for w in state.weights],
            "optimizers": _cpu(state.optimizers), "schedulers": _cpu(state.schedulers), "scaler": _cpu(state.scaler),
            "custom": list(state.custom), "ranks": parts}


def to_loaded(values: Mapping[str, Any], source: str, rank: int, num_custom: int,
              on_missing: Callable[[str], None]) -> LoadedCheckpoint:
    """``values`` (from ``capture_values``, read back) as what ``load_state`` applies for ``rank``.

    ``on_missing`` raises for a part this run needs that the values lack (named in the message).
    """
    custom = list(values.get("custom", []))
    if len(custom) != num_custom:
        on_missing(f"{len(custom)} registered object state(s) where this run registered {num_custom}: register "
                   "the same objects, in the same order, as the run that saved it")
    ranks = list(values.get("ranks", []))
    own = ranks[rank] if rank < len(ranks) else {}
    models = list(values.get("models", []))
    return LoadedCheckpoint(
        folder=source, manifest={"files": {}, "step": values.get("step", 0),
                                 "world_size": values.get("world_size", len(ranks) or 1)},
        models=dict(enumerate(models)), model_files={i: VALUES_FILE for i in range(len(models))},
        gradients=dict(own.get("gradients", {})), optimizers=list(values.get("optimizers", [])),
        schedulers=list(values.get("schedulers", [])), scaler=values.get("scaler"),
        dataloaders=dict(own.get("dataloaders", {})), custom=custom, rng=own.get("rng"))
