"""Experiment trackers: `GeneralTracker` and the built-ins (csv, tensorboard, wandb, comet_ml, mlflow), plus
`LitLoggerTracker` (the Lightning AI platform, behind Lightning's ``LitLogger``; not a ``log_with`` name).

Nothing here imports a tracking backend: each tracker imports its package in ``start()``. This package imports
nothing from the rest of Ember (``engine`` builds on it, not the other way round).
"""

from trackers.base import GeneralTracker
from trackers.comet_tracker import CometMLTracker
from trackers.csv_tracker import CSVTracker
from trackers.litlogger_tracker import LitLoggerTracker
from trackers.mlflow_tracker import MLflowTracker
from trackers.registry import (
    BUILTIN_TRACKERS,
    available_trackers,
    get_tracker_class,
    is_installed,
    known_trackers,
    register_tracker_class,
    require_installed,
    unregister_tracker_class,
)
from trackers.tensorboard_tracker import TensorBoardTracker
from trackers.values import check_values, group_values, normalize_values
from trackers.wandb_tracker import WandBTracker

__all__ = [
    "BUILTIN_TRACKERS",
    "CSVTracker",
    "CometMLTracker",
    "GeneralTracker",
    "LitLoggerTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "WandBTracker",
    "available_trackers",
    "check_values",
    "get_tracker_class",
    "group_values",
    "is_installed",
    "known_trackers",
    "normalize_values",
    "register_tracker_class",
    "require_installed",
    "unregister_tracker_class",
]
