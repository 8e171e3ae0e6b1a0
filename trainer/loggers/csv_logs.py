"""`CSVLogger`: Lightning's CSV logger as a view over Ember's ``CSVTracker``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trackers import CSVTracker, normalize_values
from trainer.core.saving import save_hparams_to_yaml
from trainer.loggers.logger import DummyExperiment, VersionedLogger, check_prefix
from trainer.utilities.rank_zero import rank_zero_only


class ExperimentWriter(CSVTracker):
    """The ``CSVTracker`` of a ``CSVLogger``: ``metrics.csv``, and the run configuration in ``hparams.yaml`` (Lightning's
    file, written with ``trainer.core.saving.save_hparams_to_yaml``) besides Ember's ``config.json``."""

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metrics: list[dict[str, Any]] = []  # rows logged since the last save() (already on disk: written through)

    @property
    def metrics_file_path(self) -> str:
        return self.metrics_path

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        super().store_init_configuration(values)
        save_hparams_to_yaml(os.path.join(os.path.dirname(self.metrics_path), self.NAME_HPARAMS_FILE), values)

    def log(self, values: dict[str, Any], step: int | None = None, new_row: bool = False, **kwargs: Any) -> None:
        super().log(values, step, new_row=new_row, **kwargs)
        self.metrics.append({**values, "step": step})

    # Lightning's ExperimentWriter API (CSVLogger.experiment).
    def log_metrics(self, metrics_dict: dict[str, Any], step: int | None = None) -> None:
        self.log(normalize_values(dict(metrics_dict)), step=step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.store_init_configuration(dict(params))

    def save(self) -> None:
        """Every row is on disk already (written through); the rows since the last save are forgotten."""
        self.metrics = []


class CSVLogger(VersionedLogger):
    """Metrics in ``{save_dir}/{name}/version_{N}/metrics.csv`` (Lightning's layout), hyperparameters in
    ``hparams.yaml`` and ``config.json`` next to it.

    Args:
        save_dir: the folder experiments go under.
        name: the experiment name (``""``: no experiment folder).
        version: an int (``version_{N}``), a str (the folder name itself), or ``None`` for the next free number.
        prefix: not supported (a clear error): log the names you want.
        flush_logs_every_n_steps: accepted; Ember writes each row through at once, so nothing waits for it.

    Example:
        >>> import tempfile
        >>> logger = CSVLogger(tempfile.mkdtemp(), name="exp", version="run_a")
        >>> logger.log_metrics({"loss": 0.25}, step=3)
        >>> print(open(logger.log_dir + "/metrics.csv").read(), end="")
        step,loss
        3,0.25
    """

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None = "lightning_logs",
                 version: int | str | None = None, prefix: str = "", flush_logs_every_n_steps: int = 100) -> None:
        check_prefix("CSVLogger", prefix)
        if not isinstance(flush_logs_every_n_steps, int) or flush_logs_every_n_steps < 1:
            raise ValueError(f"CSVLogger(flush_logs_every_n_steps=...) must be an int >= 1. Received: "
                             f"{flush_logs_every_n_steps!r}.")
        super().__init__(save_dir, name, version)
        self._flush_every = flush_logs_every_n_steps

    def _restored_dir(self) -> str | None:
        return getattr(self._tracker, "run_dir", None)

    @property
    def experiment(self) -> Any:
        """The ``ExperimentWriter`` (rank 0): Lightning's ``log_metrics`` / ``log_hparams`` / ``save`` /
        ``metrics_file_path``; a do-nothing object on other ranks."""
        if rank_zero_only.rank != 0:
            return DummyExperiment()
        return self._open()

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log ``metrics`` at ``step``; ``save()`` every ``flush_logs_every_n_steps`` steps, as Lightning does."""
        super().log_metrics(metrics, step)
        if step is not None and (step + 1) % self._flush_every == 0:
            self.save()

    def save(self) -> None:
        tracker = self._tracker  # built by _build_tracker: an ExperimentWriter
        if isinstance(tracker, ExperimentWriter) and tracker.tracker is not None:
            tracker.save()

    def _build_tracker(self) -> ExperimentWriter:
        tracker = ExperimentWriter(self._name, self._save_dir)
        tracker.run_dir = self.log_dir  # the folder Lightning would use; start() creates it
        return tracker
