"""`MLFlowLogger`: Lightning's MLflow logger as a view over Ember's ``MLflowTracker``."""

from __future__ import annotations

import os
from typing import Any

from trackers import MLflowTracker
from trainer.loggers.logger import Logger, check_prefix


class MLFlowLogger(Logger):
    """An MLflow run in experiment ``experiment_name``; a local file store at ``save_dir`` unless a tracking URI
    is given (``tracking_uri=`` or ``MLFLOW_TRACKING_URI``), as in Lightning.

    Args:
        experiment_name / run_name / tags / artifact_location / run_id / synchronous: as in Lightning.
        tracking_uri: where MLflow stores runs (default: ``MLFLOW_TRACKING_URI``, else ``file:{save_dir}``).
        save_dir: the local store's folder (default ``./mlruns``).
        log_model: not supported (a clear error): log checkpoints with ``logger.experiment.log_artifact``.
        prefix: not supported (a clear error).

    Example:
        >>> import tempfile
        >>> logger = MLFlowLogger("demo", save_dir=tempfile.mkdtemp())
        >>> logger.save_dir is not None
        True
    """

    def __init__(self, experiment_name: str = "lightning_logs", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, Any] | None = None,
                 save_dir: str | os.PathLike[str] | None = "./mlruns", log_model: bool | str = False,
                 prefix: str = "", artifact_location: str | None = None, run_id: str | None = None,
                 synchronous: bool | None = None) -> None:
        super().__init__()
        check_prefix("MLFlowLogger", prefix)
        if log_model:
            raise ValueError(f"MLFlowLogger(log_model={log_model!r}) is not supported: Ember does not upload "
                             "checkpoints to MLflow. Log them with logger.experiment.log_artifact(logger.run_id, "
                             "path).")
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            if save_dir is None:
                raise ValueError("MLFlowLogger needs save_dir= (a local store) or tracking_uri=.")
            tracking_uri = "file:" + os.path.abspath(os.fspath(save_dir))
        self._tracking_uri = tracking_uri
        self._experiment_name = experiment_name
        self._kwargs: dict[str, Any] = {"mlflow_run_name": run_name, "tags": tags,
                                        "artifact_location": artifact_location, "run_id": run_id,
                                        "synchronous": synchronous}

    @property
    def tracker(self) -> MLflowTracker:
        tracker = super().tracker
        if not isinstance(tracker, MLflowTracker):  # _build_tracker makes one: anything else is a bug
            raise TypeError(f"MLFlowLogger's tracker is a {type(tracker).__name__}, not an MLflowTracker.")
        return tracker

    @property
    def experiment(self) -> Any:
        """The ``mlflow.MlflowClient`` (rank 0); use it with ``logger.run_id``."""
        return super().experiment

    @property
    def run_id(self) -> str | None:
        """The run id (opens the run when it has none yet)."""
        if self.tracker.run_id is None:
            self.experiment  # noqa: B018 - opening the run is what gives it an id
        return self.tracker.run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment id (opens the run when it has none yet)."""
        if self.tracker.experiment_id is None:
            self.experiment  # noqa: B018
        return self.tracker.experiment_id

    @property
    def name(self) -> str | None:
        """The experiment id (Lightning's meaning)."""
        return self.experiment_id

    @property
    def version(self) -> str | None:
        """The run id."""
        return self.run_id

    @property
    def save_dir(self) -> str | None:
        """The local store's folder (``None`` for a remote tracking URI)."""
        return self._tracking_uri[len("file:"):] if self._tracking_uri.startswith("file:") else None

    def finalize(self, status: str = "success") -> None:
        tracker = self._tracker  # built by _build_tracker: an MLflowTracker (whose finish takes the status)
        if isinstance(tracker, MLflowTracker) and tracker.tracker is not None:
            tracker.finish({"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}.get(status, status))

    def _build_tracker(self) -> MLflowTracker:
        return MLflowTracker(self._experiment_name, tracking_uri=self._tracking_uri, **self._kwargs)
