"""`LitLogger`: Lightning's logger for the Lightning AI platform, as a view over Ember's ``LitLoggerTracker``.

Every call into the ``litlogger`` package is the one Lightning 2.6's ``LitLogger`` makes (read from its source and
from what its tests assert against a mocked package): ``litlogger.Experiment(...)`` and ``print_url()`` when the run
opens, ``experiment[name].append(value, step=step)`` per value, ``experiment[key] = str(value)`` per
hyperparameter, ``experiment[key] = litlogger.File(path)`` / ``litlogger.Model(...)`` for artifacts,
``experiment[key].save(path)`` to download one, ``experiment.finalize(status)`` at the end.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trackers import LitLoggerTracker, require_installed
from trainer.loggers.logger import DummyExperiment, Logger
from trainer.utilities.rank_zero import rank_zero_only


def _create_experiment_name() -> str:
    """A random experiment name from litlogger's own generator (the function Lightning calls for it)."""
    from litlogger.generator import _create_name

    name: str = _create_name()
    return name


class LitRunTracker(LitLoggerTracker):
    """``LitLogger``'s tracker: the Trainer also tells it where each run ends, and ``run_end`` then uploads the
    checkpoints ``log_model=True`` deferred (Lightning uploads them in ``finalize``; Ember keeps the experiment
    open from one Trainer call to the next, so they go at each run's end instead)."""

    def __init__(self, run_end: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_end = run_end

    def run_started(self, module: torch.nn.Module, hparams: dict[str, Any] | None) -> None:
        """Nothing: the engine sends the configuration once (Lightning's ``log_graph`` here only warns)."""

    def run_ended(self, status: str) -> None:
        if self.tracker is not None:
            self.run_end()
            if status == "failed":  # the engine finishes every tracker next: with Lightning's status
                self.finish(status)


class LitLogger(Logger):
    """An experiment on the Lightning AI platform (``pip install "ember-train[litlogger]"``).

    Args:
        root_dir: litlogger's local folder for logs and metadata (default ``./lightning_logs``); the run's is
            ``{root_dir}/{name}``.
        name: the experiment name (default: a generated one); the version (the UTC time the experiment opens) is
            appended on the platform.
        teamspace: the teamspace the charts and artifacts appear in (``None``: your default one).
        metadata: tags of the experiment.
        store_step: accepted for Lightning's signature (steps are always stored, as there).
        log_model: upload the checkpoints ``ModelCheckpoint`` writes: each at once with ``save_top_k=-1``, else
            the ones it keeps when the run ends.
        save_logs: capture the terminal output and upload it.
        checkpoint_name: the artifact name for uploaded checkpoints (default: the experiment's name).

    Example:
        >>> import sys, tempfile, types
        >>> from unittest import mock
        >>> sys.modules["litlogger"] = fake = types.ModuleType("litlogger")  # stands in for the real package
        >>> fake.Experiment = mock.MagicMock()
        >>> logger = LitLogger(root_dir=tempfile.mkdtemp(), name="demo")
        >>> logger.log_metrics({"loss": 0.5}, step=3)
        >>> fake.Experiment.return_value["loss"].append.call_args
        call(0.5, step=3)
        >>> del sys.modules["litlogger"]
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, root_dir: str | os.PathLike[str] | None = None, name: str | None = None,
                 teamspace: str | None = None, metadata: dict[str, str] | None = None, store_step: bool = True,
                 log_model: bool = False, save_logs: bool = True, checkpoint_name: str | None = None) -> None:
        super().__init__()
        require_installed(LitLoggerTracker, "LitLogger")  # here, not when the run opens minutes later
        self._root_dir = os.fspath(root_dir or "./lightning_logs")
        if "://" in self._root_dir and not self._root_dir.startswith("file://"):
            raise ValueError(f"LitLogger(root_dir={self._root_dir!r}): litlogger keeps its logs in a local folder "
                             "before uploading them; give a local path.")
        self._name = name or _create_experiment_name()
        self._teamspace = teamspace
        self._sub_dir: str | None = None
        self._prefix = ""
        self._metadata = metadata or {}
        self._log_model = log_model
        self._save_logs = save_logs
        self._checkpoint_callback: Any = None
        self._logged_model_time: dict[str, float] = {}
        self._checkpoint_name = checkpoint_name

    def _build_tracker(self) -> LitRunTracker:
        return LitRunTracker(self._log_deferred_checkpoints, run_name=self._name, logging_dir=self.log_dir,
                             teamspace=self._teamspace, metadata=self._metadata, save_logs=self._save_logs)

    @property
    def _lit(self) -> LitRunTracker:
        tracker = self.tracker
        assert isinstance(tracker, LitRunTracker)  # _build_tracker makes one
        return tracker

    # -- Lightning's names --------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str | None:
        """The time the experiment opened (``None`` before), without colons."""
        return None if self._tracker is None else self._lit.version

    @property
    def root_dir(self) -> str:
        return self._root_dir

    @property
    def log_dir(self) -> str:
        """``{root_dir}/{name}[/{sub_dir}]``, with environment variables and ``~`` expanded."""
        log_dir = os.path.join(self.root_dir, self.name)
        if isinstance(self.sub_dir, str):
            log_dir = os.path.join(log_dir, self.sub_dir)
        return os.path.expanduser(os.path.expandvars(log_dir))

    @property
    def save_dir(self) -> str:
        return self.log_dir

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    def _experiment_name(self) -> str:
        return self.name if self.version is None else f"{self.name}-{self.version}"

    @property
    def _step(self) -> int:
        """The last step logged (-1 before any): a model uploaded without a version takes it."""
        return self._lit.step

    @_step.setter
    def _step(self, step: int) -> None:
        self._lit.step = step

    @property
    def experiment(self) -> Any:
        """The ``litlogger.Experiment`` (opened on first use, on rank 0; a do-nothing object elsewhere)."""
        if rank_zero_only.rank != 0:
            return DummyExperiment()
        return self._open().tracker

    @property
    def url(self) -> str | None:
        """The experiment's page on the platform (rank 0; ``None`` elsewhere)."""
        return self.experiment.url if rank_zero_only.rank == 0 else None

    # -- logging ------------------------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Append each value (tensors as Python numbers) at ``step`` (default: the step after the last one)."""
        if rank_zero_only.rank != 0:
            return
        prefix = f"{self._prefix}{self.LOGGER_JOIN_CHAR}" if self._prefix else ""
        values = {f"{prefix}{k}": v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        self._open().log(values, step=step)

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace | None = None, metrics: Any = None,
                        *args: Any, **kwargs: Any) -> None:
        """Each entry as an experiment tag, ``experiment[key] = str(value)``."""
        self.log_metadata(params or {})

    def log_metadata(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Each entry as an experiment tag, ``experiment[key] = str(value)`` (rank 0)."""
        if rank_zero_only.rank == 0:
            self._open().store_init_configuration(dict(vars(params) if isinstance(params, argparse.Namespace)
                                                       else params))

    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        if rank_zero_only.rank == 0:
            warnings.warn("LitLogger does not support `log_graph`", UserWarning, stacklevel=2)

    def finalize(self, status: str | None = None) -> None:
        """Upload the checkpoints ``log_model`` deferred, then finalize the experiment (when it was opened)."""
        if rank_zero_only.rank != 0 or self._tracker is None or self._tracker.tracker is None:
            return
        self._log_deferred_checkpoints()
        self._lit.finish(status)

    # -- artifacts ----------------------------------------------------------------------------------------------
    def log_model(self, model: Any, staging_dir: str | None = None, verbose: bool = False, version: str | None = None,
                  metadata: dict[str, Any] | None = None) -> None:
        """Save ``model`` (e.g. a ``torch.nn.Module``) and upload it under the experiment's name (rank 0)."""
        if rank_zero_only.rank == 0:
            from litlogger import Model

            self.experiment[self._experiment_name] = Model(model, version=self._model_version(version, self._step),
                                                           metadata=metadata, staging_dir=staging_dir)

    def log_model_artifact(self, path: str, verbose: bool = False, version: str | None = None) -> None:
        """Upload a model file or folder under the experiment's name (rank 0)."""
        if rank_zero_only.rank == 0:
            from litlogger import Model

            self.experiment[self._experiment_name] = Model(path, version=self._model_version(version, self._step))

    def log_file(self, path: str) -> None:
        """Upload a file, named by its path relative to the working folder (else its base name) (rank 0)."""
        if rank_zero_only.rank == 0:
            from litlogger import File

            self.experiment[self._default_artifact_key(path)] = File(path)

    def get_file(self, path: str, verbose: bool = True) -> str | None:
        """Download the file ``log_file(path)`` uploaded to ``path``; returns where it was saved (rank 0)."""
        if rank_zero_only.rank != 0:
            return None
        saved: str = self.experiment[self._default_artifact_key(path)].save(path)
        return saved

    @staticmethod
    def _default_artifact_key(path: str) -> str:
        try:
            relative: str | None = os.path.relpath(path)
        except ValueError:  # another drive (Windows)
            relative = None
        key = relative if relative is not None and not relative.startswith("..") else os.path.basename(path)
        return key.replace("\\", "/")

    @staticmethod
    def _model_version(version: str | None, step: int | None) -> str | None:
        if version is not None:
            return version
        return str(step) if step is not None and step >= 0 else None

    # -- checkpoints (log_model=True) ---------------------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """With ``log_model``: upload the new checkpoints now when every one is kept (``save_top_k=-1``), else
        remember the callback and upload the ones it keeps when the run ends (Lightning's schedule)."""
        if not self._log_model:
            return
        if checkpoint_callback.save_top_k == -1:
            self._log_checkpoints(checkpoint_callback)
        else:
            self._checkpoint_callback = checkpoint_callback

    def _log_deferred_checkpoints(self) -> None:
        if self._checkpoint_callback is not None:
            self._log_checkpoints(self._checkpoint_callback)

    def _log_checkpoints(self, checkpoint_callback: Any) -> None:
        """Upload the callback's checkpoints not uploaded yet (or rewritten since), oldest first."""
        from litlogger import Model

        for mtime, path in scan_checkpoints(checkpoint_callback, self._logged_model_time):
            experiment = self.experiment
            step = getattr(checkpoint_callback, "_last_global_step_saved", None)
            experiment[self._checkpoint_name or experiment.name] = Model(path, version=self._model_version(None, step))
            self._logged_model_time[path] = mtime


def scan_checkpoints(checkpoint_callback: Any, logged: Mapping[str, float]) -> list[tuple[float, str]]:
    """``(mtime, path)`` of the checkpoints a ``ModelCheckpoint`` keeps (its last, best and top-k ones) that exist
    and were not uploaded at that mtime yet, oldest first."""
    paths = [getattr(checkpoint_callback, "last_model_path", ""), getattr(checkpoint_callback, "best_model_path", ""),
             *getattr(checkpoint_callback, "best_k_models", {})]
    found = sorted({(Path(p).stat().st_mtime, p) for p in paths if p and Path(p).is_file()})
    return [(mtime, p) for mtime, p in found if p not in logged or logged[p] < mtime]
