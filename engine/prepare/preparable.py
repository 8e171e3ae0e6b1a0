"""What ``Accelerator.prepare`` accepts: the inputs it refuses early (a Dataset, a container of objects) and how
it tells a learning-rate scheduler."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader


def check_preparable(obj: Any) -> None:
    """Raise for the inputs that are almost always a mistake: a Dataset instead of a DataLoader, or a container of
    models / optimizers / loaders (prepare would return it untouched and training would run unprepared)."""
    if isinstance(obj, torch.utils.data.Dataset):
        raise TypeError(f"prepare() got a {type(obj).__name__} (a Dataset), which it cannot shard: wrap it in a "
                        "torch.utils.data.DataLoader(dataset, batch_size=...) and prepare the loader.")
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    kinds = (DataLoader, torch.nn.Module, torch.optim.Optimizer)
    if any(isinstance(item, kinds) or is_scheduler(item) for item in items):
        raise TypeError(f"prepare() got a {type(obj).__name__} holding models/optimizers/loaders, which it cannot "
                        "prepare as a whole: pass them as separate arguments, e.g. prepare(*objects).")


def is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))
