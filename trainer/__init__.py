"""Ember's trainer: a Lightning-style ``Trainer`` driving a ``TrainModule`` through the engine.

The names of ``lightning.pytorch`` live here too (``LightningModule`` / ``LightningDataModule`` are aliases of
``TrainModule`` / ``DataModule``, ``seed_everything``, ``Callback``), so ``import lightning.pytorch as pl`` ports
as ``import trainer as pl``. Importing it is cheap: no tracker backend, no ``tqdm``, nothing beyond ``torch`` and
the engine.
"""

from ember_packages import check_siblings

check_siblings("trainer", __file__)  # first: a user's own file that hides a package imported below is named

from callbacks import Callback
from trainer.datamodule import DataModule
from trainer.hparams import AttributeDict
from trainer.loop.signals import Interrupted, Preempted
from trainer.module import TrainModule
from trainer.optim import LightningOptimizer, SchedulerConfig
from trainer.state import TrainState
from trainer.trainer import Trainer
from trainer.tuner import Tuner
from trainer.utilities.seed import seed_everything

LightningModule = TrainModule
LightningDataModule = DataModule

__all__ = ["AttributeDict", "Callback", "DataModule", "Interrupted", "LightningDataModule", "LightningModule",
           "LightningOptimizer", "Preempted", "SchedulerConfig", "TrainModule", "TrainState", "Trainer", "Tuner",
           "seed_everything"]
