"""Activation checkpointing: chosen submodules keep only their inputs for backward and recompute the rest.

``apply_activation_checkpointing(model, [Block])`` wraps every ``Block`` of ``model`` in torch's
``CheckpointWrapper`` (non-reentrant ``torch.utils.checkpoint``), innermost first; with ``offload=True`` the
tensors it still saves go to host memory (torch's ``OffloadWrapper`` around it). It works before any backend
wrapping: in a ``TrainModule.configure_model`` (one process, DDP, FSDP2, after a tensor-parallel plan), or on a
model before ``accelerator.prepare``. ``FullyShardedDataParallelPlugin(activation_checkpointing=True)`` does the
same to the plugin's sharding units (``checkpoint_units``), as Accelerate does for FSDP2.

The wrapper changes parameter names (``blocks.0._checkpoint_wrapped_module.fc1.weight``) but not state-dict keys
(``blocks.0.fc1.weight``): checkpoints stay loadable with or without it. Unlike Accelerate (``preserve_rng_state=
False``), the RNG state is restored for the recomputation, so dropout draws the same masks twice and gradients
equal those of the unwrapped model.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
>>> apply_activation_checkpointing(model, [torch.nn.Linear])
['0', '2']
>>> type(model[0]).__name__, list(model.state_dict())[:2]
('CheckpointWrapper', ['0.weight', '0.bias'])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

WRAPPED_PREFIX = "_checkpoint_wrapped_module."


def clean_name(name: str) -> str:
    """A parameter or module name without the checkpoint wrappers' ``_checkpoint_wrapped_module.`` parts.

    >>> clean_name("blocks.0._checkpoint_wrapped_module.fc1.weight")
    'blocks.0.fc1.weight'
    """
    return name.replace(WRAPPED_PREFIX, "")


def is_wrapper(module: torch.nn.Module) -> bool:
    """Whether ``module`` is one of torch's activation wrappers (checkpoint or offload)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    return isinstance(module, ActivationWrapper)


def _classes(module_classes: type | str | Iterable[type | str]) -> tuple[set[type], set[str]]:
    if isinstance(module_classes, (type, str)):
        module_classes = [module_classes]
    types: set[type] = set()
    names: set[str] = set()
    for item in module_classes:
        if isinstance(item, type) and issubclass(item, torch.nn.Module):
            types.add(item)
        elif isinstance(item, str) and item:
            names.add(item)
        else:
            raise TypeError(f"apply_activation_checkpointing(module_classes=...) takes nn.Module subclasses or class "
                            f"names. Received: {item!r}.")
    if not types and not names:
        raise ValueError("apply_activation_checkpointing(module_classes=...) is empty: name the classes to "
                         "checkpoint, e.g. [Block] (your transformer block).")
    return types, names


def apply_activation_checkpointing(model: torch.nn.Module, module_classes: type | str | Iterable[type | str],
                                   offload: bool = False) -> list[str]:
    """Wrap every submodule of ``model`` whose class is in ``module_classes`` (classes or class names) in a
    checkpoint wrapper; returns the names of the modules wrapped now.

    Call it once the model is built (in ``TrainModule.configure_model``, after ``parallelize_module`` for tensor
    parallelism) and before the model is prepared. A second call changes nothing (wrapped modules are skipped).

    Args:
        model: the module to change in place (the root itself is never wrapped).
        module_classes: the classes to checkpoint, e.g. ``[Block]`` or ``["Block"]``.
        offload: also move what the wrapped modules save for backward to host memory (torch's
            ``offload_wrapper``; on a CPU-only machine it saves nothing more).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        >>> apply_activation_checkpointing(model, "Linear"), apply_activation_checkpointing(model, "Linear")
        (['0'], [])
    """
    types, names = _classes(module_classes)
    matches = [module for module in model.modules() if module is not model and not is_wrapper(module)
               and (isinstance(module, tuple(types)) or type(module).__name__ in names)]
    if not matches:
        present = sorted({type(m).__name__ for m in model.modules()})
        wanted = sorted(t.__name__ for t in types) + sorted(names)
        raise ValueError(f"apply_activation_checkpointing: no submodule of class {wanted} in {type(model).__name__}"
                         f" (its classes are {present}). Name a class the model contains.")
    return checkpoint_modules(model, matches, offload)


def checkpoint_modules(model: torch.nn.Module, modules: Sequence[torch.nn.Module],
                       offload: bool = False) -> list[str]:
    """Wrap each of ``modules`` (submodules of ``model``) in a checkpoint wrapper, innermost first, in place;
    modules already wrapped are left alone. Returns the wrapped modules' names (as ``named_modules`` gives them
    after the wrapping, so a nested one carries its parent's wrapper prefix)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
        offload_wrapper,
    )

    wanted = {id(m) for m in modules}
    outer: set[int] = set()
    # Children before parents: a parent wrapped first would move its children under a new name mid-walk (the
    # names of a module's ancestors do not change when the module is wrapped).
    for name, module in reversed(list(model.named_modules())):
        # A module whose parent is a wrapper (``..._checkpoint_wrapped_module``) is wrapped already.
        if id(module) not in wanted or module is model or name.rsplit(".", 1)[-1] == WRAPPED_PREFIX[:-1]:
            continue
        wrapper = checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=True)
        wrapper = offload_wrapper(wrapper) if offload else wrapper
        model.set_submodule(name, wrapper)
        outer.add(id(wrapper))
    return [name for name, module in model.named_modules() if id(module) in outer]


def _outermost(module: torch.nn.Module, inner: dict[int, torch.nn.Module]) -> torch.nn.Module:
    while id(module) in inner:
        module = inner[id(module)]
    return module


def outermost_wrappers(model: torch.nn.Module, modules: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """Each of ``modules``, or the outermost activation wrapper around it: what FSDP2 shards as the unit."""
    inner = {id(m._checkpoint_wrapped_module): m for m in model.modules() if is_wrapper(m)}
    return [_outermost(m, inner) for m in modules]


__all__ = ["apply_activation_checkpointing", "checkpoint_modules", "clean_name", "is_wrapper",
           "outermost_wrappers"]
