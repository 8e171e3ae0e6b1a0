"""Exact distributed evaluation: the samples ``even_batches`` repeats to even out the last round are dropped.

With several processes, the engine gives every process the same number of full batches by completing the last
round with samples from the start of the dataset (so collectives, and FSDP2's parameter gathers, stay in
step). Counted as they come, those repeats would weigh twice in a validation metric and make each rank's value
differ. Before an evaluation step the trainer asks the loader how many samples of the batch are real: a batch
with some repeats is trimmed to its real samples; a batch made only of repeats still runs (every process runs
the same forwards and the same collectives), but what it logs counts for nothing
(``MetricLogger.new_batch(..., padding=True)``) and every torchmetrics ``Metric`` ends that batch exactly as it
started it (``metric_states_kept``): the ``update`` its step (or a batch hook) made is undone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from engine.operations import first_samples
from trainer.metrics.logger import batch_size, is_torchmetric


def drop_padding(loader: Any, batch_idx: int, batch: Any) -> tuple[Any, bool]:
    """``(batch without its repeated samples, whether it held only repeats)``.

    Example:
        >>> import torch
        >>> class Loader:
        ...     def unpadded_size(self, batch_number):
        ...         return 1 if batch_number == 3 else None
        >>> batch = (torch.arange(4), ["a", "b", "c", "d"])
        >>> drop_padding(Loader(), 3, batch)
        ((tensor([0]), ['a']), False)
        >>> drop_padding(Loader(), 0, batch)[0] is batch
        True
    """
    unpadded = getattr(loader, "unpadded_size", None)
    real = unpadded(batch_idx) if callable(unpadded) else None
    if real is None:
        return batch, False
    if real == 0:
        return batch, True
    return first_samples(batch, real, size=batch_size(batch)), False


@contextlib.contextmanager
def metric_states_kept(module: torch.nn.Module, logged: Iterable[Any] = ()) -> Iterator[None]:
    """Every torchmetrics ``Metric`` of ``module`` (at any depth, ``MetricCollection`` members included) and of
    ``logged`` leaves the block with the state it entered it with: a batch of padding repeats reaches ``update``
    on this process only to keep the processes in step, and must not count.

    Each state is put back into the object it was (a ``MetricCollection``'s compute group shares one object
    between its members, so the sharing survives), with its values from before the block.

    Example:
        >>> import torchmetrics
        >>> holder = torch.nn.Module()
        >>> holder.total = torchmetrics.SumMetric()
        >>> holder.total.update(torch.tensor(2.0))
        >>> with metric_states_kept(holder):
        ...     holder.total.update(torch.tensor(40.0))
        >>> holder.total.compute()
        tensor(2.)
    """
    metrics = {id(m): m for m in [*module.modules(), *logged] if is_torchmetric(m)}
    saved = [_snapshot(metric) for metric in metrics.values()]
    try:
        yield
    finally:
        for metric, states, update_count, computed in saved:
            for name, (held, values) in states.items():
                if isinstance(held, torch.Tensor):
                    held.copy_(values)
                else:
                    held[:] = values
                setattr(metric, name, held)
            metric._update_count, metric._computed = update_count, computed


def _snapshot(metric: Any) -> tuple[Any, dict[str, tuple[Any, Any]], int, Any]:
    """``(metric, {state: (the object holding it, a copy of its values)}, update count, cached compute value)``."""
    states: dict[str, tuple[Any, Any]] = {}
    for name in metric._defaults:
        held = getattr(metric, name)
        states[name] = (held, held.clone() if isinstance(held, torch.Tensor) else list(held))
    return metric, states, metric._update_count, metric._computed
