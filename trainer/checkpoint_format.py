"""The trainer's part of a checkpoint: its format, what it may hold, and finding the newest checkpoint.

A trainer checkpoint is an engine checkpoint folder (``Accelerator.save_state``: committed atomically with a
checksummed manifest, loadable without unpickling) plus the trainer's own part, one object registered with
``register_for_checkpointing`` whose state holds only plain values and tensors::

    {dirpath}/epoch=1-step=40-val_acc=0.912/
        manifest.json                 files, sizes, checksums, step, world size (written last: the commit)
        model.safetensors             the module's weights (model_1... when an evaluation prepared it first)
        optimizer.bin  scheduler.bin  scaler.pt
        random_states_{rank}.pkl      python / numpy / torch / CUDA RNG states of every rank
        dataloader_{i}_{rank}.bin     each prepared loader's exact position, per rank
        gradients_{i}_{rank}.safetensors   gradients pending mid-accumulation (only then)
        custom_checkpoint_{i}.pkl     i = the trainer's entry: {"format": "ember-trainer", "version": 1,
                                      "trainer": {"state": TrainState, "callbacks": {state_key: state},
                                      "datamodule": ...}, "trackers": {name: run identity},
                                      "checkpoint": what on_save_checkpoint hooks added,
                                      "callback_metrics": {name: tensor}, "prepared": [...],
                                      "hyper_parameters": {"module": ..., "datamodule": ...}}

Inside ``fit``, checkpoints are written only at *boundaries*, points from which a run continues exactly: after
a training batch is completely done (its optimizer step, validation, schedulers and stop decision), or after an
epoch's end hooks and epoch schedulers, with ``TrainState`` already moved to the next epoch. A save asked for
anywhere else in the loop (``trainer.save_checkpoint`` in a hook, ``ModelCheckpoint``) waits for the next one.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from engine import checkpointing as folders
from engine.checkpoint_io import CheckpointError

FORMAT = "ember-trainer"
VERSION = 1
_PLAIN = (str, int, float, bool, type(None))


class TrainerCheckpointState:
    """The trainer's entry in engine checkpoints; ``state_dict`` holds plain values and tensors only.

    ``pending`` is filled on every process just before a save (the checkpoint hooks run there); a save the
    trainer did not start (``accelerator.save_state()`` by hand) builds it on the writing process instead.
    """

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build = weakref.WeakMethod(build)  # type: ignore[arg-type]  # no cycle through the accelerator
        self.pending: dict[str, Any] | None = None
        self.loaded: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self.pending is not None:
            return self.pending
        build = self._build()
        if build is None:
            raise RuntimeError("The Trainer that registered this checkpoint entry no longer exists.")
        return build()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or state_dict.get("format") != FORMAT:
            raise CheckpointError("The checkpoint's trainer entry is not an Ember trainer state: load it with the "
                                  "same script (the same objects registered with register_for_checkpointing).")
        if state_dict.get("version", 0) > VERSION:
            raise CheckpointError(f"The checkpoint was written by a newer trainer (format version "
                                  f"{state_dict['version']} > {VERSION}): upgrade ember-train to resume it.")
        self.loaded = state_dict


def check_plain(value: Any, where: str) -> None:
    """Raise if ``value`` holds anything but plain values, tensors, lists, tuples and dicts.

    Those load with ``torch.load(weights_only=True)``; anything else would make the checkpoint unloadable
    without unpickling, so it fails now, naming the key, instead of at resume time.
    """
    if isinstance(value, (*_PLAIN, torch.Tensor)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"Checkpoint entry {where} has a key {key!r} of type {type(key).__name__}: use str "
                                "or int keys.")
            check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"Checkpoint entry {where} is a {type(value).__name__} ({value!r:.80}); checkpoints hold only "
                    "str / int / float / bool / None, tensors, lists, tuples and dicts, so they load without "
                    "unpickling. Convert it (e.g. .tolist(), str(...)) in state_dict / on_save_checkpoint.")


def committed_checkpoints(directories: list[str]) -> list[str]:
    """Every committed checkpoint folder directly inside any of ``directories``, newest first (by manifest)."""
    found: list[tuple[float, str]] = []
    for directory in directories:
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if name.startswith("."):
                continue  # a save in progress, or one being deleted: never a candidate
            path = os.path.join(directory, name)
            manifest = folders.read_manifest(path) if os.path.isdir(path) else None
            if manifest is not None:
                found.append((float(manifest.get("created", 0.0)), path))
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


def newest_checkpoint(directories: list[str]) -> str | None:
    """The most recently committed checkpoint folder directly inside any of ``directories`` (by its manifest)."""
    found = committed_checkpoints(directories)
    return found[0] if found else None
