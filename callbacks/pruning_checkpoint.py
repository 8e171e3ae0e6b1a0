"""Checkpoints of a module pruned with ``torch.nn.utils.prune`` hold its plain masked weights; the masks go apart.

A pruned ``weight`` becomes a parameter ``weight_orig`` and a buffer ``weight_mask`` (the forward uses their
product). ``ModelPruning`` registers two hooks on every module it prunes:

- ``fold_pruned`` (a ``state_dict`` post-hook): ``weight_orig`` and ``weight_mask`` leave the state dict and
  ``weight = weight_orig * weight_mask`` takes their place, so a checkpoint loads into the unpruned module
  (``load_from_checkpoint``, ``validate(ckpt_path=...)``) and has the unpruned module's parameter names;
- ``unfold_pruned`` (a ``load_state_dict`` pre-hook): loading such a ``weight`` into a module that is pruned now
  fills ``weight_orig`` and keeps the module's own mask (swapping weights in and out keeps working).

``masks_of`` / ``restore_masks`` carry the masks in the callback's checkpoint state: a resumed run prunes the
loaded weights with them again, so it goes on exactly as the interrupted one (the entries a mask hides are zero in
the checkpoint; the forward never reads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn
from torch.utils.hooks import RemovableHandle

ParameterRef = tuple[nn.Module, str]


def pruned_names(module: nn.Module) -> list[str]:
    """The names of ``module``'s own tensors that are pruned now (``<name>_orig`` and ``<name>_mask`` exist).

    Example:
        >>> layer = nn.Linear(3, 2)
        >>> _ = torch_prune.l1_unstructured(layer, "weight", amount=0.5)
        >>> pruned_names(layer)
        ['weight']
    """
    parameters = dict(module.named_parameters(recurse=False))
    buffers = dict(module.named_buffers(recurse=False))
    return [name[:-len("_orig")] for name in parameters
            if name.endswith("_orig") and name[:-len("_orig")] + "_mask" in buffers]


def fold_pruned(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """``state_dict`` post-hook: ``<name>_orig`` and ``<name>_mask`` become ``<name>`` (their product).

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> _ = layer.register_state_dict_post_hook(fold_pruned)
        >>> _ = torch_prune.l1_unstructured(layer, "weight", amount=2)
        >>> sorted(layer.state_dict()), int((layer.state_dict()["weight"] == 0).sum())
        (['bias', 'weight'], 2)
    """
    for name in pruned_names(module):
        orig, mask = state_dict.pop(prefix + name + "_orig", None), state_dict.pop(prefix + name + "_mask", None)
        if orig is not None and mask is not None:
            state_dict[prefix + name] = orig * mask.to(dtype=orig.dtype)


def unfold_pruned(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                  missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
    """``load_state_dict`` pre-hook: a plain ``<name>`` loads into a pruned module's ``<name>_orig`` (its own mask
    is kept: the loaded values are already masked)."""
    for name in pruned_names(module):
        key = prefix + name
        if key in state_dict and key + "_orig" not in state_dict:
            state_dict[key + "_orig"] = state_dict.pop(key)
            state_dict.setdefault(key + "_mask", getattr(module, name + "_mask"))


def keep_checkpoints_plain(modules: Sequence[nn.Module]) -> list[RemovableHandle]:
    """Register ``fold_pruned`` and ``unfold_pruned`` once on each of ``modules``; returns the handles."""
    handles: list[RemovableHandle] = []
    seen: set[int] = set()
    for module in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        handles.append(module.register_state_dict_post_hook(fold_pruned))
        handles.append(module.register_load_state_dict_pre_hook(unfold_pruned))
    return handles


def masks_of(targets: Sequence[ParameterRef]) -> dict[int, torch.Tensor]:
    """The masks of the pruned ones among ``targets``, by index (for a checkpoint: on the CPU)."""
    return {index: getattr(module, name + "_mask").detach().cpu().clone()
            for index, (module, name) in enumerate(targets) if name in pruned_names(module)}


def restore_masks(targets: Sequence[ParameterRef], masks: dict[Any, torch.Tensor]) -> None:
    """Prune ``targets`` with the saved ``masks`` (by index), where the module is not pruned already (another
    ``ModelPruning`` on the same parameters restored the same mask)."""
    for key, mask in masks.items():
        index = int(key)
        if index >= len(targets):
            raise ValueError(f"ModelPruning: the checkpoint holds a mask for parameter #{index}, but this run prunes "
                             f"{len(targets)} parameters. Resume with the parameters_to_prune of the saved run.")
        module, name = targets[index]
        if name in pruned_names(module):
            continue
        current = getattr(module, name)
        if tuple(current.shape) != tuple(mask.shape):
            raise ValueError(f"ModelPruning: the saved mask of {type(module).__name__}.{name} has shape "
                             f"{tuple(mask.shape)}, the parameter {tuple(current.shape)}. Resume with the module "
                             "the checkpoint was saved from.")
        torch_prune.custom_from_mask(module, name, mask.to(current.device))
