"""Lightning's ``lightning.pytorch.core`` names: ``LightningModule`` / ``LightningDataModule`` (aliases of
``TrainModule`` / ``DataModule``) and ``LightningOptimizer``.

Example:
    >>> from trainer.core import LightningModule
    >>> from trainer import TrainModule
    >>> LightningModule is TrainModule
    True
"""

from trainer.datamodule import DataModule
from trainer.hparams import AttributeDict
from trainer.module import TrainModule
from trainer.optim import LightningOptimizer

LightningModule = TrainModule
LightningDataModule = DataModule

__all__ = ["AttributeDict", "LightningDataModule", "LightningModule", "LightningOptimizer"]
