"""Each process's contiguous share of an input: what ``PartialState.split_between_processes`` yields.

A leaf module (torch only), so that ``state.py``, the bottom of the engine, can use it without importing the
collectives in ``operations.py``, which themselves need the state.

>>> split_for_process([1, 2, 3, 4, 5], num_processes=2, process_index=1)
[4, 5]
>>> split_for_process([1, 2, 3, 4, 5], num_processes=2, process_index=1, apply_padding=True)
[4, 5, 5]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def split_for_process(inputs: Any, num_processes: int, process_index: int, apply_padding: bool = False) -> Any:
    """This process's contiguous share of ``inputs``; with ``apply_padding`` every share has the same length."""
    if num_processes == 1:
        return inputs
    length = len(inputs)  # as Accelerate: an object without a length is a TypeError...
    if not isinstance(inputs, (list, tuple, torch.Tensor, Mapping)) and not hasattr(inputs, "select"):
        return inputs  # ...and a str, range, array, ... is given whole to every process
    if isinstance(inputs, Mapping):
        lengths = {k: len(v) for k, v in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"split_between_processes needs every value of the dict to have the same length, got "
                             f"{lengths}.")
        # Padding repeats the last element of the *whole* input; per key, that is each value's last element.
        return {k: split_for_process(v, num_processes, process_index, apply_padding) for k, v in inputs.items()}
    per, extra = divmod(length, num_processes)
    start = process_index * per + min(process_index, extra)
    end = start + per + (1 if process_index < extra else 0)
    if not isinstance(inputs, (list, tuple, torch.Tensor)):  # a Hugging Face `datasets.Dataset`
        rows = list(range(start, end))
        return inputs.select(rows + [length - 1] * (per + (extra > 0) - len(rows)) if apply_padding and length
                             else rows)
    share = inputs[start:end]
    if not apply_padding or length == 0:
        return share
    target = per + (1 if extra > 0 else 0)
    missing = target - (end - start)
    if missing <= 0:
        return share
    if isinstance(inputs, torch.Tensor):
        last = inputs[-1:]
        return torch.cat([inputs[start:end], last.expand(missing, *last.shape[1:])], dim=0)  # share, as a Tensor
    padding = [inputs[-1]] * missing
    if isinstance(share, tuple):
        return share + tuple(padding)
    return list(share) + padding
