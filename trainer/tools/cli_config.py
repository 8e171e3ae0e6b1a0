"""The run folder as the CLI sees it: the resolved config saved at the start of a run, and the best checkpoint.

A run folder (``Trainer(project_dir=...)``) holds ``config.yaml``, the fully resolved config of the run that
wrote it. Resuming (``--ckpt_path``) parses that file first, so ``ember fit --trainer.project_dir runs/x
--ckpt_path last`` needs nothing else; a command whose resolved config differs from the saved one is refused
(the checkpoint would continue a different experiment) unless ``--allow_config_change`` is given, and a new run
into a folder that holds another run's config is refused the same way. ``ember test|validate|predict`` read the
same file, so ``ember test --config runs/x/config.yaml --ckpt_path best`` evaluates a finished run; only the
model must match the saved one there (the data, trainer flags and loaders may differ on purpose).
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


def comparable(config: dict[str, Any], ignore: Sequence[str] = (), only: Sequence[str] | None = None) -> dict[str, Any]:
    """``config`` without the keys that may change between a run and its resume (and ``ignore``); with ``only``,
    just those keys."""
    return {k: v for k, v in config.items()
            if k not in IGNORED_KEYS and k not in ignore and (only is None or k in only)}


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


def check_against_saved(folder: str, resolved_yaml: str, allow_change: bool, ignore: Sequence[str] = (),
                        only: Sequence[str] | None = None) -> None:
    """Refuse a config that differs from ``folder``'s saved one (unless ``allow_change``); ``only``: compare just
    those sections."""
    path = saved_config_path(folder)
    if allow_change or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        saved = comparable(yaml.safe_load(handle) or {}, ignore, only)
    changed = differences(saved, comparable(yaml.safe_load(resolved_yaml) or {}, ignore, only))
    if changed:
        # One line, printed without a traceback by `ember`: what changed, then what to do.
        shown = "; ".join(changed[:20]) + (f"; ... ({len(changed)} in all)" if len(changed) > 20 else "")
        raise ConfigMismatchError(
            f"{path} holds the config this run folder was started with, and this command differs from it: {shown}. "
            "Pass --allow_config_change to go on with this config (it replaces the saved one), or leave those "
            "settings out (a resume reads the saved config by itself), or choose another --trainer.project_dir.")


def finished_run_best(trainer: Any) -> str | None:
    """The best checkpoint the run in ``trainer``'s folder recorded (its first ``ModelCheckpoint``'s
    ``best_model_path``, read from the newest committed checkpoint), or None.

    A new process (``ember test --ckpt_path best``) has a fresh ``ModelCheckpoint`` that saved nothing, so
    ``"best"`` cannot come from it; the finished run wrote its top-k record into every checkpoint.
    """
    from callbacks import ModelCheckpoint
    from engine.checkpoint.folders import committed_checkpoints
    from trainer.checkpoint.loading import read_entry

    callbacks = trainer.checkpoint_callbacks
    if not callbacks or callbacks[0].best_model_path:
        return None
    folders = [trainer.default_checkpoint_dir] + [c.dirpath for c in callbacks if c.dirpath]
    found = committed_checkpoints(*dict.fromkeys(folders), auto_named=False)  # oldest first
    if not found:
        return None
    entry = read_entry(found[-1][1], unpickle=False)
    state = ((entry or {}).get("trainer") or {}).get("callbacks", {}).get(callbacks[0].state_key)
    if not state:
        return None
    return ModelCheckpoint.best_path_in(state, trainer.accelerator.project_dir or os.getcwd()) or None


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
