"""Lightning's batch-transfer hooks: ``on_before_batch_transfer`` -> ``transfer_batch_to_device`` ->
``on_after_batch_transfer``, called on every batch when the module (or the data module) overrides one of them.

Without an override nothing is added to the loop: the prepared loaders move batches to the device themselves.
With one, the loaders leave batches where collation put them and the hooks move them, in Lightning's order, before
``on_train_batch_start`` (``dataloader_idx`` 0 in training, the loader's position in evaluation). A data module's
override is used over the module's, as in Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainer.data_hooks import DataHooks
from trainer.loop.hooks import overrides, overrides_unwrapped

HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
Transfer = Callable[[Any, int], Any]


def batch_transfer(module: Any, datamodule: Any, device: torch.device) -> Transfer | None:
    """The function that runs the three hooks on a batch, or None when neither object overrides any of them."""
    owners = [datamodule, module] if datamodule is not None else [module]
    chosen = {}
    for hook in HOOKS:
        # Lightning takes the data module's hook only where it overrides it (a recording wrapper of its own hook
        # does not count), and the module's always; Ember runs them only if one is the user's (any instance value
        # of the module's counts, a wrapper included: Lightning would call it).
        owner = next((o for o in owners if isinstance(o, DataHooks) and (
            overrides(o, DataHooks, hook) if o is module else overrides_unwrapped(o, DataHooks, hook))), None)
        chosen[hook] = owner
    if all(owner is None for owner in chosen.values()):
        return None
    before = (chosen["on_before_batch_transfer"] or module).on_before_batch_transfer
    move = (chosen["transfer_batch_to_device"] or module).transfer_batch_to_device
    after = (chosen["on_after_batch_transfer"] or module).on_after_batch_transfer

    def transfer(batch: Any, dataloader_idx: int) -> Any:
        batch = before(batch, dataloader_idx)
        batch = move(batch, device, dataloader_idx)
        return after(batch, dataloader_idx)

    return transfer


def transferred(numbered: Iterator[tuple[int, Any]], transfer: Transfer | None,
                dataloader_idx: int) -> Iterator[tuple[int, Any]]:
    """``(batch_idx, batch)`` pairs with the hooks applied (``numbered`` itself without hooks: no added cost)."""
    if transfer is None:
        return numbered
    return ((batch_idx, transfer(batch, dataloader_idx)) for batch_idx, batch in numbered)
