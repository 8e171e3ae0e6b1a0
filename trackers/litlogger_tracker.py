"""`LitLoggerTracker`: an experiment on the Lightning AI platform, through the ``litlogger`` package."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from trackers.base import GeneralTracker, started


def utc_version() -> str:
    """The time now, ISO 8601 with the colons made dashes: Lightning 2.6's ``LitLogger`` version, exactly as it
    comes out of Lightning (observed: ``2026-11-29T18-38-32.503+00-00``; its code means to end it with ``Z`` but
    replaces the colons first), so a ported script names its experiments as before."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace(":", "-").replace("+00:00", "Z")  # Lightning's two replacements, in its order


class LitLoggerTracker(GeneralTracker):
    """``litlogger.Experiment(name=f"{run_name}-{version}", ...)``: each value one point of its series.

    The calls are Lightning 2.6 ``LitLogger``'s: ``Experiment(name=..., teamspace=..., metadata={k: str(v)},
    store_step=True, store_created_at=True, log_dir=logging_dir, save_logs=...)`` then ``print_url()`` when the
    run opens; ``experiment[name].append(value, step=step)`` for each logged value (a missing step counts on from
    the last one); ``experiment[key] = str(value)`` for each configuration entry; ``finalize(status)`` at the end.

    The version is the UTC time the run opened (``utc_version``) unless given. Run identity is that version: a
    resumed run opens the experiment of the same name again, which litlogger continues.

    Args:
        run_name: the experiment name (the version is appended).
        logging_dir: litlogger's local folder (created when the run opens; default ``./lightning_logs``).
        teamspace: the teamspace the experiment appears in (``None``: your default one).
        metadata: tags of the experiment (values shown as their ``str``).
        save_logs: capture the terminal output and upload it.
        version: the version to use instead of the time the run opens.

    Example:
        >>> tracker = LitLoggerTracker("demo", version="v1")
        >>> tracker.experiment_name, tracker.tracker is None
        ('demo-v1', True)
    """

    name = "litlogger"
    requires_logging_directory = False
    main_process_only = True
    package = "litlogger"
    extra = "litlogger"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, teamspace: str | None = None,
                 metadata: Mapping[str, Any] | None = None, save_logs: bool = True, version: str | None = None) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.fspath(logging_dir if logging_dir is not None else "./lightning_logs")
        self.teamspace = teamspace
        self.metadata = dict(metadata or {})
        self.save_logs = save_logs
        self.version = version
        self.step = -1  # the last step logged: a value logged without a step goes to the next one
        self._experiment: Any = None

    @property
    def tracker(self) -> Any:
        """The ``litlogger.Experiment``."""
        return self._experiment

    @property
    def experiment_name(self) -> str:
        return self.run_name if self.version is None else f"{self.run_name}-{self.version}"

    def start(self) -> None:
        if self._experiment is not None:
            raise RuntimeError(f"LitLoggerTracker experiment {self.experiment_name!r} is already started.")
        import litlogger  # lazy: optional, and it brings the Lightning SDK

        os.makedirs(self.logging_dir, exist_ok=True)
        if self.version is None:
            self.version = utc_version()
        self._experiment = litlogger.Experiment(
            name=self.experiment_name, teamspace=self.teamspace,
            metadata={k: str(v) for k, v in self.metadata.items()}, store_step=True, store_created_at=True,
            log_dir=self.logging_dir, save_logs=self.save_logs)
        self._experiment.print_url()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        experiment = started(self._experiment, "LitLoggerTracker")
        for key, value in values.items():
            experiment[key] = str(value)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        experiment = started(self._experiment, "LitLoggerTracker")
        self.step = self.step + 1 if step is None else step
        for key, value in values.items():
            experiment[key].append(value, step=self.step)

    def finish(self, status: str | None = None) -> None:
        if self._experiment is not None:
            self._experiment.finalize(status)
            self._experiment = None

    def state_dict(self) -> dict[str, Any]:
        return {} if self.version is None else {"version": self.version, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._experiment is not None:
            raise RuntimeError("LitLoggerTracker.load_state_dict() must come before start(): the experiment is "
                               "already open.")
        if state:
            if not isinstance(state.get("version"), str):
                raise ValueError(f"LitLoggerTracker.load_state_dict needs a 'version'. Received: {state!r}.")
            self.version, self.step = state["version"], int(state.get("step", -1))
