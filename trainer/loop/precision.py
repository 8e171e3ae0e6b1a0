"""Lightning's true precisions (``Trainer(precision="64" | "16-true" | "bf16-true")``): the whole model in a dtype.

Mixed precision (autocast) is the engine's; a *true* precision instead converts the module's floating parameters
and buffers to the dtype when a run prepares it, converts the floating tensors of every batch before a step, and
makes the dtype torch's default while a step runs (a tensor a step creates with ``torch.zeros(...)`` has it too),
as Lightning does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_map


class TruePrecision:
    """Runs steps in ``dtype`` (``"float64"``, ``"float16"`` or ``"bfloat16"``).

    Example:
        >>> precision = TruePrecision("float64")
        >>> module = precision.convert_module(torch.nn.Linear(2, 1))
        >>> with precision.step_context():
        ...     x = precision.convert_input((torch.ones(1, 2), torch.tensor([1])))
        ...     module(x[0]).dtype, x[1].dtype, torch.zeros(1).dtype
        (torch.float64, torch.int64, torch.float64)
    """

    def __init__(self, dtype: str) -> None:
        self.dtype: torch.dtype = getattr(torch, dtype)

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module's floating parameters and buffers in the dtype (in place)."""
        return module.to(dtype=self.dtype)

    def convert_input(self, data: Any) -> Any:
        """Every floating tensor in a batch (nested lists, tuples, dicts) in the dtype; other values unchanged."""
        return tree_map(lambda x: x.to(self.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x,
                        data)

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """The dtype as torch's default dtype inside the block (restored after it)."""
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)
