"""The trainer's part of a checkpoint: its format, and what it may hold.

A trainer checkpoint is an engine checkpoint folder (``Accelerator.save_state``: committed atomically with a
checksummed manifest, loadable without unpickling) plus the trainer's own part, one object registered with
``register_for_checkpointing`` (``trainer.checkpoint.entry.TrainerEntry``) whose state holds only plain values
and tensors::

    {dirpath}/epoch=1-step=40-val_acc=0.912/
        manifest.json                 files, sizes, checksums, step, world size (written last: the commit)
        model.safetensors             the module's weights (model_1... when an evaluation prepared it first)
        optimizer.bin  scheduler.bin  scaler.pt
        random_states_{rank}.pkl      python / numpy / torch / CUDA RNG states of every rank
        dataloader_{i}_{rank}.bin     each prepared loader's exact position, per rank
        gradients_{i}_{rank}.safetensors   gradients pending mid-accumulation (only then)
        custom_checkpoint_{i}.pkl     i = the trainer's entry: {"format": "ember-trainer", "version": 1,
                                      "run": {"id", "module", "parameters": {name: shape}} (identity.py),
                                      "trainer": {"state": TrainState, "callbacks": {state_key: state},
                                      "datamodule": ...}, "trackers": {name: run identity},
                                      "checkpoint": what on_save_checkpoint hooks added,
                                      "callback_metrics": {name: tensor}, "prepared": [...],
                                      "hyper_parameters": {"module": ..., "datamodule": ...}}
"""

from __future__ import annotations

from typing import Any

import torch

from engine.checkpoint_io import CheckpointError

FORMAT = "ember-trainer"
VERSION = 1
_PLAIN = (str, int, float, bool, type(None))


def check_format(payload: Any) -> None:
    """Raise ``CheckpointError`` unless ``payload`` is a trainer entry this version can read."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError("The checkpoint's trainer entry is not an Ember trainer state: load it with the "
                              "same script (the same objects registered with register_for_checkpointing).")
    if payload.get("version", 0) > VERSION:
        raise CheckpointError(f"The checkpoint was written by a newer trainer (format version "
                              f"{payload['version']} > {VERSION}): upgrade ember-train to resume it.")


def check_plain(value: Any, where: str) -> None:
    """Raise if ``value`` holds anything but plain values, tensors, lists, tuples and dicts.

    Those load with ``torch.load(weights_only=True)``; anything else would make the checkpoint unloadable
    without unpickling, so it fails now, naming the key, instead of at resume time.

    Example:
        >>> check_plain({"step": 3, "scores": [0.5, torch.tensor(1.0)]}, "checkpoint")
        >>> check_plain({"when": object()}, "checkpoint")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: Checkpoint entry checkpoint['when'] is a object (...
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
