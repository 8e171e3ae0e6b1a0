"""`WandBTracker`: a Weights & Biases run, online or offline (``WANDB_MODE=offline`` / ``mode="offline"``)."""

from __future__ import annotations

import os
from typing import Any

from trackers.base import GeneralTracker, started

_LOCAL_MODES = ("offline", "dryrun", "disabled")


def _logged_in() -> bool:
    """Whether ``wandb login`` stored a key for the wandb host in the netrc file (where wandb keeps it)."""
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _settings_mode() -> str:
    """The ``mode`` in wandb's settings file (``wandb offline`` writes ``mode = offline`` there), or ``""``."""
    folder = os.environ.get("WANDB_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "wandb")
    try:
        with open(os.path.join(folder, "settings"), encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() == "mode":
                    return value.strip().lower()
    except OSError:
        pass
    return ""


class WandBTracker(GeneralTracker):
    """``wandb.init(project=run_name, **kwargs)``; ``run.log(values, step=step)``; ``run.finish()``.

    Offline mode is wandb's own: ``WANDB_MODE=offline`` or ``mode="offline"`` writes
    ``{dir}/wandb/offline-run-*/run-{id}.wandb`` for a later ``wandb sync``. ``dir`` defaults to the engine's
    logging directory when it has one. The configuration goes to
    ``run.config.update(values, allow_val_change=True)``.

    Run identity is the run id (with project and dir). On resume ``start()`` calls ``wandb.init(id=run_id,
    resume="allow")``: online, wandb continues the same run; offline, it writes a new ``offline-run-*`` folder
    for the same id, which ``wandb sync`` appends to that run. wandb ignores steps lower than ones it already
    has, so a resumed run's first steps must come after the last step the server saw.

    ``main_process_only`` is ``True`` here (Accelerate declares ``False`` but only ever runs it on the main
    process, because its whole ``init_trackers`` is main-only; the engine honours the flag, so it is set to
    what Accelerate actually does).
    """

    name = "wandb"
    requires_logging_directory = False
    main_process_only = True
    accepts_logging_directory = True
    package = "wandb"
    extra = "wandb"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.init_kwargs = kwargs
        self._run: Any = None
        self._identity: dict[str, Any] = {}

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Online wandb needs a login; without one (and not offline) ``wandb.init`` fails asking for an API key."""
        if os.environ.get("WANDB_MODE", "").lower() in _LOCAL_MODES or os.environ.get("WANDB_API_KEY"):
            return None
        if _logged_in() or _settings_mode() in _LOCAL_MODES:
            return None
        return ("wandb is installed but not logged in (no WANDB_API_KEY, no `wandb login`), so it is skipped: set "
                "WANDB_MODE=offline to log offline, or run `wandb login`.")

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run object (``wandb.sdk.wandb_run.Run``)."""
        return self._run

    def start(self) -> None:
        if self._run is not None:
            raise RuntimeError(f"WandBTracker run {self._run.id} is already started.")
        import wandb  # lazy: wandb is heavy and optional

        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project", self._identity.get("project", self.run_name))
        directory = kwargs.get("dir", self._identity.get("dir", self.logging_dir))
        if directory is not None:
            os.makedirs(directory, exist_ok=True)  # wandb warns and falls back to a temp dir if it is missing
            kwargs["dir"] = directory
        if self._identity.get("run_id"):
            kwargs.setdefault("id", self._identity["run_id"])
            kwargs.setdefault("resume", "allow")
        self._run = wandb.init(**kwargs)
        self._identity = {"run_id": self._run.id, "project": kwargs["project"], "dir": directory}

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._started().config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._started().log(values, step=step, **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self._identity)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._run is not None:
            raise RuntimeError("WandBTracker.load_state_dict() must come before start(): the run is already "
                               "open.")
        if not state.get("run_id"):
            raise ValueError(f"WandBTracker.load_state_dict needs a 'run_id'. Received: {state!r}.")
        self._identity = dict(state)

    def _started(self) -> Any:
        return started(self._run, "WandBTracker")
