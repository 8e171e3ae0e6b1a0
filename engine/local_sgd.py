"""Local SGD: each process takes ``local_sgd_steps`` optimizer steps alone, then the weights are averaged.

Accelerate's ``accelerate.local_sgd.LocalSGD`` contract: a context manager around the training loop that keeps
DDP from all-reducing gradients, ``step()`` after each optimizer step, parameters averaged across processes every
``local_sgd_steps`` steps and once more when the block exits. On one process it does nothing.

>>> from engine import Accelerator
>>> import torch
>>> accelerator = Accelerator(cpu=True)
>>> model = accelerator.prepare(torch.nn.Linear(2, 1))
>>> with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=4) as local_sgd:
...     for _ in range(3):
...         local_sgd.step()  # after optimizer.step() in a real loop
>>> local_sgd.num_steps
3
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any, Self

import torch

from engine.state import DistributedType

# Parameter averaging needs every process to hold the whole model: sharded (FSDP) parameters are not averaged.
_SUPPORTED = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


class LocalSGD:
    """Run ``local_sgd_steps`` updates independently on each process, then average the model's parameters.

    Args:
        accelerator: the ``Accelerator`` that prepared ``model``.
        model: the prepared model whose parameters are averaged.
        local_sgd_steps: optimizer steps between two averagings (>= 1).
        enabled: ``False`` turns it into a no-op (as does a single-process run).
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError(f"LocalSGD averages whole replicas: it supports {[str(t) for t in _SUPPORTED]}"
                                      f", got {accelerator.distributed_type} (FSDP shards the parameters).")
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"LocalSGD(local_sgd_steps=...) needs an int >= 1 (optimizer steps between two "
                             f"averagings), got {local_sgd_steps!r}.")
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO and \
            accelerator.num_processes > 1
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: contextlib.ExitStack | None = None

    def __enter__(self) -> Self:
        if self.enabled:
            # Gradients stay local inside the block: synchronising them would make this plain DDP.
            self._no_sync = contextlib.ExitStack()
            self._no_sync.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.enabled and self._no_sync is not None:
            try:
                if kind is None:  # on an error the other processes may never reach the collective
                    self._sync_and_avg_model_params()
            finally:
                self._no_sync.close()
                self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; average the parameters when ``local_sgd_steps`` have been taken."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        """Replace every parameter by its mean across processes (the same reduction as ``reduce(.., "mean")``)."""
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast(), torch.no_grad():
            for param in self.model.parameters():
                param.data.copy_(self.accelerator.reduce(param.data, reduction="mean"))
