"""`CSVLogger`: Lightning's CSV logger as a view over Ember's ``CSVTracker``."""

from __future__ import annotations

import os
from typing import Any

from trackers import CSVTracker
from trainer.loggers.logger import Logger, check_prefix, next_version


class CSVLogger(Logger):
    """Metrics in ``{save_dir}/{name}/version_{N}/metrics.csv`` (Lightning's layout), hyperparameters in
    ``config.json`` next to it.

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
        super().__init__()
        check_prefix("CSVLogger", prefix)
        if not isinstance(flush_logs_every_n_steps, int) or flush_logs_every_n_steps < 1:
            raise ValueError(f"CSVLogger(flush_logs_every_n_steps=...) must be an int >= 1. Received: "
                             f"{flush_logs_every_n_steps!r}.")
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = _check_version("CSVLogger", version)

    @property
    def name(self) -> str:
        return self._name

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
        """``{root_dir}/version_{N}`` (or the str version); a resumed run's own folder once it is restored."""
        run_dir = getattr(self._tracker, "run_dir", None)
        if run_dir is not None:
            return run_dir
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self.root_dir, version)

    @property
    def experiment(self) -> Any:
        """The open ``metrics.csv`` file object of the ``CSVTracker`` (rank 0)."""
        return super().experiment

    def _build_tracker(self) -> CSVTracker:
        tracker = CSVTracker(self._name, self._save_dir)
        tracker.run_dir = self.log_dir  # the folder Lightning would use; start() creates it
        return tracker


def _check_version(logger: str, version: Any) -> int | str | None:
    if version is None or isinstance(version, str) or (isinstance(version, int) and not isinstance(version, bool)
                                                       and version >= 0):
        return version
    raise ValueError(f"{logger}(version=...) must be an int >= 0, a str, or None. Received: {version!r}.")
