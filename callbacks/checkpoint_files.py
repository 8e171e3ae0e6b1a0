"""What ``ModelCheckpoint`` does to checkpoints (files or folders) besides writing them: delete replaced ones, link
``last.ckpt``, store their paths relative to the run folder (so a copied run folder stays self-contained), and tell
the loggers."""

from __future__ import annotations

import os
import weakref
from typing import Any

from callbacks.protocols import TrainerView
from engine.checkpoint import folders


def weights_only_folder(path: str) -> bool:
    """Whether ``path`` holds only what ``save_model`` writes (``save_weights_only=True`` checkpoints)."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return bool(names) and all(n.startswith("model") and n.endswith((".safetensors", ".bin", ".index.json"))
                               for n in names)


def remove_checkpoints(trainer: TrainerView, paths: list[str]) -> None:
    """Delete replaced checkpoints, on the process that writes them, only once the new one is committed.

    Never anything the callback did not write: a ``last.ckpt`` link (the link, not its target), a ``.ckpt``
    file, a committed checkpoint folder, or a weights-only folder.
    """
    config = trainer.accelerator.project_configuration
    writer = trainer.accelerator.is_local_main_process if config.save_on_each_node else trainer.is_global_zero
    if not writer:
        return
    for path in paths:
        if os.path.islink(path) or os.path.isfile(path):  # a .ckpt file goes in one step (unlink is atomic)
            os.unlink(path)
        elif folders.is_committed(path) or weights_only_folder(path):
            folders.remove_folder(path)


def link_checkpoint(trainer: TrainerView, target: str, link: str) -> None:
    """Make ``link`` a relative symbolic link to the checkpoint ``target`` (``save_last="link"``), replacing what
    was there; every process waits until process 0 made it."""
    if trainer.is_global_zero:
        if os.path.islink(link) or os.path.isfile(link):  # a link, or a full last.ckpt file written before
            os.unlink(link)
        elif os.path.isdir(link) and folders.is_committed(link):
            folders.remove_folder(link)  # a full last checkpoint written before any top-k one existed
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)
    if trainer.world_size > 1:
        trainer.accelerator.wait_for_everyone()


def relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` (``/``-separated) when it lies inside it; otherwise unchanged (absolute)."""
    if not path or not base:
        return path
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(base))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return os.path.abspath(path)  # a dirpath outside the run folder stays where it is when the run moves
    return rel.replace(os.sep, "/")


def resolve(path: str, base: str) -> str:
    """The inverse of ``relative``: a relative path joined to ``base``; an absolute one unchanged."""
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base, *path.split("/")))


def tell_loggers(trainer: TrainerView, callback: Any) -> None:
    """Lightning's ``logger.after_save_checkpoint(proxy(callback))`` to every logger after each checkpoint written
    (not a ``last.ckpt`` link), on the main process. A logger that uploads checkpoints reads the callback's paths
    and scores there; a duck-typed logger may lack the method (Lightning's base ``Logger`` does nothing in it)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            notify = getattr(logger, "after_save_checkpoint", None)
            if notify is not None:
                notify(weakref.proxy(callback))
