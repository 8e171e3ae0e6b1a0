"""`ModelSummary`: a table of the module's layers and parameter counts at the start of fit."""

from __future__ import annotations

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView


class ModelSummary(Callback):
    """Print ``summarize(module, max_depth)`` on the main process when fit starts."""

    def __init__(self, max_depth: int = 1) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"ModelSummary(max_depth=...) must be an int >= -1 (-1: every layer). Received: "
                             f"{max_depth!r}.")
        self.max_depth = max_depth

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if trainer.is_global_zero and self.max_depth != 0:
            print(summarize(pl_module, self.max_depth))


def summarize(module: torch.nn.Module, max_depth: int = 1) -> str:
    """A table of ``module``'s sub-modules down to ``max_depth`` levels (-1: all), with parameter totals.

    Example:
        >>> print(summarize(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())))
          | Name | Type   | Params
        --------------------------
        0 | 0    | Linear | 15
        1 | 1    | ReLU   | 0
        --------------------------
        15        Trainable params
        0         Non-trainable params
        15        Total params
        0.000     Total estimated model params size (MB)
    """
    rows = [(name, type(sub).__name__, _human(sum(p.numel() for p in sub.parameters())))
            for name, sub in module.named_modules()
            if name and (max_depth == -1 or name.count(".") < max_depth)]
    unique = {id(p): p for p in module.parameters()}.values()  # shared parameters count once
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    total = sum(p.numel() for p in unique)
    size_mb = sum(p.numel() * p.element_size() for p in unique) / 1e6
    header = ("", "Name", "Type", "Params")
    table = [header] + [(str(i), *row) for i, row in enumerate(rows)]
    widths = [max(len(r[c]) for r in table) for c in range(4)]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip() for r in table]
    rule = "-" * max(len(line) for line in lines)
    return "\n".join([lines[0], rule, *lines[1:], rule,
                      f"{_human(trainable):<10}Trainable params", f"{_human(total - trainable):<10}Non-trainable params",
                      f"{_human(total):<10}Total params", f"{size_mb:<10.3f}Total estimated model params size (MB)"])


def _human(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return str(count)
