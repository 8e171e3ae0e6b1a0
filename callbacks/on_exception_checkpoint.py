"""`OnExceptionCheckpoint`: keep the module's weights when a run fails (Lightning's callback of that name)."""

from __future__ import annotations

import os
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView


class OnExceptionCheckpoint(Callback):
    """When fit / validate / test / predict raises, save the module's weights to ``{dirpath}/{filename}.ckpt``.

    The weights only (``trainer.save_checkpoint(..., weights_only=True)``; load them with
    ``Module.load_from_checkpoint``): a complete checkpoint taken where the exception struck would not resume
    exactly (the failing batch was already drawn from the loader). To resume after a failure, use
    ``ckpt_path="last"`` with a ``ModelCheckpoint``; a preemption signal is already saved at a step boundary by the
    Trainer itself. With several processes nothing is saved (a failing process cannot wait for the others).

    Args:
        dirpath: the folder to save into.
        filename: the checkpoint's name, without the extension.

    Example:
        >>> OnExceptionCheckpoint(dirpath="/runs/x").ckpt_path
        '/runs/x/on_exception.ckpt'
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        self.dirpath = os.path.abspath(os.path.expanduser(os.fspath(dirpath)))
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def on_exception(self, trainer: TrainerView, pl_module: torch.nn.Module,
                     exception: BaseException) -> None:
        if trainer.world_size == 1:
            trainer.save_checkpoint(self.ckpt_path, weights_only=True)

    def state_dict(self) -> dict[str, Any]:
        return {}
