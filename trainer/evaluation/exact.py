"""Exact distributed evaluation: the samples ``even_batches`` repeats to even out the last round are dropped.

With several processes, the engine gives every process the same number of full batches by completing the last
round with samples from the start of the dataset (so collectives, and FSDP2's parameter gathers, stay in
step). Counted as they come, those repeats would weigh twice in a validation metric and make each rank's value
differ. Before an evaluation step the trainer asks the loader how many samples of the batch are real: a batch
with some repeats is trimmed to its real samples; a batch made only of repeats still runs (every process runs
the same forwards) but what it logs counts for nothing (``MetricLogger.new_batch(..., padding=True)``).
"""

from __future__ import annotations

from typing import Any

from engine.operations import first_samples
from trainer.metrics.logger import batch_size


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
