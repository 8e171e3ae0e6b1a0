"""`BasePredictionWriter`: write ``predict_step`` outputs as they come (or once per run), on every process.

Lightning's callback, with the same hooks and arguments. Each process writes its own share of the samples and
knows, for every batch, which dataset indices it holds (``batch_indices``), so the files of all processes
together cover the dataset. Unlike Lightning (whose ``DistributedSampler`` pads the last round with repeated
samples and hands them to the writer), the samples the engine repeats to even out the last round are cut from
the prediction and from ``batch_indices`` first: every sample is written exactly once across processes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView
from engine.data.dispatch import DataLoaderDispatcher
from engine.operations import first_samples, sample_count

WRITE_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Base class of callbacks that store predictions: override ``write_on_batch_end`` and/or ``write_on_epoch_end``.

    Args:
        write_interval: ``"batch"`` calls ``write_on_batch_end`` after every ``predict_step``; ``"epoch"`` calls
            ``write_on_epoch_end`` once with all of this process's predictions; ``"batch_and_epoch"`` both.

    ``batch_indices`` are the dataset indices of the samples in a batch, as the prepared loader drew them (also
    when it shuffles); ``None`` for an iterable dataset or with ``dispatch_batches``.

    Example:
        >>> import os, tempfile
        >>> class TorchWriter(BasePredictionWriter):
        ...     def __init__(self, folder: str) -> None:
        ...         super().__init__(write_interval="batch")
        ...         self.folder = folder
        ...     def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx,
        ...                            dataloader_idx):
        ...         name = f"rank{trainer.global_rank}_dl{dataloader_idx}_batch{batch_idx}.pt"
        ...         torch.save({"indices": batch_indices, "prediction": prediction}, os.path.join(self.folder, name))
        >>> TorchWriter(tempfile.mkdtemp()).interval
        'batch'
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in WRITE_INTERVALS:
            # Lightning's exception and the start of its text ("`write_interval` should be one of [...]").
            raise MisconfigurationException(f"`write_interval` should be one of {list(WRITE_INTERVALS)}. "
                                            f"BasePredictionWriter received: {write_interval!r}.")
        self.interval = write_interval
        self._seen: dict[int, list[Any] | None] = {}
        self._predictions: list[list[Any]] = []
        self._epoch_indices: list[list[list[int]]] = []

    @property
    def _on_batch(self) -> bool:
        return self.interval in ("batch", "batch_and_epoch")

    @property
    def _on_epoch(self) -> bool:
        return self.interval in ("epoch", "batch_and_epoch")

    # -- what subclasses override ------------------------------------------------------------------------------
    def write_on_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        """Write one batch's prediction (``write_interval`` ``"batch"`` / ``"batch_and_epoch"``)."""
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) writes after every "
                                  "batch: override write_on_batch_end(self, trainer, module, prediction, "
                                  "batch_indices, batch, batch_idx, dataloader_idx).")

    def write_on_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:
        """Write all of this process's predictions at once (``"epoch"`` / ``"batch_and_epoch"``).

        ``predictions`` is the list of per-batch predictions (a list of such lists with several loaders, as in
        Lightning); ``batch_indices`` is always one list per loader of per-batch index lists.
        """
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) writes at the end: "
                                  "override write_on_epoch_end(self, trainer, module, predictions, batch_indices).")

    # -- hooks -------------------------------------------------------------------------------------------------
    def on_predict_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._seen = {}  # no recording of an earlier run that ended early (an exception) is taken for this one

    def on_predict_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        loaders = _flat(trainer.predict_dataloaders)
        # One recording per loader for every writer of the run: starting one restarts the loader's list, which
        # would leave an earlier writer's empty (its batch_indices None), so a writer that comes later reads it.
        running = next((w._seen for w in trainer.callbacks
                        if isinstance(w, BasePredictionWriter) and w is not self and w._seen), None)
        self._seen = running if running is not None else {i: _recorder(loader) for i, loader in enumerate(loaders)}
        self._predictions = [[] for _ in loaders]
        self._epoch_indices = [[] for _ in loaders]

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        indices = self._next_indices(trainer, dataloader_idx, batch_idx)
        outputs, indices = _without_padding(trainer, outputs, indices)
        if self._on_batch:
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)
        if self._on_epoch:
            self._predictions[dataloader_idx].append(_to_cpu(outputs))
            self._epoch_indices[dataloader_idx].append(list(indices) if indices is not None else [])

    def on_predict_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._on_epoch:
            predictions: Sequence[Any] = self._predictions[0] if len(self._predictions) == 1 else self._predictions
            self.write_on_epoch_end(trainer, pl_module, predictions, self._epoch_indices)
        for i, seen in self._seen.items():
            if seen is not None:
                _flat(trainer.predict_dataloaders)[i].record_batch_indices(False)
        self._predictions, self._epoch_indices, self._seen = [], [], {}

    # -- batch indices -----------------------------------------------------------------------------------------
    def _next_indices(self, trainer: TrainerView, dataloader_idx: int, batch_idx: int) -> list[int] | None:
        seen = self._seen.get(dataloader_idx)
        if seen is None or batch_idx >= len(seen):
            return None
        indices = seen[batch_idx]
        return [int(i) for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices)]


def _recorder(loader: Any) -> list[Any] | None:
    """Start recording ``loader``'s index batches (None: it has no per-process indices to record)."""
    if isinstance(loader, DataLoaderDispatcher) or isinstance(getattr(loader, "dataset", None), IterableDataset):
        return None  # the main process draws every batch and slices it; an iterable dataset has no indices
    record = getattr(loader, "record_batch_indices", None)
    return record() if record is not None else None


def _without_padding(trainer: TrainerView, prediction: Any, indices: list[int] | None) -> tuple[Any, list[int] | None]:
    """Cut the samples the engine repeated to even out the last round (this process's part of them)."""
    accelerator = trainer.accelerator
    state = accelerator.gradient_state
    if accelerator.num_processes == 1 or not state.end_of_dataloader or state.remainder <= 0:
        return prediction, indices
    count = len(indices) if indices is not None else sample_count(prediction)
    if count is None:
        return prediction, indices
    # The round's samples, in rank order, are real up to `remainder` (see trainer/evaluation/predict.py).
    keep = max(0, min(count, state.remainder - accelerator.process_index * count))
    if keep == count:
        return prediction, indices
    return first_samples(prediction, keep), None if indices is None else indices[:keep]


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        kind: Callable[..., Any] = type(value)  # the mapping's own class (dict, OrderedDict...): it takes a dict
        return kind({k: _to_cpu(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _flat(loaders: Any) -> list[Any]:
    """The predict loaders in order (``trainer.predict_dataloaders`` has the shape they were given in: one
    loader, or a list / tuple / dict of them)."""
    if isinstance(loaders, dict):
        return [leaf for value in loaders.values() for leaf in _flat(value)]
    if isinstance(loaders, (list, tuple)):
        return [leaf for value in loaders for leaf in _flat(value)]
    return [] if loaders is None else [loaders]