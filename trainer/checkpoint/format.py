"""The trainer's part of a checkpoint: its format, and what it may hold.

Where one process holds the whole state (one device, DDP), a trainer checkpoint is one ``.ckpt`` file
(``trainer.checkpoint.ckpt_file``: written atomically, a digest per top-level key, read by ``torch.load`` with its
default ``weights_only=True``) holding Lightning 2.6's keys with their meanings (``trainer.checkpoint.
lightning_format``) plus Ember's exact-resume state under ``"ember"``::

    {dirpath}/epoch=1-step=40-val_acc=0.912.ckpt
        "epoch": 1, "global_step": 40, "pytorch-lightning_version": "2.6.6",
        "state_dict": {name: tensor},            the module's weights
        "optimizer_states": [...], "lr_schedulers": [...], "MixedPrecision": scaler state (fp16 only),
        "loops": {"fit_loop": ...},              Lightning's progress record, built from TrainState
        "callbacks": {state_key: state}, "hparams_name": "kwargs", "hyper_parameters": {...},
        "{DataModuleClass.__qualname__}": the data module's state_dict (when not empty, as Lightning),
        ...what on_save_checkpoint hooks added,
        "ember": {"format": "ember-ckpt", "version": 1, "ember_version", "created", "weights_only": False,
                  "step", "world_size",
                  "ranks": [{"rng": {"step", "rng"}, "dataloaders": {i: position},
                             "gradients": {i: {name: tensor}}  (only inside an unfinished accumulation window)}
                            ... one per rank, gathered to rank 0],
                  "models": [further models' state_dicts], "custom": [the registered objects' states: the
                  trainer's entry below], "digests": {"algorithm": "blake2b-128", "keys": {key: digest}}}

Sharded backends (FSDP2, DeepSpeed, tensor parallelism), asynchronous saves and Ray Train's per-worker parts
write an engine checkpoint folder instead (``Accelerator.save_state``: committed atomically with a checksummed
manifest, loadable without unpickling), as runs saved before checkpoints were files did; both keep loading::

    {dirpath}/epoch=1-step=40-val_acc=0.912.ckpt/
        manifest.json  model.safetensors (or shards)  optimizer.bin  scheduler.bin  scaler.pt
        random_states_{rank}.pkl  dataloader_{i}_{rank}.bin
        gradients_{i}_{rank}.safetensors   only inside an unfinished accumulation window
        custom_checkpoint_{i}.pkl          the trainer's entry

The trainer's entry (``trainer.checkpoint.entry.TrainerEntry``), in either layout, holds only plain values and
tensors: {"format": "ember-trainer", "version": 1, "run": {"id", "module", "parameters": {name: shape}, "job"}
(identity.py), "trainer": {"state": TrainState, "callbacks": {state_key: state}, "datamodule": ...,
"datamodule_key": its class's __qualname__},
"trackers": {name: run identity}, "checkpoint": what on_save_checkpoint hooks added, "callback_metrics":
{name: tensor}, "prepared": [...], "hyper_parameters": {"module": ..., "datamodule": ...}}.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.checkpoint.io import CheckpointError

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
