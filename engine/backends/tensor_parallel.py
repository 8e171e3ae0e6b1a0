"""Tensor parallelism on DTensor: applying a model's plan, checking it first, and clipping over DTensor gradients.

A model says how it splits with a ``tp_plan`` attribute:

- a dict ``{submodule name: style}`` (``*`` matches any one name part, as in ``"layers.*.attention.wq"``), the
  style a ``torch.distributed.tensor.parallel`` ``ParallelStyle`` or one of the names ``"colwise"``,
  ``"rowwise"``, ``"colwise_rep"`` (column-wise, output gathered), ``"rowwise_rep"`` (row-wise, input
  replicated), ``"sequence_parallel"``; or
- a function ``tp_plan(model, tp_mesh)`` that parallelizes the model itself.

A model whose parameters are already ``DTensor`` (parallelized by the user, or by transformers'
``from_pretrained(..., tp_plan="auto")``) is taken as it is.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

STYLE_NAMES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel")
_HEAD_ATTRIBUTES = ("num_heads", "n_heads", "num_attention_heads", "n_head", "num_key_value_heads")


def _style(name: str, value: Any) -> Any:
    """The ``ParallelStyle`` a plan entry names (a ParallelStyle is returned as it is)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
    )

    if isinstance(value, ParallelStyle):
        return value
    styles: dict[str, Callable[[], Any]] = {
        "colwise": ColwiseParallel, "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": SequenceParallel}
    if value not in styles:
        raise ValueError(f"tp_plan[{name!r}] = {value!r} is not a tensor-parallel style: use one of {STYLE_NAMES} or "
                         "a torch.distributed.tensor.parallel ParallelStyle (ColwiseParallel(), ...).")
    return styles[value]()


def matching_modules(model: torch.nn.Module, pattern: str) -> list[tuple[str, torch.nn.Module]]:
    """The submodules whose name matches ``pattern`` part by part (``*`` matches one part)."""
    found: list[tuple[str, torch.nn.Module]] = []

    def visit(module: torch.nn.Module, prefix: str, parts: list[str]) -> None:
        if not parts:
            found.append((prefix, module))
            return
        for child_name, child in module.named_children():
            if fnmatch.fnmatch(child_name, parts[0]):
                visit(child, f"{prefix}.{child_name}" if prefix else child_name, parts[1:])

    visit(model, "", pattern.split("."))
    return found


def _check_divisible(model: torch.nn.Module, plan: Mapping[str, Any], tp_size: int) -> None:
    """Every split dimension, and the model's head count where it says one, must divide by ``tp_size``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    for pattern, style in plan.items():
        if isinstance(style, ColwiseParallel):
            attribute, what = "out_features", "output features"
        elif isinstance(style, RowwiseParallel):
            attribute, what = "in_features", "input features"
        else:
            continue
        for name, module in matching_modules(model, pattern):
            size = getattr(module, attribute, None)
            if size is None and isinstance(module, torch.nn.Embedding):
                size = module.embedding_dim if isinstance(style, ColwiseParallel) else module.num_embeddings
            if size is not None and size % tp_size:
                raise ValueError(f"tp_size={tp_size} does not divide the {size} {what} of {name!r} "
                                 f"({type(module).__name__}), which tp_plan splits {type(style).__name__}: choose a "
                                 f"tp_size that divides {size}, or leave {name!r} out of the plan.")
    config = getattr(model, "config", None)
    for source in (model, config):
        for attribute in _HEAD_ATTRIBUTES:
            heads = getattr(source, attribute, None)
            if isinstance(heads, int) and heads % tp_size:
                raise ValueError(f"tp_size={tp_size} does not divide the model's {attribute}={heads}: each "
                                 "tensor-parallel process holds whole attention heads. Choose a tp_size that "
                                 f"divides {heads}.")


def resolve_plan(model: torch.nn.Module, plan: Mapping[str, Any], tp_size: int) -> dict[str, Any]:
    """The plan with its styles as ``ParallelStyle`` objects, after checking that every entry names submodules
    of ``model`` and that ``tp_size`` divides what it splits."""
    resolved = {name: _style(name, value) for name, value in plan.items()}
    missing = [name for name in resolved if not matching_modules(model, name)]
    if missing:
        names = [name for name, _ in model.named_modules() if name][:12]
        raise ValueError(f"tp_plan names submodules that {type(model).__name__} does not have: {missing}. Its "
                         f"submodules include {names}; fix the names (use '*' for any one part, as in "
                         "'layers.*.attention.wq').")
    _check_divisible(model, resolved, tp_size)
    return resolved


def apply_plan(model: torch.nn.Module, tp_mesh: Any) -> None:
    """Split ``model`` over ``tp_mesh`` by its ``tp_plan`` (see the module's docstring), in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = getattr(model, "tp_plan", None)
    if plan is None:
        raise ValueError(
            f"ParallelismConfig(tp_size={tp_mesh.size()}) needs to know how to split {type(model).__name__}, which "
            "has no tp_plan and no DTensor parameters. Model should undergo tensor parallel before passing it to "
            "accelerate: give the model a `tp_plan` ({'layers.*.attention.wq': 'colwise', ...}, or a function "
            "(model, tp_mesh) that calls parallelize_module), or load it with transformers' "
            "from_pretrained(..., tp_plan='auto').")
    if callable(plan):
        plan(model, tp_mesh)
        return
    if not isinstance(plan, Mapping):
        raise TypeError(f"{type(model).__name__}.tp_plan must be a dict of submodule names to styles or a function "
                        f"(model, tp_mesh); got {type(plan).__name__}.")
    parallelize_module(model, tp_mesh, resolve_plan(model, plan, tp_mesh.size()))


def declared_tp_size(model: torch.nn.Module) -> int | None:
    """The tensor-parallel size a model says it was split for (``model.tp_size`` or
    ``model.config.distributed_config.tp_size``, as Accelerate reads them), or ``None``."""
    size = getattr(model, "tp_size", None)
    if size is None:
        distributed = getattr(getattr(model, "config", None), "distributed_config", None)
        size = distributed.get("tp_size") if isinstance(distributed, dict) else getattr(distributed, "tp_size", None)
    return size if isinstance(size, int) else None


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
    """Clip gradients to one total norm across every mesh their ``DTensor`` parameters live on; returns that norm
    (a plain tensor, the same on every process).

    Gradients on different meshes (a tensor-parallel weight, an FSDP2 shard, a plain replicated one) cannot go
    through one ``torch.nn.utils.clip_grad_norm_``: each group's norm is taken over its own mesh, and the total
    is the norm of the group norms.
    """
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.Tensor]] = {}  # parameters by the mesh of their gradient (None: plain tensors)
    for p in parameters:
        if p.grad is not None:
            groups.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    if not groups:
        return torch.tensor(0.0)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None], norm_type)  # all have one
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    stacked = torch.stack([n.to(norms[0].device) for n in norms])
    total = stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)
    for mesh, group in groups.items():
        local = total.to(group[0].device)
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, local if mesh is None else
                                             DTensor.from_local(local, mesh, _replicated(mesh)))
    return total


def _replicated(mesh: Any) -> list[Any]:
    from torch.distributed.tensor import Replicate

    return [Replicate()] * mesh.ndim
