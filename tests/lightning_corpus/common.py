"""Helpers the corpus modules share (plain torch: nothing here differs between Ember and Lightning)."""

from __future__ import annotations

from typing import Any

import torch


def weights_summary(module: torch.nn.Module) -> dict[str, list[float]]:
    """Per-parameter (sum, sum of squares, first element): enough to tell any two trainings apart."""
    out = {}
    for name, p in module.named_parameters():
        t = p.detach().double()
        out[name] = [float(t.sum()), float((t * t).sum()), float(t.flatten()[0])]
    return out


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in sorted(metrics.items())}
