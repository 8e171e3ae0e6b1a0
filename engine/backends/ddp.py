"""``DDP``: several processes, each with a full replica; gradients all-reduced in backward (gloo or nccl)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from engine.backends.base import Backend
from engine.config import DistributedDataParallelKwargs
from engine.prepare.parallel import sync_in_backward, wrap_ddp
from engine.state import AcceleratorState


class DDP(Backend):
    """``DistributedDataParallel`` around each trained model; ``no_sync`` while accumulating.

    Args:
        state: the process's state (its ``distributed_type`` is ``MULTI_CPU`` or ``MULTI_GPU``).
        handler: ``DistributedDataParallelKwargs`` (bucket sizes, unused parameters, communication hooks).
    """

    def __init__(self, state: AcceleratorState, handler: DistributedDataParallelKwargs | None = None) -> None:
        super().__init__(state)
        self.distributed_type = state.distributed_type
        self.handler = handler

    def wrap_model(self, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> torch.nn.Module:
        return wrap_ddp(model, self.state, self.handler)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        # A model prepared for evaluation only is not wrapped: it has no gradients to hold back.
        return model.no_sync() if isinstance(model, DistributedDataParallel) else super().no_sync(model)

    @contextlib.contextmanager
    def sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        with sync_in_backward(model):
            yield
