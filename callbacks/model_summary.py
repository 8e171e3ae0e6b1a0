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
    rows = [(name, type(sub).__name__, human_count(sum(p.numel() for p in sub.parameters())))
            for name, sub in summarized_layers(module, max_depth)]
    trainable, total, size_mb = parameter_totals(module)
    header = ("", "Name", "Type", "Params")
    table = [header] + [(str(i), *row) for i, row in enumerate(rows)]
    widths = [max(len(r[c]) for r in table) for c in range(4)]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip() for r in table]
    rule = "-" * max(len(line) for line in lines)
    return "\n".join([lines[0], rule, *lines[1:], rule,
                      f"{human_count(trainable):<10}Trainable params",
                      f"{human_count(total - trainable):<10}Non-trainable params", f"{human_count(total):<10}Total params", f"{size_mb:<10.3f}Total estimated model params size (MB)"])


def summarized_layers(module: torch.nn.Module, max_depth: int) -> list[tuple[str, torch.nn.Module]]:
    """``module``'s named sub-modules down to ``max_depth`` levels (-1: all), the root left out."""
    return [(name, sub) for name, sub in module.named_modules()
            if name and (max_depth == -1 or name.count(".") < max_depth)]


def parameter_totals(module: torch.nn.Module) -> tuple[int, int, float]:
    """Trainable and total parameter counts, and their size in MB; a parameter shared by layers counts once."""
    unique = {id(p): p for p in module.parameters()}.values()
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    total = sum(p.numel() for p in unique)
    return trainable, total, sum(p.numel() * p.element_size() for p in unique) / 1e6


def human_count(count: int) -> str:
    """A parameter count as the summaries show it: ``15``, ``1.5 K``, ``2.0 M``, ``1.1 B``."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return str(count)
