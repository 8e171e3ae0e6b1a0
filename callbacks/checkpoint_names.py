"""Checkpoint names from a ``ModelCheckpoint`` template: ``"epoch={epoch}-step={step}-{val/acc:.3f}"``.

Lightning's rules: a ``{name}`` not preceded by ``name=`` gets it (``auto_insert_metric_name``), a ``{name}``
that was not logged is 0, ``/`` becomes ``_`` (one checkpoint per name, never a sub-folder), and a taken name gets
``-v1``, ``-v2``... before the extension.

Example:
    >>> render("epoch={epoch}-{val/acc:.3f}", {"epoch": 3, "val/acc": 0.91234})
    ('epoch=3-val_acc=0.912', [])
    >>> render("{epoch}-{missing}", {"epoch": 1})
    ('epoch=1-missing=0', ['missing'])
"""

from __future__ import annotations

import re
from typing import Any

import torch

_GROUP = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")  # "{name}" or "{name:spec}"; names may hold "/" and "."


def number(value: Any) -> Any:
    """A one-element tensor as a Python number (anything else as it is)."""
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def render(template: str, metrics: dict[str, Any], auto_insert_metric_name: bool = True,
           join_char: str = "-", equals_char: str = "=", prefix: str = "") -> tuple[str, list[str]]:
    """``(name, the template's names that were not in metrics)``; a missing name renders as 0, as in Lightning."""
    missing: list[str] = []

    def one(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2)
        if name not in metrics:
            missing.append(name)
        value = number(metrics.get(name, 0))
        text = format(value, spec[1:]) if spec else str(value)
        labelled = not auto_insert_metric_name or template[:match.start()].endswith(f"{name}{equals_char}")
        return text if labelled else f"{name}{equals_char}{text}"

    name = _GROUP.sub(one, template)
    if prefix:
        name = f"{prefix}{join_char}{name}"
    return name.replace("/", "_").replace("\\", "_"), missing
