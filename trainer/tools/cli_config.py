"""The CLI's resolved config in the run folder: saved at the start of a run, reused and checked on resume.

A run folder (``Trainer(project_dir=...)``) holds ``config.yaml``, the fully resolved config of the run that
wrote it. Resuming (``--ckpt_path``) parses that file first, so ``ember fit --trainer.project_dir runs/x
--ckpt_path last`` needs nothing else; a command whose resolved config differs from the saved one is refused
(the checkpoint would continue a different experiment) unless ``--allow_config_change`` is given, and a new run
into a folder that holds another run's config is refused the same way.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import yaml

CONFIG_NAME = "config.yaml"
# Keys that say how to run, not what is trained: they may differ between a run and its resume.
IGNORED_KEYS = frozenset({"config", "ckpt_path", "print_config", "allow_config_change", "__path__"})


class ConfigMismatchError(ValueError):
    """The command's resolved config differs from the one saved in the run folder."""


def saved_config_path(folder: str) -> str:
    return os.path.join(folder, CONFIG_NAME)


def comparable(config: dict[str, Any], ignore: Sequence[str] = ()) -> dict[str, Any]:
    """``config`` without the keys that may change between a run and its resume (and ``ignore``)."""
    return {k: v for k, v in config.items() if k not in IGNORED_KEYS and k not in ignore}


def differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two loaded configs.

    Example:
        >>> differences({"model": {"lr": 0.1, "n": 2}}, {"model": {"lr": 0.2, "n": 2}})
        ['model.lr: 0.1 -> 0.2']
    """
    if isinstance(saved, dict) and isinstance(current, dict):
        found = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            found += differences(saved.get(key), current.get(key), name)
        return found
    return [] if saved == current else [f"{prefix}: {saved!r} -> {current!r}"]


def check_against_saved(folder: str, resolved_yaml: str, allow_change: bool, ignore: Sequence[str] = ()) -> None:
    """Refuse a config that differs from ``folder``'s saved one (unless ``allow_change``)."""
    path = saved_config_path(folder)
    if allow_change or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        saved = comparable(yaml.safe_load(handle) or {}, ignore)
    changed = differences(saved, comparable(yaml.safe_load(resolved_yaml) or {}, ignore))
    if changed:
        shown = "\n  ".join(changed[:20]) + ("\n  ..." if len(changed) > 20 else "")
        raise ConfigMismatchError(
            f"The run folder {folder} holds the config of another run ({path}), and this command's resolved config "
            f"differs from it:\n  {shown}\nResuming with it would continue a different experiment. Use the same "
            "config (a resume reads the saved one by itself: pass only --ckpt_path and the run folder), choose "
            "another --trainer.project_dir, or pass --allow_config_change to replace the saved config.")


def save_config(folder: str, resolved_yaml: str) -> str:
    """Write ``resolved_yaml`` as ``folder/config.yaml`` atomically (a crash never leaves half a file)."""
    os.makedirs(folder, exist_ok=True)
    path = saved_config_path(folder)
    handle, temporary = tempfile.mkstemp(prefix=".config-", suffix=".yaml", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(resolved_yaml)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path
