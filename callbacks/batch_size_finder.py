"""`BatchSizeFinder`: Lightning's batch-size search as a callback (``Tuner.scale_batch_size`` when a run starts)."""

from __future__ import annotations

import torch

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView

_STAGES = ("fit", "validate", "test", "predict")


class BatchSizeFinder(Callback):
    """Find the largest batch size that runs without running out of memory, then run with it.

    When ``fit`` / ``validate`` / ``test`` / ``predict`` is set up, the size is searched on that run's data (a
    short-lived trainer with your trainer's settings runs ``steps_per_trial`` batches per size; the module's
    weights and the random state are restored afterwards), written to ``batch_arg_name`` (on the module, its
    hparams, the data module or its hparams: every one that holds it) and kept in ``optimal_batch_size``; the
    run's loaders are then built with it. The data must come from the module's or data module's
    ``*_dataloader()``, which must read the attribute.

    Ember builds a run's loaders before ``on_fit_start`` (Lightning after it), so the search runs in ``setup``;
    override ``search_on(stage)`` to choose the stages, and call ``scale_batch_size(trainer, module, method)``
    yourself for other times (the attribute changes; the loaders of a run already set up do not).

    Args:
        mode: ``"power"`` (double until out of memory) or ``"binsearch"`` (then bisect).
        steps_per_trial: batches run per size.
        init_val: the first size tried.
        max_trials: trials (``"power"``) or trials that fit (``"binsearch"``) before stopping.
        batch_arg_name: the attribute holding the size.
        margin: ``"binsearch"`` returns this fraction less than the size found (a safety buffer).
        max_val: the largest size considered.

    Example:
        >>> finder = BatchSizeFinder(mode="binsearch", max_trials=6)
        >>> finder.optimal_batch_size
        2
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                 batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> None:
        lowered = mode.lower() if isinstance(mode, str) else mode
        if lowered not in self.SUPPORTED_MODES:
            raise ValueError(f"`mode` should be either of {self.SUPPORTED_MODES}. Received: mode={mode!r}.")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
            raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin!r}.")
        self.optimal_batch_size: int | None = init_val
        self._mode = lowered
        self._steps_per_trial = steps_per_trial
        self._init_val = init_val
        self._max_trials = max_trials
        self._batch_arg_name = batch_arg_name
        self._margin = margin
        self._max_val = max_val

    def search_on(self, stage: str) -> bool:
        """Whether to search when ``stage`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``) is set up."""
        return stage in _STAGES

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str | None = None) -> None:
        if trainer.world_size > 1:
            raise MisconfigurationException("The Batch size finder is not supported with distributed strategies "
                                            f"(this run has {trainer.world_size} processes): an out-of-memory trial "
                                            "on one rank would end the others. Find the size on one device.")
        if stage is not None and self.search_on(stage):
            self.scale_batch_size(trainer, pl_module, stage)

    def scale_batch_size(self, trainer: TrainerView, pl_module: torch.nn.Module, method: str = "fit") -> None:
        """Search now, on the data ``method`` runs on; the size goes to the attribute and ``optimal_batch_size``."""
        self.optimal_batch_size = trainer.scale_batch_size(
            pl_module, method, mode=self._mode, steps_per_trial=self._steps_per_trial, init_val=self._init_val,
            max_trials=self._max_trials, batch_arg_name=self._batch_arg_name, margin=self._margin,
            max_val=self._max_val)
