"""``Trainer(reload_dataloaders_every_n_epochs=N)``: when the loaders are asked for again, and as of which epoch.

As Lightning 2.6 (observed): the training loader is asked for again at the start of every N-th epoch (epochs
0, N, 2N, ... use a loader built at their start), before the samplers' ``set_epoch`` and ``on_train_epoch_start``;
the validation loaders at the first validation of an epoch at least N epochs after the validation (or the
sanity check, when epoch 0 validates) that last built them.

Ember's resume stays exact: the schedule is a function of the configuration and the epoch, never of what this
process happened to run, so a resumed run knows which epoch built the loaders in use at the point it resumes
from, asks for them again as of that epoch (``trainer.current_epoch`` reads that epoch inside the hook, as it did
then) and carries the restored position over to them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from trainer.state import TrainState
from trainer.states import RunningStage


@dataclass
class ReloadSchedule:
    """The epochs whose loaders serve each epoch under ``reload_dataloaders_every_n_epochs=every``.

    ``check_every``: ``check_val_every_n_epoch`` (None: validation is counted in batches, in every epoch).
    ``sanity``: whether the configuration runs a sanity check (an uninterrupted run's first validation loaders).

    Example (every 2 epochs, validation every epoch, after a sanity check):
        >>> schedule = ReloadSchedule(2, check_every=1, sanity=True)
        >>> [schedule.train_epoch(e) for e in range(5)], [schedule.val_epoch(e) for e in range(5)]
        ([0, 0, 2, 2, 4], [0.0, 0.0, 2.0, 2.0, 4.0])
        >>> schedule = ReloadSchedule(2, check_every=2, sanity=False)
        >>> [schedule.val_epoch(e) for e in (1, 3, 5)], schedule.first_val
        ([1.0, 3.0, 5.0], 1.0)
    """

    every: int
    check_every: int | None
    sanity: bool
    _val: dict[int, float] = field(default_factory=dict, repr=False)

    def validates(self, epoch: int) -> bool:
        return self.check_every is None or (epoch + 1) % self.check_every == 0

    def train_epoch(self, epoch: int) -> int:
        """The epoch whose start built the training loader used in ``epoch``."""
        return epoch - epoch % self.every

    def val_epoch(self, epoch: int) -> float:
        """The epoch that built the validation loaders used by a validation in ``epoch`` (``-inf``: none yet)."""
        if epoch not in self._val:
            # A sanity check builds them as of epoch 0 only when epoch 0 validates (Lightning does not count it
            # otherwise, and the first validation asks again).
            last = 0.0 if self.sanity and self.validates(0) else -math.inf
            for seen in range(epoch + 1):
                if self.validates(seen) and seen - last >= self.every:
                    last = float(seen)
            self._val[epoch] = last
        return self._val[epoch]

    @property
    def first_val(self) -> float:
        """The epoch the loaders asked for at set-up stand for: the sanity check's (0, or ``-inf`` when epoch 0
        does not validate, so the first validation asks again), else the first validation's (they are asked for
        once, at set-up, where Lightning asks at that validation)."""
        if self.sanity:
            return 0.0 if self.validates(0) else -math.inf
        return self.val_epoch(first_validating_epoch(self.check_every))


def first_validating_epoch(check_every: int | None) -> int:
    """The first epoch that validates under ``check_val_every_n_epoch=check_every`` (None: every epoch).

    Without a sanity check, Lightning asks for the validation loaders at that epoch's validation (and
    ``reload_dataloaders_every_n_epochs`` counts from there); Ember asks at set-up, showing that epoch.

    Example:
        >>> first_validating_epoch(None), first_validating_epoch(1), first_validating_epoch(3)
        (0, 0, 2)
    """
    return 0 if check_every is None else check_every - 1


@contextlib.contextmanager
def epoch_shown(state: TrainState | None, epoch: int) -> Iterator[None]:
    """``trainer.current_epoch`` reads ``epoch`` inside the block: a resumed run asks for the loaders of an earlier
    epoch as the uninterrupted run asked for them then (a curriculum reads the epoch in ``train_dataloader``), and
    the validation loaders asked for at set-up see the epoch of the first validation, which they serve."""
    if state is None:
        yield
        return
    current = state.epoch
    state.epoch = epoch
    try:
        yield
    finally:
        state.epoch = current


@contextlib.contextmanager
def stage_shown(state: TrainState | None, stage: str) -> Iterator[None]:
    """``state.stage`` reads ``stage`` inside the block (the sanity check's loaders are asked for at set-up, before
    it runs; Lightning asks inside it, so ``trainer.sanity_checking`` is True in ``val_dataloader``)."""
    if state is None:
        yield
        return
    current = state.stage
    state.stage = RunningStage(stage)
    try:
        yield
    finally:
        state.stage = current
