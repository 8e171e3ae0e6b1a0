"""Trainer callbacks: the ``Callback`` base (with the hook timeline) and the built-ins.

Nothing here imports ``tqdm``, ``rich`` or a tracker backend at import time.
"""

from ember_packages import check_siblings

check_siblings("callbacks", __file__)  # first: a user's own file that hides a package imported below is named

from callbacks.accumulation import GradientAccumulationScheduler
from callbacks.base import Callback
from callbacks.batch_size_finder import BatchSizeFinder
from callbacks.checkpoint import ModelCheckpoint
from callbacks.device_stats import DeviceStatsMonitor
from callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from callbacks.lambda_function import LambdaCallback
from callbacks.lr_finder import LearningRateFinder
from callbacks.lr_monitor import LearningRateMonitor
from callbacks.model_summary import ModelSummary, summarize
from callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from callbacks.prediction_writer import BasePredictionWriter
from callbacks.progress import ProgressBar
from callbacks.pruning import ModelPruning
from callbacks.rich_model_summary import RichModelSummary
from callbacks.rich_progress import RichProgressBar, RichProgressBarTheme
from callbacks.spike import SpikeDetection, TrainingSpikeException
from callbacks.throughput import ThroughputMonitor
from callbacks.timer import Timer
from callbacks.tqdm_progress import TQDMProgressBar
from callbacks.weight_averaging import EMAWeightAveraging, StochasticWeightAveraging, WeightAveraging

__all__ = ["BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback",
           "DeviceStatsMonitor", "EMAWeightAveraging", "EarlyStopping", "EarlyStoppingReason",
           "GradientAccumulationScheduler", "LambdaCallback", "LearningRateFinder", "LearningRateMonitor",
           "ModelCheckpoint", "ModelPruning", "ModelSummary", "OnExceptionCheckpoint", "ProgressBar",
           "RichModelSummary", "RichProgressBar", "RichProgressBarTheme", "SpikeDetection", "StochasticWeightAveraging", "TQDMProgressBar", "ThroughputMonitor", "Timer",
           "TrainingSpikeException", "WeightAveraging", "summarize"]
