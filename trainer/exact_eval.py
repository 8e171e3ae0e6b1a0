"""Exact distributed evaluation: the samples ``even_batches`` repeats to even out the last round are dropped.

With several processes, the engine gives every process the same number of full batches by completing the last
round with samples from the start of the dataset (so collectives, and FSDP2's parameter gathers, stay in
step). Counted as they come, those repeats would weigh twice in a validation metric and make each rank's value
differ. Before an evaluation step the trainer asks the loader how many samples of the batch are real: a batch
with some repeats is trimmed to its real samples; a batch made only of repeats still runs (every process runs
the same forwards) but what it logs counts for nothing (``MetricLogger.new_batch(..., padding=True)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainer.metrics import batch_size


def drop_padding(loader: Any, batch_idx: int, batch: Any) -> tuple[Any, bool]:
    """``(batch without its repeated samples, whether it held only repeats)``.

    Example:
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
    return _trim(batch, batch_size(batch), real), False


def _trim(data: Any, size: int, keep: int) -> Any:
    """The first ``keep`` samples of every per-sample part of a collated batch (dim 0 of length ``size``)."""
    if isinstance(data, torch.Tensor):
        return data[:keep] if data.ndim and data.shape[0] == size else data
    if isinstance(data, Mapping):
        return type(data)({k: _trim(v, size, keep) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, (list, tuple)):
        if len(data) == size and data and not any(isinstance(item, (torch.Tensor, Mapping, list, tuple))
                                                  for item in data):
            return type(data)(data[:keep]) if not hasattr(data, "_fields") else data  # a list of strings, ids...
        items = [_trim(item, size, keep) for item in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    return data
