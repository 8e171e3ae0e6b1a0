"""Ember's trainer: a Lightning-style ``Trainer`` driving a ``TrainModule`` through the engine.

Importing it is cheap: no tracker backend, no ``tqdm``, nothing beyond ``torch`` and the engine.
"""

from trainer.datamodule import DataModule
from trainer.hparams import AttributeDict
from trainer.module import TrainModule
from trainer.optim import SchedulerConfig
from trainer.state import TrainState
from trainer.trainer import Trainer

__all__ = ["AttributeDict", "DataModule", "SchedulerConfig", "TrainModule", "TrainState", "Trainer"]
