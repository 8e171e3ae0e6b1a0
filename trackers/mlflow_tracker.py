"""`MLflowTracker`: an MLflow run through ``mlflow.MlflowClient`` (by default a file store in the run folder)."""

from __future__ import annotations

import os
import re
import time
import warnings
from typing import Any

from trackers.base import GeneralTracker, started
from trackers.values import flatten_config

_BATCH = 100  # MLflow's limit on params (and a safe size for metrics) per log_batch call
_INVALID_KEY_CHARS = re.compile(r"[^a-zA-Z0-9_/. -]+")


class MLflowTracker(GeneralTracker):
    """Log to the MLflow experiment ``run_name`` with ``MlflowClient`` (no global active run is touched).

    Where: ``tracking_uri=`` if given, else ``MLFLOW_TRACKING_URI``, else a file store at
    ``{logging_dir}/mlruns`` (``./mlruns`` without a logging directory), so a run folder holds its own MLflow
    data. mlflow >= 3 refuses file stores unless ``MLFLOW_ALLOW_FILE_STORE=true``; for a local file store this
    tracker sets that variable (unless you set it), since a store inside the run folder is the point. Numbers
    are metrics (``log_batch``, 100 per call), strings are run tags, the configuration is run params (flattened
    to ``a/b`` keys, values as ``str``). ``finish()`` marks the run ``FINISHED``.

    Run identity is the run id: a resumed run (``load_state_dict`` before ``start``) reopens the same run and
    marks it ``RUNNING`` again. MLflow keeps every value logged for a step, so points a killed run logged after
    its checkpoint stay next to the resumed run's ones.

    Example:
        >>> import tempfile
        >>> tracker = MLflowTracker("demo", tempfile.mkdtemp())  # doctest: +SKIP
        >>> tracker.start(); tracker.log({"loss": 0.5}, step=1); tracker.finish()  # doctest: +SKIP
    """

    name = "mlflow"
    requires_logging_directory = False
    accepts_logging_directory = True
    package = "mlflow"
    extra = "mlflow"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, *,
                 tracking_uri: str | None = None, mlflow_run_name: str | None = None,
                 tags: dict[str, Any] | None = None, artifact_location: str | None = None,
                 run_id: str | None = None, synchronous: bool | None = None) -> None:
        super().__init__()
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"MLflowTracker(tags=...) takes a dict of tag name -> value. Received: {tags!r:.100}.")
        self.run_name = run_name
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        self.mlflow_run_name = mlflow_run_name
        self.tags = dict(tags or {})
        self.artifact_location = artifact_location
        self.synchronous = synchronous
        self.run_id: str | None = run_id
        self.experiment_id: str | None = None
        self._client: Any = None
        self._last_step: int | None = None

    @property
    def tracker(self) -> Any:
        """The ``mlflow.MlflowClient`` (``None`` before ``start()``); use it with ``run_id``."""
        return self._client

    @property
    def store_uri(self) -> str:
        """The tracking URI in use: the given one, ``MLFLOW_TRACKING_URI``, or the file store in the run folder."""
        if self.tracking_uri:
            return self.tracking_uri
        root = os.path.abspath(os.path.join(self.logging_dir or ".", "mlruns"))
        return "file:" + root

    def start(self) -> None:
        if self._client is not None:
            raise RuntimeError(f"MLflowTracker run {self.run_id} is already started.")
        uri = self.store_uri
        if uri.startswith("file:") or "://" not in uri:
            # mlflow >= 3 gates file stores behind this opt-in; a local store is what was asked for.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            os.makedirs(uri.removeprefix("file:"), exist_ok=True)
        from mlflow.tracking import MlflowClient  # lazy: mlflow is heavy and optional

        client = MlflowClient(tracking_uri=uri)
        if self.run_id is not None:
            run = client.get_run(self.run_id)
            self.experiment_id = run.info.experiment_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = client.get_experiment_by_name(self.run_name)
            if experiment is not None and experiment.lifecycle_stage != "deleted":
                self.experiment_id = experiment.experiment_id
            else:
                self.experiment_id = client.create_experiment(self.run_name,
                                                              artifact_location=self.artifact_location)
            tags = {str(k): str(v) for k, v in self.tags.items()}
            if self.mlflow_run_name is not None:
                tags["mlflow.runName"] = self.mlflow_run_name
            self.run_id = client.create_run(self.experiment_id, tags=tags).info.run_id
        self._client = client

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)) for key, value in flatten_config(values).items()]
        for i in range(0, len(params), _BATCH):
            self._started().log_batch(self.run_id, params=params[i:i + _BATCH], **self._batch_kwargs())

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"MLflowTracker.log takes no extra options. Received: {sorted(kwargs)}.")
        from mlflow.entities import Metric, RunTag

        client = self._started()
        timestamp = int(time.time() * 1000)
        metrics, tags = [], []
        for key, value in values.items():
            clean = _INVALID_KEY_CHARS.sub("", key)
            if clean != key:
                warnings.warn(f"MLflow allows only letters, digits and '_', '/', '.', ' ', '-' in metric names: "
                              f"{key!r} is logged as {clean!r}.", RuntimeWarning, stacklevel=2)
            if isinstance(value, str):
                tags.append(RunTag(clean, value))  # MLflow metrics are numbers; a string is a run tag
            elif isinstance(value, (int, float)):
                metrics.append(Metric(clean, float(value), timestamp, step or 0))
            else:
                raise TypeError(f"MLflowTracker.log got {type(value).__name__} for {key!r}: pass values through "
                                "trackers.normalize_values first (the engine does).")
        for i in range(0, max(len(metrics), len(tags)), _BATCH):
            client.log_batch(self.run_id, metrics=metrics[i:i + _BATCH], tags=tags[i:i + _BATCH],
                             **self._batch_kwargs())
        if step is not None:
            self._last_step = step

    def finish(self, status: str = "FINISHED") -> None:
        if self._client is not None:
            self._client.set_terminated(self.run_id, status)
            self._client = None

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.tracking_uri,
                "step": self._last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._client is not None:
            raise RuntimeError("MLflowTracker.load_state_dict() must come before start(): the run is already open.")
        if not state.get("run_id"):
            raise ValueError(f"MLflowTracker.load_state_dict needs a 'run_id'. Received: {state!r}.")
        self.run_id = str(state["run_id"])
        self.tracking_uri = state.get("tracking_uri") or self.tracking_uri
        self._last_step = state.get("step")

    def _batch_kwargs(self) -> dict[str, Any]:
        return {} if self.synchronous is None else {"synchronous": self.synchronous}

    def _started(self) -> Any:
        return started(self._client, "MLflowTracker")
