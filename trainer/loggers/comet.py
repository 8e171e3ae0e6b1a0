"""`CometLogger`: Lightning's Comet logger as a view over Ember's ``CometMLTracker``."""

from __future__ import annotations

from typing import Any

from trackers import CometMLTracker
from trainer.loggers.logger import Logger, check_prefix

_MODES = ("get_or_create", "get", "create")


class CometLogger(Logger):
    """A Comet experiment, online or offline (``online=False`` or ``COMET_OFFLINE=true``).

    Args:
        api_key / workspace / project: Comet's settings (``project`` defaults to ``"lightning_logs"``).
        experiment_key: continue this experiment.
        mode: ``"get_or_create"`` (default), ``"get"`` (needs ``experiment_key``) or ``"create"`` (ignores it).
        online: ``False`` writes an offline archive; ``None`` follows Comet's configuration.
        prefix: not supported (a clear error).
        **kwargs: passed to the Comet experiment.

    Example:
        >>> CometLogger(project="demo", online=False).name
        'demo'
    """

    def __init__(self, *, api_key: str | None = None, workspace: str | None = None, project: str | None = None,
                 experiment_key: str | None = None, mode: str | None = None, online: bool | None = None,
                 prefix: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        check_prefix("CometLogger", prefix)
        if mode is not None and mode not in _MODES:
            raise ValueError(f"CometLogger(mode=...) must be one of {_MODES} or None. Received: {mode!r}.")
        if mode == "get" and experiment_key is None:
            raise ValueError("CometLogger(mode='get') continues an experiment: pass experiment_key=... too.")
        if online is not None and not isinstance(online, bool):
            raise TypeError(f"CometLogger(online=...) must be True, False or None. Received: {online!r}.")
        self._project = project
        self._experiment_key = None if mode == "create" else experiment_key
        self._online = online
        self._kwargs = dict(kwargs)
        for key, value in (("api_key", api_key), ("workspace", workspace)):
            if value is not None:
                self._kwargs[key] = value

    @property
    def name(self) -> str:
        """The project name (``"lightning_logs"`` when none is given)."""
        return self._project or "lightning_logs"

    @property
    def version(self) -> str | None:
        """The experiment key (``None`` until the experiment starts, unless one was given)."""
        experiment = None if self._tracker is None else self._tracker.tracker
        return experiment.get_key() if experiment is not None else self._experiment_key

    @property
    def experiment(self) -> Any:
        """The ``comet_ml`` experiment (rank 0)."""
        return super().experiment

    def _build_tracker(self) -> CometMLTracker:
        offline = None if self._online is None else not self._online
        tracker = CometMLTracker(self.name, offline=offline, **self._kwargs)
        if self._experiment_key is not None:
            state: dict[str, Any] = {"experiment_key": self._experiment_key}
            if offline is not None:
                state["offline"] = offline
            tracker.load_state_dict(state)
        return tracker
