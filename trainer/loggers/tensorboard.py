"""`TensorBoardLogger`: Lightning's TensorBoard logger as a view over Ember's ``TensorBoardTracker``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from trackers import TensorBoardTracker
from trainer.core.saving import save_hparams_to_yaml
from trainer.loggers.logger import VersionedLogger, check_prefix, convert_params
from trainer.utilities.rank_zero import rank_zero_only, rank_zero_warn


class TensorBoardLogger(VersionedLogger):
    """Event files in ``{save_dir}/{name}/version_{N}[/{sub_dir}]`` (Lightning's layout).

    Args:
        save_dir / name / version: as ``CSVLogger``.
        log_graph: ``log_graph(model)`` adds the model graph (from ``model.example_input_array``).
        default_hp_metric: ``log_hyperparams`` without metrics also logs ``hp_metric = -1``, as in Lightning, so
            the hparams tab has a column to fill later.
        prefix: not supported (a clear error).
        sub_dir: a sub-folder of the version folder.
        **kwargs: passed to ``torch.utils.tensorboard.SummaryWriter``.

    Example:
        >>> import tempfile
        >>> logger = TensorBoardLogger(tempfile.mkdtemp(), name="exp")
        >>> logger.log_dir.endswith(os.path.join("exp", "version_0"))
        True
    """

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None = "lightning_logs",
                 version: int | str | None = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        check_prefix("TensorBoardLogger", prefix)
        super().__init__(save_dir, name, version, sub_dir)
        self._log_graph = bool(log_graph)
        self._default_hp_metric = bool(default_hp_metric)
        self._writer_kwargs = kwargs

    NAME_HPARAMS_FILE = "hparams.yaml"  # Lightning's file name (its tests and scripts read the attribute)

    @property
    def hparams(self) -> dict[str, Any]:
        """The hyper-parameters logged so far (what ``hparams.yaml`` holds)."""
        return dict(getattr(self._tracker, "logged_hparams", {}))

    def save(self) -> None:
        """Write ``hparams.yaml`` if the version folder exists and the file does not yet (Lightning's ``save``)."""
        if rank_zero_only.rank == 0 and isinstance(self._tracker, LightningTensorBoardTracker):
            self._tracker.save_hparams_file()

    def _restored_dir(self) -> str | None:
        return getattr(self._tracker, "log_dir", None)

    @property
    def experiment(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter`` (rank 0)."""
        return super().experiment

    def log_hyperparams(self, params: Any = None, metrics: Mapping[str, Any] | float | None = None,
                        step: int | None = None) -> None:
        """The configuration into the hparams plugin; ``metrics`` (a dict, or one number: ``hp_metric``; default
        ``hp_metric = -1`` with ``default_hp_metric``) as its first values, through ``log_metrics`` at ``step``."""
        if rank_zero_only.rank != 0:
            return
        self._open().store_init_configuration(convert_params(params))
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if metrics:
            self.log_metrics(metrics, step)  # positional, as Lightning's (a patched log_metrics sees this call)

    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        """Add ``model``'s graph, traced on ``input_array`` (default ``model.example_input_array``)."""
        if not self._log_graph or rank_zero_only.rank != 0:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            rank_zero_warn("TensorBoardLogger(log_graph=True) could not log the graph: the model has no "
                           "`example_input_array`; set it in __init__ or call logger.log_graph(model, input).")
            return
        self.experiment.add_graph(model, input_array)

    def _build_tracker(self) -> TensorBoardTracker:
        run_name = os.path.relpath(self.log_dir, self._save_dir)
        tracker_class = HpMetricTracker if self._default_hp_metric else LightningTensorBoardTracker
        return tracker_class(run_name, self._save_dir, layout="lightning", **self._writer_kwargs)


class LightningTensorBoardTracker(TensorBoardTracker):
    """The tracker of a ``TensorBoardLogger``: the configuration in the version folder's ``hparams.yaml``
    (Lightning's file, read back by ``load_from_checkpoint(hparams_file=...)``); a run that logged none still gets
    one (``{}``) when it ends well: the logger's ``save()`` (``finalize("success")``) writes it, as Lightning's."""

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logged_hparams: dict[str, Any] = {}

    def write_configuration(self, values: dict[str, Any]) -> None:
        self.logged_hparams.update(values)
        save_hparams_to_yaml(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), self.logged_hparams)

    def save_hparams_file(self) -> None:
        """Write ``hparams.yaml`` if the run folder exists and the file does not yet (Lightning's ``save()``)."""
        path = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if os.path.isdir(self.log_dir) and not os.path.isfile(path):
            save_hparams_to_yaml(path, self.logged_hparams)


class HpMetricTracker(LightningTensorBoardTracker):
    """The tracker of a ``TensorBoardLogger(default_hp_metric=True)``: the run configuration comes with Lightning's
    ``hp_metric`` placeholder declared in the hparams plugin, so the HParams tab has a metric column (the logger's
    ``log_hyperparams`` logs it as -1; log ``hp_metric`` to fill it)."""

    hparams_metrics = {"hp_metric": -1.0}  # noqa: RUF012 - read-only class default
