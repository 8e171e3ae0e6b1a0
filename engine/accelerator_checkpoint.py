"""The Accelerator's checkpoint API: registration of extra state and save / load pre-hooks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch.utils.hooks import RemovableHandle


class CheckpointingMixin:
    """``register_for_checkpointing`` and the save / load pre-hooks."""

    _custom_objects: list[Any]

    def _init_checkpointing(self) -> None:
        self._save_model_state_pre_hook: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self._load_model_state_pre_hook: OrderedDict[int, Callable[..., None]] = OrderedDict()

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load ``objects`` (anything with ``state_dict`` / ``load_state_dict``) with the checkpoint."""
        invalid = [f"- item at index {i}, `{type(obj).__name__}`" for i, obj in enumerate(objects)
                   if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)))]
        if invalid:
            raise ValueError("All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                             "The following inputs are invalid:\n" + "\n".join(invalid))
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before the models are written; returns a removable handle."""
        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before the models are loaded; returns a removable handle."""
        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle
