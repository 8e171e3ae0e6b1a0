"""Gather each step's predictions from every process in dataset order, and drop the padding of the last step.

The sharded loader deals global batch ``i`` of a round to process ``i % num_processes`` (or, with
``split_batches`` / dispatching, slice ``r`` of each batch to process ``r``), so concatenating one step's
predictions in rank order gives them in dataset order. Only the last round can hold repeated samples (added so
every process gets a full batch); the engine reports how many samples of that round are real
(``gradient_state.remainder``), and the rest are cut here, counting samples along dim 0.

Example, 10 samples, batch size 4, 2 processes: process 0 gets ``[0..3], [8, 9, 0, 1]``, process 1
``[4..7], [2..5]``; the steps gather to ``[[0..3], [4..7]]`` and ``[[8, 9, 0, 1], [2..5]]``, and the remainder 2
keeps ``[8, 9]``: ``[[0..3], [4..7], [8, 9]]``, what one process with batch size 4 would return.
"""

from __future__ import annotations

from typing import Any

from engine import Accelerator, gather_object
from engine.operations import first_samples, sample_count


def gather_step(accelerator: Accelerator, prediction: Any) -> list[Any]:
    """This step's prediction from every process, in rank order, without the last round's padding.

    Example:
        >>> import torch
        >>> from engine import Accelerator
        >>> gather_step(Accelerator(cpu=True), torch.arange(3))
        [tensor([0, 1, 2])]
    """
    if accelerator.num_processes == 1:
        return [prediction]  # nothing is ever padded in a single process
    gathered = gather_object([prediction])
    gradient_state = accelerator.gradient_state
    if gradient_state.end_of_dataloader and gradient_state.remainder > 0:
        return keep_samples(gathered, gradient_state.remainder)
    return gathered


def keep_samples(predictions: list[Any], keep: int) -> list[Any]:
    """The first ``keep`` samples of ``predictions`` (a list of per-batch outputs), batches cut along dim 0.

    Outputs whose sample count is unknown (``None``, a plain number) are kept whole.

    Example:
        >>> import torch
        >>> keep_samples([torch.arange(4), torch.arange(4, 8)], 5)
        [tensor([0, 1, 2, 3]), tensor([4])]
    """
    kept: list[Any] = []
    for prediction in predictions:
        count = sample_count(prediction)
        if count is None:
            kept.append(prediction)
        elif keep > 0:
            kept.append(prediction if count <= keep else first_samples(prediction, keep))
            keep -= min(count, keep)
    return kept
