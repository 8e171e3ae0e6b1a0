"""DDP's wrapper (made, released with the process group, forced to sync in a backward) and unwrapping a model
from DDP / DataParallel / torch.compile. The backends (``engine.backends``) decide when each is used."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from engine.config import DistributedDataParallelKwargs
from engine.state import AcceleratorState, DistributedType, PartialState

# Every DDP wrapper made here, so that destroying the process group can release their hold on it (wrap_ddp
# registers `release_ddp_wrappers` with the state's teardown, which runs in `destroy_process_group`).
_DDP_WRAPPERS: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()


def release_ddp_wrappers() -> None:
    """Drop the process-group handles (reducer, logger, group) of the DDP wrappers made by ``wrap_ddp``.

    Called when the process group is destroyed (``PartialState.destroy_process_group`` runs it: ``wrap_ddp``
    registers it there). Otherwise a wrapper that lives until interpreter shutdown (a module global, a reference
    cycle) frees its gloo group during finalization, which aborts the process with "terminate called without an active exception" in about one run in four (torch 2.13, reproduced with plain
    torch: DDP + destroy_process_group + exit). A released wrapper can no longer run distributed steps, which it
    could not do without a process group anyway; ``unwrap_model`` still gives the trained module.
    """
    for ddp in list(_DDP_WRAPPERS):
        for name in ("reducer", "logger", "process_group"):
            ddp.__dict__.pop(name, None)
    _DDP_WRAPPERS.clear()


def wrap_ddp(model: torch.nn.Module, state: PartialState | AcceleratorState,
             handler: DistributedDataParallelKwargs | None) -> torch.nn.Module:
    """Wrap ``model`` in DDP (which also broadcasts rank 0's parameters and buffers to every rank)."""
    kwargs = handler.ddp_kwargs() if handler is not None else {}
    if state.distributed_type == DistributedType.MULTI_GPU:
        if not any(p.requires_grad for p in model.parameters()):
            return model
        ddp = DistributedDataParallel(model, device_ids=[state.device.index], output_device=state.device.index,
                                      **kwargs)
    else:
        ddp = DistributedDataParallel(model, **kwargs)
    if handler is not None:
        handler.register_comm_hook(ddp)
    _DDP_WRAPPERS.add(ddp)
    state.register_teardown(release_ddp_wrappers)
    return ddp


@contextlib.contextmanager
def sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
    """Force DDP to all-reduce in the next backward, even inside ``no_sync`` (no-op for other models)."""
    if not isinstance(model, DistributedDataParallel):
        yield
        return
    previous = model.require_backward_grad_sync
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True
    # DDP only arms its reducer in forward when grad sync is on; prepare it for the coming backward.
    model.reducer.prepare_for_backward([])
    try:
        yield
    finally:
        model.require_backward_grad_sync = previous
        model.require_forward_param_sync = previous


def unwrap(model: Any, keep_torch_compile: bool = True) -> Any:
    """Strip DDP / DataParallel wrappers (and, unless ``keep_torch_compile``, the torch.compile shell)."""
    compiled = model if hasattr(model, "_orig_mod") else None
    if compiled is not None:
        model = compiled._orig_mod
    while isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    if compiled is not None and keep_torch_compile and compiled._orig_mod is model:
        return compiled
    return model


def extract_model_from_parallel(model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
    """The user's module without the DDP / DataParallel wrappers; with ``keep_fp32_wrapper=False`` also without the
    mixed-precision forward wrapper (``Accelerator.unwrap_model`` under Accelerate's ``utils`` name)."""
    bare = unwrap(model, keep_torch_compile=keep_torch_compile)
    if not keep_fp32_wrapper:
        from engine.precision.mixed import unwrap_forward

        unwrap_forward(unwrap(bare, keep_torch_compile=False))
    return bare
