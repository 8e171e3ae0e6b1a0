"""Which checkpoints a folder holds, oldest first: committed checkpoint folders and Ember ``.ckpt`` files.

A folder counts once its manifest is committed (``engine.checkpoint.folders``); a file once it is in place (it is
renamed there complete), unless it is a weights-only file (it cannot resume a run) or not Ember's (another tool's
file in the same folder is never resumed by ``"last"``). A file whose structure does not even load is listed too,
at its modification time: it may be a damaged Ember checkpoint, and resume reports it instead of skipping it
silently. Hidden names (a write in progress) are never listed.
"""

from __future__ import annotations

import os

from engine.checkpoint import folders
from engine.checkpoint.io import CheckpointError, UnsafeCheckpointError
from trainer.checkpoint import ckpt_file
from trainer.checkpoint.ckpt_file import EMBER_KEY
from trainer.checkpoint.lightning_format import is_ember

_ZIP_MAGIC = b"PK"  # torch.save writes zip archives


def file_created(path: str) -> float | None:
    """When the Ember ``.ckpt`` file ``path`` was written (recorded in it, so a copied run keeps the order);
    its modification time if it does not load; None if it is not a resumable Ember checkpoint."""
    try:
        with open(path, "rb") as handle:
            if handle.read(2) != _ZIP_MAGIC:
                return None
        checkpoint = ckpt_file.load(path, mmap=True)
    except UnsafeCheckpointError:  # needs unpickling: another tool's file (Ember's never do)
        return None
    except CheckpointError:  # damaged
        return os.path.getmtime(path)
    except OSError:
        return None
    if not is_ember(checkpoint) or checkpoint[EMBER_KEY].get("weights_only"):
        return None
    return float(checkpoint[EMBER_KEY].get("created", os.path.getmtime(path)))


def committed(*directories: str) -> list[str]:
    """Every committed checkpoint folder and resumable ``.ckpt`` file directly inside ``directories``, oldest
    first (by the time each recorded, then by path)."""
    found: list[tuple[float, str]] = []
    for base in directories:
        try:
            names = os.listdir(base)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            path = os.path.join(base, name)
            if name.startswith("."):
                continue
            if os.path.isdir(path):
                manifest = folders.read_manifest(path)
                if manifest is not None:
                    found.append((float(manifest.get("created", 0.0)), path))
            elif os.path.isfile(path):
                created = file_created(path)
                if created is not None:
                    found.append((created, path))
    return [path for _, path in sorted(found)]


def is_checkpoint(path: str) -> bool:
    """Whether ``path`` is a committed checkpoint folder or a checkpoint file (Ember's or another tool's)."""
    return folders.is_committed(path) or os.path.isfile(path)
