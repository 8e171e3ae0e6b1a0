"""Run folders in a tracker's saved identity are stored relative to its logging directory.

A checkpoint that stored ``runs/digits/version_3/logs`` as given would, once the run folder is copied or moved
(or the script started from another working directory), send the resumed run's rows into the *original* run's
files. Stored relative to the logging directory and resolved against the logging directory of the run that
loads it, the same identity always lands inside the resuming run's own folder.
"""

from __future__ import annotations

import os
import warnings
from typing import Any


def to_relative(path: str, logging_dir: str) -> str:
    """``path`` relative to ``logging_dir`` with ``/`` separators (what a checkpoint stores).

    Example:
        >>> to_relative("/r/v3/logs/version_0", "/r/v3/logs")
        'version_0'
    """
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(logging_dir))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
        raise ValueError(f"The run folder {path} is outside the logging directory {logging_dir}: a run keeps "
                         "everything it writes inside its own folder.")
    return relative.replace(os.sep, "/")


def resolve(saved: str, logging_dir: str, what: str) -> str:
    """The absolute folder a stored relative path names under ``logging_dir``; refuses a path that leaves it.

    Example:
        >>> resolve("version_0", "/copy/v3/logs", "CSVTracker")
        '/copy/v3/logs/version_0'
    """
    parts = saved.replace("\\", "/").split("/")
    if os.path.isabs(saved) or saved.startswith(("/", "\\")) or os.pardir in parts:
        raise ValueError(f"{what}: the saved run folder {saved!r} is not a path inside the logging directory "
                         f"{logging_dir} (it is absolute or leaves it): resuming would write into another run's "
                         "files. It was saved by an older version of ember-train; resume without the tracker "
                         "state (start a new run) or move the files into place.")
    return os.path.normpath(os.path.join(os.path.abspath(logging_dir), *parts))


def legacy_to_relative(saved: str, logging_dir: str) -> str | None:
    """An absolute or working-directory-relative folder from an older checkpoint, relative to ``logging_dir``;
    ``None`` when it is not inside ``logging_dir`` (the run cannot safely be reopened there)."""
    try:
        return to_relative(saved, logging_dir)
    except ValueError:
        return None


def restore(state: dict[str, Any], legacy_key: str, logging_dir: str, what: str) -> str | None:
    """The run folder a tracker's saved identity names, inside ``logging_dir``.

    ``state["run"]`` is the folder relative to ``logging_dir``; ``state[legacy_key]`` the folder as an older
    version stored it (absolute, or relative to the working directory). Returns None, with a warning, when such
    an older folder lies outside ``logging_dir``: the resumed run then logs to a new folder instead of writing
    into another run's files.
    """
    if state.get("run"):
        return resolve(str(state["run"]), logging_dir, what)
    if state.get(legacy_key):
        relative = legacy_to_relative(os.fspath(state[legacy_key]), logging_dir)
        if relative is None:
            warnings.warn(f"{what}: the checkpoint names the run folder {state[legacy_key]}, which is not inside "
                          f"this run's logging directory {logging_dir}; the resumed run logs to a new folder "
                          "instead of writing into another run's files.", UserWarning, stacklevel=3)
            return None
        return resolve(relative, logging_dir, what)
    raise ValueError(f"{what}.load_state_dict needs a 'run' (the run folder relative to the logging directory). "
                     f"Received: {state!r}.")
