"""``PreparedObjects``: what an Accelerator prepared or was asked to checkpoint, in the order it saw them.

One owner for these lists: ``prepare`` adds to them, ``save_state`` / ``load_state`` read them (as Accelerate's
``_models``... do, in the same order, so a checkpoint's files keep Accelerate's numbering), ``free_memory``
empties them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from engine.prepare.optimizer import AcceleratedOptimizer
from engine.prepare.parallel import unwrap
from engine.prepare.scheduler import AcceleratedScheduler


class PreparedObjects:
    """The models (pre-wrapper modules), optimizers, schedulers, data loaders and registered objects of one run.

    >>> registry = PreparedObjects()
    >>> registry.register(torch.nn.Linear(2, 1))
    >>> len(registry.models), registry.custom
    (1, [])
    """

    def __init__(self) -> None:
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[AcceleratedOptimizer] = []
        self.schedulers: list[AcceleratedScheduler] = []
        self.dataloaders: list[DataLoader] = []
        self.custom: list[Any] = []  # register_for_checkpointing: kept by clear(), as in Accelerate

    def register(self, obj: Any) -> None:
        """Record an object prepared already (by this Accelerator or another) once, in its own list."""
        registry: list[Any] | None = None
        if isinstance(obj, AcceleratedOptimizer):
            registry = self.optimizers
        elif isinstance(obj, AcceleratedScheduler):
            registry = self.schedulers
        elif isinstance(obj, DataLoader):
            registry = self.dataloaders
        elif isinstance(obj, torch.nn.Module):
            registry, obj = self.models, unwrap(obj, keep_torch_compile=False)
        if registry is not None and not any(o is obj for o in registry):
            registry.append(obj)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load ``objects`` (anything with ``state_dict`` / ``load_state_dict``) with the checkpoint."""
        invalid = [f"- item at index {i}, `{type(obj).__name__}`" for i, obj in enumerate(objects)
                   if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)))]
        if invalid:
            raise ValueError("All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                             "The following inputs are invalid:\n" + "\n".join(invalid))
        self.custom.extend(objects)

    def replace_dataloaders(self, old: list[DataLoader], new: list[DataLoader]) -> None:
        """Put the prepared loaders ``new`` in the places of ``old`` (``new`` leaves wherever ``prepare`` put it).

        A loop that rebuilds its loaders (Lightning's ``reload_dataloaders_every_n_epochs``) keeps a checkpoint's
        loader numbering: the saved position of loader ``i`` must land on the loader now in that place.

        >>> registry, a, b = PreparedObjects(), DataLoader(range(2)), DataLoader(range(2))
        >>> registry.register(a); registry.register(b)
        >>> registry.replace_dataloaders([a], [b]); registry.dataloaders == [b]
        True
        """
        if len(old) != len(new):
            raise ValueError(f"replace_dataloaders: {len(old)} loader(s) to replace but {len(new)} replacement(s): "
                             "pass one new loader per old one.")
        fresh = [loader for loader in self.dataloaders if not any(loader is n for n in new)]
        for before, after in zip(old, new):
            index = next((i for i, loader in enumerate(fresh) if loader is before), None)
            if index is None:
                raise ValueError(f"replace_dataloaders: {type(before).__name__} {before!r:.60} was not prepared by "
                                 "this Accelerator: only its prepared loaders can be replaced.")
            fresh[index] = after
        self.dataloaders[:] = fresh

    def clear(self) -> None:
        """Forget every prepared object; registered objects stay (Accelerate's ``free_memory``)."""
        self.models.clear()
        self.optimizers.clear()
        self.schedulers.clear()
        self.dataloaders.clear()

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether any optimizer skipped its last step (an fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self.optimizers)
