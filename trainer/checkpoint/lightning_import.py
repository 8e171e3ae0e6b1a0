"""``fit(ckpt_path=...)`` from a checkpoint Lightning wrote: weights, optimizers, schedulers, scaler, counters.

Lightning records no RNG states, loader positions or Ember run identity, so such a resume is not exact: the run
continues at the start of the epoch after the last one Lightning finished (or at the start of the epoch a
mid-epoch checkpoint was taken in), with the saved weights, optimizer and scheduler states, ``epoch`` and
``global_step``. Callback states are left alone (Lightning's callbacks record other fields than Ember's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.checkpoint.io import CheckpointError
from trainer.checkpoint.lightning_format import SCALER_KEY
from trainer.state import TrainState


@dataclass(frozen=True)
class Position:
    """Where a run resumed from a Lightning checkpoint starts: the epoch, and the counters so far."""

    epoch: int
    global_step: int
    batches: int  # training batches processed so far (Ember's micro_step)


def position_of(checkpoint: dict[str, Any]) -> Position:
    """The start of the next epoch Lightning had not finished training, from its ``loops`` record (or, for a file
    without one, the epoch after ``epoch``, as Lightning's own ``ModelCheckpoint`` saves at an epoch's end).

    >>> position_of({"epoch": 3, "global_step": 40})
    Position(epoch=4, global_step=40, batches=40)
    """
    step = int(checkpoint.get("global_step", 0))
    fit = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    epochs = (fit.get("epoch_progress") or {}).get("current") or {}
    batches = ((fit.get("epoch_loop.batch_progress") or {}).get("total") or {}).get("completed", step)
    if "processed" in epochs:  # the epochs whose training batches all ran (their end hooks may not have)
        return Position(int(epochs["processed"]), step, int(batches))
    return Position(int(checkpoint.get("epoch", -1)) + 1, step, int(batches))


def restore_lightning(checkpoint: dict[str, Any], path: str, module: torch.nn.Module, optimizers: Sequence[Any],
                      schedulers: Sequence[Any], scaler: Any, state: TrainState) -> Position:
    """Load a Lightning checkpoint into the run's parts; returns where the run continues.

    Raises:
        CheckpointError: it holds no optimizer states (a weights-only file), or other counts of optimizers or
            schedulers than this run configured.
    """
    if "optimizer_states" not in checkpoint:
        raise CheckpointError(f"{path} holds no optimizer states (a weights-only checkpoint): it cannot resume a "
                              "run. Load the weights with Module.load_from_checkpoint and start a new fit.")
    saved_optimizers, saved_schedulers = checkpoint["optimizer_states"], checkpoint.get("lr_schedulers", [])
    if len(saved_optimizers) != len(optimizers) or len(saved_schedulers) != len(schedulers):
        raise CheckpointError(
            f"{path} holds {len(saved_optimizers)} optimizer(s) and {len(saved_schedulers)} scheduler(s), but "
            f"configure_optimizers returned {len(optimizers)} and {len(schedulers)}: resume with the same "
            "configure_optimizers as the run that saved it.")
    module.load_state_dict(checkpoint["state_dict"], strict=getattr(module, "strict_loading", None) is not False)
    for optimizer, saved in zip(optimizers, saved_optimizers):
        optimizer.load_state_dict(saved)
    for scheduler, saved in zip(schedulers, saved_schedulers):
        scheduler.load_state_dict(saved)
    if scaler is not None and checkpoint.get(SCALER_KEY):
        scaler.load_state_dict(checkpoint[SCALER_KEY])
    position = position_of(checkpoint)
    state.epoch, state.batch_in_epoch = position.epoch, 0
    state.global_step, state.micro_step = position.global_step, position.batches
    return position
