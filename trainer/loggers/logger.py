"""`Logger`: Lightning's logger API as a thin view over one Ember tracker (the tracker does the logging).

A logger given to ``Trainer(logger=...)`` hands its tracker to the engine, so everything ``self.log`` records
reaches the same tracker the logger's own ``log_metrics`` writes to: there is one logging path. The view adds
Lightning's names (``save_dir``, ``log_dir``, ``version``, ``experiment``, ...) and its rank-zero behaviour: on
other ranks ``experiment`` is a do-nothing object and ``log_*`` calls are skipped.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import torch

from trackers import GeneralTracker, group_values, normalize_values
from trainer.loggers.adapter import LoggerTracker
from trainer.utilities.rank_zero import rank_zero_only, rank_zero_warn


class DummyExperiment:
    """What ``experiment`` is on ranks other than 0: every attribute is a method that does nothing."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Do nothing."""

    def __getattr__(self, _: str) -> Any:
        return self.nop

    def __getitem__(self, _: Any) -> DummyExperiment:
        return self

    def __setitem__(self, *_: Any) -> None:
        pass


class Logger:
    """Base of the Lightning-named loggers; subclasses build their tracker in ``_build_tracker``.

    Example:
        >>> import tempfile
        >>> from trainer.loggers import CSVLogger
        >>> logger = CSVLogger(tempfile.mkdtemp(), name="demo")
        >>> logger.version, logger.log_dir.endswith("demo/version_0")
        (0, True)
        >>> logger.log_metrics({"loss": 0.5}, step=1)
        >>> logger.finalize("success")
    """

    def __init__(self) -> None:
        self._tracker: GeneralTracker | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A logger pickles (Lightning's do, with the trainer) without its open run: the copy builds its own
        tracker on first use, writing into the same version folder (the version is fixed here if it was not)."""
        if isinstance(self, VersionedLogger):
            _ = self.version  # fix the next free version now: the copy must not pick another one
        state = dict(vars(self))
        state["_tracker"] = None
        return state

    # -- the tracker this logger is a view of -----------------------------------------------------------------
    @property
    def tracker(self) -> GeneralTracker:
        """The Ember tracker doing the work (built on first use); the Trainer passes it to the engine."""
        if self._tracker is None:
            self._tracker = self._build_tracker()
        return self._tracker

    def _build_tracker(self) -> GeneralTracker:
        """A user's own ``Logger`` subclass (Lightning style: it overrides ``log_metrics``) is driven through an
        adapter tracker, so the engine calls its ``log_metrics`` / ``log_hyperparams`` / ``finalize``."""
        if type(self).log_metrics is Logger.log_metrics:
            raise TypeError(f"{type(self).__name__} is a Logger that defines no log_metrics(metrics, step): "
                            "override log_metrics (and log_hyperparams, name, version) as for Lightning, or use "
                            "one of CSVLogger, TensorBoardLogger, WandbLogger, CometLogger, MLFlowLogger, LitLogger.")
        return LoggerTracker(self)

    def _open(self) -> GeneralTracker:
        """The tracker with its run open (opened here, before or after a Trainer run, when needed)."""
        tracker = self.tracker
        if tracker.tracker is None:
            tracker.start()
            tracker.opened_by_owner = True
        return tracker

    # -- Lightning's Logger API -------------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """The experiment name."""
        return None

    @property
    def version(self) -> int | str | None:
        """The experiment version (a number, a run id)."""
        return None

    @property
    def root_dir(self) -> str | None:
        """The folder holding every version of this experiment (``None`` for remote loggers)."""
        return None

    @property
    def log_dir(self) -> str | None:
        """This run's folder (``None`` for remote loggers)."""
        return None

    @property
    def save_dir(self) -> str | None:
        """The folder the experiments are saved under (``None`` for remote loggers)."""
        return None

    @property
    def group_separator(self) -> str:
        return "/"

    @property
    def experiment(self) -> Any:
        """The backend's own object (a ``SummaryWriter``, a wandb run, ...) on rank 0; a do-nothing one elsewhere."""
        if rank_zero_only.rank != 0:
            return DummyExperiment()
        return self._open().tracker

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log ``metrics`` (numbers or one-element tensors) at ``step``, on rank 0.

        A nested dict is one group where the backend has groups (TensorBoard's ``add_scalars``, as Lightning's
        logger), else its names are joined as ``a/b``.
        """
        if rank_zero_only.rank != 0:
            return
        tracker, flat = self._open(), normalize_values(dict(metrics))
        tracker.log(group_values(metrics, flat) if tracker.accepts_grouped_values else flat, step=step)

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace | None = None, *args: Any,
                        **kwargs: Any) -> None:
        """Record the run configuration (a dict or an ``argparse.Namespace``), on rank 0."""
        tracker = self._open() if rank_zero_only.rank == 0 else None
        # A subclass driven by a LoggerTracker that does not override this records nothing (its tracker would call
        # this method back).
        if tracker is not None and not isinstance(tracker, LoggerTracker):
            tracker.store_init_configuration(convert_params(params))

    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        """Record the model graph where the backend supports it (TensorBoard); others do nothing, as in Lightning."""

    def save(self) -> None:
        """Flush: Ember's trackers write every ``log`` call through, so there is nothing left to flush."""

    def finalize(self, status: str) -> None:
        """Close the run (``status``: ``"success"``, ``"failed"``). A run a Trainer holds (it opened it, or took it
        over at its first call) stays open on success, only saved: the Trainer calls this after each of its calls,
        and the next one goes on writing to the same run (Ember's trackers write every value through, and the
        run is closed when the Trainer's trackers finish, its state in each checkpoint)."""
        tracker = self._tracker
        if status == "success":
            self.save()
        if tracker is not None and tracker.tracker is not None and (status != "success" or tracker.opened_by_owner):
            tracker.finish()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called after ``ModelCheckpoint`` saves (Lightning's hook; Ember's loggers upload nothing)."""


class DummyLogger(Logger):
    """A logger that records nothing (Lightning's ``DummyLogger``): ``trainer.logger`` under ``fast_dev_run``.

    Every method is accepted and does nothing; ``experiment`` is a ``DummyExperiment``.

    Example:
        >>> logger = DummyLogger()
        >>> logger.log_metrics({"loss": 1.0}, step=0), logger.name, logger.version
        (None, '', '')
    """

    @property
    def experiment(self) -> DummyExperiment:
        return DummyExperiment()

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:  # any arguments, as Lightning's: it records nothing
        pass

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def finalize(self, status: str) -> None:
        pass

    def __getitem__(self, index: int) -> DummyLogger:
        return self  # Lightning lets code index it like a list of loggers

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return DummyExperiment().nop  # any other logger method: accepted, does nothing


def convert_params(params: Mapping[str, Any] | argparse.Namespace | None) -> dict[str, Any]:
    """A plain dict from a dict / ``Namespace`` (nested dicts kept: each tracker flattens them its own way)."""
    if params is None:
        return {}
    if isinstance(params, argparse.Namespace):
        return dict(vars(params))
    if not isinstance(params, Mapping):
        raise TypeError(f"log_hyperparams takes a dict or an argparse.Namespace. Received: {type(params).__name__}.")
    return {str(k): convert_params(v) if isinstance(v, argparse.Namespace) else v for k, v in params.items()}


def check_prefix(logger: str, prefix: str | None) -> None:
    """Ember's loggers take no ``prefix``: every ``self.log`` name reaches the tracker as it was logged."""
    if prefix:
        raise ValueError(f"{logger}(prefix={prefix!r}) is not supported: Ember sends every metric to the tracker "
                         f"under the name it was logged with. Put the prefix in the names you log "
                         f"(self.log('{prefix}-loss', ...)) instead.")


def next_version(root: str) -> int:
    """The next free ``version_N`` number under ``root`` (0 when it does not exist), as Lightning picks it."""
    if not os.path.isdir(root):
        return 0
    taken = [int(d[8:]) for d in os.listdir(root)
             if d.startswith("version_") and d[8:].isdigit() and os.path.isdir(os.path.join(root, d))]
    return max(taken, default=-1) + 1


class VersionedLogger(Logger):
    """A logger that writes into ``{save_dir}/{name}/version_{N}`` (Lightning's layout for file loggers).

    Args:
        save_dir: the folder experiments go under.
        name: the experiment name (``""`` or None: no experiment folder).
        version: an int (``version_{N}``), a str (the folder name itself), or ``None`` for the next free number.
        sub_dir: a folder inside the version folder (TensorBoard's ``sub_dir``).
    """

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None, version: int | str | None,
                 sub_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        if not (version is None or isinstance(version, str)
                or (isinstance(version, int) and not isinstance(version, bool) and version >= 0)):
            raise ValueError(f"{type(self).__name__}(version=...) must be an int >= 0, a str, or None. Received: "
                             f"{version!r}.")
        self._save_dir = os.fspath(save_dir)
        if "://" in self._save_dir and not self._save_dir.startswith("file://"):  # else a local folder named "s3:"
            raise ValueError(f"{type(self).__name__}(save_dir={self._save_dir!r}): Ember's file loggers write to a "
                             "local folder, not to fsspec URLs. Log to a local folder and copy it, or use "
                             "WandbLogger / MLFlowLogger / CometLogger.")
        self._name = name or ""
        self._version = version
        self._auto_version = version is None
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)

    @property
    def name(self) -> str:
        return self._name

    @property
    def auto_version(self) -> bool:
        """Whether the version is picked automatically (the next free ``version_N``), not given."""
        return self._auto_version

    @property
    def version(self) -> int | str:
        """The version given, or the next free ``version_N`` number (fixed at first use)."""
        if self._version is None:
            self._version = next_version(self.root_dir)
        return self._version

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        return os.path.join(self._save_dir, self._name)

    @property
    def log_dir(self) -> str:
        """``{root_dir}/version_{N}[/{sub_dir}]`` (or the str version); a resumed run's own folder once its
        tracker restored it."""
        restored = self._restored_dir()
        if restored is not None:
            return restored
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        path = os.path.join(self.root_dir, version)
        return path if self._sub_dir is None else os.path.join(path, self._sub_dir)

    def _restored_dir(self) -> str | None:
        """The folder the tracker writes to once a resumed run reopened it (None before)."""
        return None


def warn_unused(logger: str, what: str) -> None:
    rank_zero_warn(f"{logger}: {what}", stacklevel=3)


class TrackerLogger(Logger):
    """A Lightning-style view of a tracker the engine runs (``trainer.loggers`` for ``log_with=`` trackers)."""

    def __init__(self, tracker: GeneralTracker) -> None:
        super().__init__()
        self._tracker = tracker

    @property
    def name(self) -> str | None:
        return getattr(self._tracker, "run_name", None)

    @property
    def log_dir(self) -> str | None:
        return getattr(self._tracker, "run_dir", None) or getattr(self._tracker, "log_dir", None)

    @property
    def save_dir(self) -> str | None:
        return getattr(self._tracker, "logging_dir", None)
