"""Lightning's ``lightning.pytorch.loggers`` names, each a thin view over one of Ember's trackers.

``Trainer(logger=CSVLogger("logs"))`` hands the logger's tracker to the engine: ``self.log`` values and the
logger's own ``log_metrics`` go through that one tracker. Nothing here imports a backend until a run opens.
"""

from trainer.loggers.comet import CometLogger
from trainer.loggers.csv_logs import CSVLogger
from trainer.loggers.litlogger import LitLogger
from trainer.loggers.logger import DummyExperiment, DummyLogger, Logger
from trainer.loggers.mlflow import MLFlowLogger
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "CometLogger", "DummyExperiment", "DummyLogger", "LitLogger", "Logger", "MLFlowLogger",
           "TensorBoardLogger", "WandbLogger"]
