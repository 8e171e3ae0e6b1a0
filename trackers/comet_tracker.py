"""`CometMLTracker`: a Comet experiment, online (``Experiment``) or as an offline archive."""

from __future__ import annotations

import os
import warnings
from typing import Any

from trackers.base import GeneralTracker, started


class CometMLTracker(GeneralTracker):
    """Numbers go to ``log_metric(name, value, step=step)``, strings to ``log_other``, the configuration to
    ``log_parameters``; ``finish()`` calls ``end()``. Other keyword arguments go to the comet experiment
    class.

    Online or offline, decided in ``start()``:

    1. ``offline=True`` / ``offline=False`` given to the tracker
       (``init_kwargs={"comet_ml": {"offline": True}}``);
    2. otherwise comet's own settings: ``COMET_OFFLINE=true`` or ``COMET_START_ONLINE=false`` (environment or
       ``.comet.config``) mean offline;
    3. otherwise offline when no API key is configured (``COMET_API_KEY`` / ``.comet.config``), with a
       warning,
       because an online experiment without a key cannot log anything. ``offline=False`` without a key raises.

    Offline archives (``{experiment_key}.zip``, uploaded later with ``comet upload``) go to the
    ``offline_directory`` keyword, else comet's configured one (``COMET_OFFLINE_DIRECTORY``), else
    ``{logging_dir}/{run_name}/comet_ml`` when the engine has a logging directory, else comet's default.

    Run identity is the experiment key. On resume ``start()`` opens ``ExistingExperiment`` (online) or
    ``ExistingOfflineExperiment`` (offline) with that key, so the resumed metrics land in the same experiment
    (offline: a second archive for the same key, merged into it on upload).
    """

    name = "comet_ml"
    requires_logging_directory = False
    accepts_logging_directory = True
    package = "comet_ml"
    extra = "comet"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None,
                 offline: bool | None = None, **kwargs: Any) -> None:
        super().__init__()
        if offline is not None and not isinstance(offline, bool):
            raise TypeError(f"CometMLTracker(offline=) must be True, False or None. Received: {offline!r}.")
        self.run_name = run_name
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.offline = offline
        self.experiment_kwargs = kwargs
        self._experiment: Any = None
        self._identity: dict[str, Any] = {}

    @property
    def tracker(self) -> Any:
        """The ``comet_ml`` experiment object."""
        return self._experiment

    def start(self) -> None:
        if self._experiment is not None:
            raise RuntimeError(f"CometMLTracker experiment {self._experiment.get_key()} is already started.")
        import comet_ml  # lazy: comet_ml is heavy and optional

        kwargs = dict(self.experiment_kwargs)
        kwargs.setdefault("project_name", self._identity.get("project_name", self.run_name))
        if "offline" in self._identity:  # a resumed experiment keeps the mode it was created in
            offline = bool(self._identity["offline"])
        else:
            offline = self._resolve_offline(comet_ml, kwargs.get("api_key"))
        key = self._identity.get("experiment_key")
        if offline:
            given = kwargs.pop("offline_directory", self._identity.get("offline_directory"))
            directory = self._offline_directory(comet_ml, given)
            if directory is not None:
                os.makedirs(directory, exist_ok=True)
                kwargs["offline_directory"] = directory
            if key:
                self._experiment = comet_ml.ExistingOfflineExperiment(previous_experiment=key, **kwargs)
            else:
                self._experiment = comet_ml.OfflineExperiment(**kwargs)
        elif key:
            self._experiment = comet_ml.ExistingExperiment(previous_experiment=key, **kwargs)
        else:
            self._experiment = comet_ml.Experiment(**kwargs)
        self._identity = {"experiment_key": self._experiment.get_key(), "offline": offline,
                          "project_name": kwargs["project_name"]}
        if offline:
            self._identity["offline_directory"] = self._experiment.offline_directory

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._started().log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        experiment = self._started()
        for key, value in values.items():
            if isinstance(value, str):
                experiment.log_other(key, value)
            elif isinstance(value, (int, float)):
                experiment.log_metric(key, value, step=step, **kwargs)
            else:
                raise TypeError(f"CometMLTracker.log got {type(value).__name__} for {key!r}: pass values "
                                "through trackers.normalize_values first (the engine does).")

    def finish(self) -> None:
        if self._experiment is not None:
            self._experiment.end()
            self._experiment = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self._identity)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._experiment is not None:
            raise RuntimeError("CometMLTracker.load_state_dict() must come before start(): the experiment is "
                               "already open.")
        if not state.get("experiment_key"):
            raise ValueError(f"CometMLTracker.load_state_dict needs an 'experiment_key'. "
                             f"Received: {state!r}.")
        self._identity = dict(state)

    def _resolve_offline(self, comet_ml: Any, api_key: str | None) -> bool:
        config = comet_ml.config.get_config()
        has_key = comet_ml.config.get_api_key(api_key, config) is not None
        if self.offline is not None:
            if not self.offline and not has_key:
                raise ValueError("CometMLTracker(offline=False) needs a Comet API key, and none is "
                                 "configured: set COMET_API_KEY (or run `comet login`), or use offline=True.")
            return self.offline
        if config["comet.offline"] or config["comet.start.online"] is False:
            return True
        if not has_key:
            warnings.warn("No Comet API key is configured, so comet_ml logs offline to an archive for a "
                          "later `comet upload`. Set COMET_API_KEY to log online, or pass offline=True to "
                          "silence this.", stacklevel=3)
            return True
        return False

    def _offline_directory(self, comet_ml: Any, given: str | None) -> str | None:
        if given is not None:
            return os.fspath(given)
        configured = comet_ml.config.get_config()["comet.offline_directory"]
        if configured != comet_ml.config.DEFAULT_OFFLINE_DATA_DIRECTORY or self.logging_dir is None:
            return None  # comet uses its configured (or default) directory itself
        return os.path.join(self.logging_dir, self.run_name, "comet_ml")

    def _started(self) -> Any:
        return started(self._experiment, "CometMLTracker")
