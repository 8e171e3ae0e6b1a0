"""Callback states restored before the optimizers' (Lightning's order, for the callbacks that need it).

Lightning restores every callback's state, then builds the optimizers, then loads their states; a callback may
change the optimizers in between (``BaseFinetuning`` adds back the parameter groups it had added, so the saved
optimizer state, which has them, fits). The engine loads a checkpoint in one pass, the trainer's entry (with the
callbacks' states) after the optimizers. So, for the callbacks that declare ``restores_before_optimizers``, the
checkpoint's callback states are read first and given to them, before the engine loads it; the engine then
gives them the same states again (setting them twice changes nothing). Other runs read nothing more.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.checkpoint import ckpt_file
from trainer.checkpoint.ckpt_file import EMBER_KEY
from trainer.checkpoint.lightning_format import trainer_entry


def saved_callback_states(path: str, unpickle: bool) -> dict[str, Any] | None:
    """The callbacks' states in the checkpoint at ``path`` (an Ember ``.ckpt`` file or folder), or None where it
    has none to give (a Lightning file, a weights-only folder, one that does not read: the real load reports
    it)."""
    from trainer.checkpoint.loading import read_entry  # loading imports the module classes' dependencies

    try:
        if os.path.isfile(path):
            checkpoint = ckpt_file.load(path, unpickle=unpickle, mmap=True)
            ember = checkpoint.get(EMBER_KEY)
            entry = trainer_entry(ember.get("custom", [])) if isinstance(ember, dict) else None
        else:
            entry = read_entry(path, unpickle)
    except Exception:  # noqa: BLE001 - any reading failure: the engine's load says what is wrong with the file
        return None
    states = (entry or {}).get("trainer", {}).get("callbacks")
    return states if isinstance(states, dict) else None


def restore_early(callbacks: list[Any], path: str, unpickle: bool) -> None:
    """Give the callbacks that declare ``restores_before_optimizers`` their state from ``path`` now."""
    early = [c for c in callbacks if getattr(c, "restores_before_optimizers", False)]
    if not early:
        return
    states = saved_callback_states(path, unpickle)
    if not states:
        return
    from trainer.checkpoint.entry import saved_key

    for callback in early:
        key = saved_key(callback, states)
        if key is not None:
            callback.load_state_dict(states[key])
