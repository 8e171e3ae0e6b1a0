"""Pickling a ``Trainer`` (Lightning's pickle, e.g. to hand one to another process or to ``copy.deepcopy`` it).

A Trainer pickles as what builds it again: its keywords (``trainer.config``, with the callbacks and loggers,
which pickle themselves) and its counters (``TrainState``). Its live parts (the engine's processes and devices,
prepared loaders, an open run's trackers) are rebuilt by the copy's constructor, as a new Trainer would build them:
they belong to a process, not to the configuration. A Trainer inside a run refuses, as a half-run cannot be copied.
"""

from __future__ import annotations

import pickle
from typing import Any

from trainer.config import UNSET
from trainer.states import TrainerStatus


def reduce_trainer(trainer: Any) -> tuple[Any, tuple[type, dict[str, Any], dict[str, Any]]]:
    """``Trainer.__reduce__``: rebuild from the keywords, then restore the counters."""
    if trainer.state.status == TrainerStatus.RUNNING:
        raise pickle.PicklingError("A Trainer pickles between runs, not inside fit / validate / test / predict "
                                   f"(its status is {trainer.state.status.value!r}): pickle it before or after.")
    # Keywords left unset stay out: the copy's constructor resolves them again (the sentinel is one object).
    keywords = {name: value for name, value in trainer.config.keywords().items() if value is not UNSET}
    return rebuild_trainer, (type(trainer), keywords, trainer.state.state_dict())


def rebuild_trainer(cls: type, keywords: dict[str, Any], state: dict[str, Any]) -> Any:
    """A ``cls`` (the Trainer class or a subclass) built from ``keywords``, with the counters ``state`` (what
    ``reduce_trainer`` pickled)."""
    copy = cls(**keywords)
    copy.state.load_state_dict(state)
    return copy
