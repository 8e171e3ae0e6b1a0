"""Lightning's checkpoint dict, both ways: an Ember checkpoint as Lightning 2.6 lays it out, and back.

Ember's ``.ckpt`` file is Lightning's dict (same keys, same meanings) plus ``"ember"``, which holds what an exact
resume needs beyond it and what Lightning does not record: every rank's RNG states and loader positions, pending
gradients mid-accumulation, further models, the registered objects' states (the trainer's entry: ``TrainState``,
the run identity, trackers, callback metrics). Nothing is stored twice that is large: model 0's weights are only
``state_dict``, the optimizers' states only ``optimizer_states``, the schedulers' only ``lr_schedulers``, the
gradient scaler only under ``MixedPrecision`` (Lightning's precision plugin key).

``loops`` is Lightning's progress record (``fit_loop`` ...), built from ``TrainState``, so Lightning resumes an
Ember checkpoint taken at an epoch's end at the next epoch; Ember itself resumes from ``TrainState``.
"""

from __future__ import annotations

import time
from typing import Any

from engine.checkpoint.io import CheckpointError
from engine.version import __version__
from trainer.checkpoint.ckpt_file import EMBER_KEY, FORMAT, VERSION
from trainer.checkpoint.format import FORMAT as ENTRY_FORMAT

# The Lightning release whose checkpoint layout these files follow (its migrations skip files of this version).
LIGHTNING_VERSION = "2.6.6"
SCALER_KEY = "MixedPrecision"  # Lightning's key for the gradient scaler (its precision plugin's class name)
LIGHTNING_KEYS = ("epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks",
                  "optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters",
                  "datamodule_hparams_name", "datamodule_hyper_parameters", "hparams_type",
                  "datamodule_hparams_type", SCALER_KEY)


def trainer_entry(custom: list[Any]) -> dict[str, Any] | None:
    """The trainer's entry among the registered objects' states (None: an engine-only checkpoint)."""
    return next((c for c in custom if isinstance(c, dict) and c.get("format") == ENTRY_FORMAT), None)


def lightning_epoch(state: dict[str, Any]) -> int:
    """Lightning's ``epoch`` for ``TrainState`` values: the epoch in progress; at an epoch's end inside ``fit``
    the one just finished (Ember has already moved to the next one there; Lightning saves before it does). A
    checkpoint taken outside a run (``trainer.save_checkpoint`` after ``fit`` returned) holds the epoch ``fit``
    ended at, as Lightning's ``current_epoch`` then.

    >>> lightning_epoch({"epoch": 2, "batch_in_epoch": 0, "stage": "train"})
    1
    >>> lightning_epoch({"epoch": 2, "batch_in_epoch": 3}), lightning_epoch({"epoch": 2, "batch_in_epoch": 0,
    ...                                                                       "stage": "idle"})
    (2, 2)
    """
    epoch, batch = int(state["epoch"]), int(state["batch_in_epoch"])
    inside_fit = state.get("stage", "train") != "idle"
    return epoch - 1 if batch == 0 and epoch > 0 and inside_fit else epoch


def _progress(done: int, current: int, started: bool = True) -> dict[str, Any]:
    counts = {"ready": done, "completed": done, "started": done, "processed": done}
    now = {"ready": current, "completed": current, "started": current, "processed": current}
    if not started:
        counts.pop("started"), counts.pop("processed"), now.pop("started"), now.pop("processed")
    return {"total": counts, "current": now}


def loops_of(state: dict[str, Any]) -> dict[str, Any]:
    """Lightning 2.6's ``loops`` entry for ``TrainState`` values (recorded from lightning 2.6.6's own files).

    At an epoch's end the epoch counts as processed but not completed, with its last batch done, as in a
    checkpoint Lightning's ``ModelCheckpoint`` writes there: Lightning goes on with the next epoch. The batches
    of the finished epoch are the run's batches per epoch so far (exact when every epoch has as many).
    """
    epoch, batch = int(state["epoch"]), int(state["batch_in_epoch"])
    steps, batches = int(state["global_step"]), int(state["micro_step"])
    at_end = batch == 0 and epoch > 0
    current = batches // epoch if at_end else batch
    epochs = {"total": {"ready": epoch + (0 if at_end else 1), "completed": epoch - 1 if at_end else epoch,
                        "started": epoch + (0 if at_end else 1), "processed": epoch},
              "current": {}}
    epochs["current"] = dict(epochs["total"])
    batch_progress = {**_progress(batches, current), "is_last_batch": at_end}
    idle = {**_progress(0, 0), "is_last_batch": False}
    optimizer = {"step": _progress(steps, min(steps, current), started=False),
                 "zero_grad": {k: {**v, "started": v["ready"]} for k, v in
                               _progress(steps, min(steps, current), started=False).items()}}
    fit_loop = {
        "state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": steps},
        "epoch_loop.batch_progress": batch_progress,
        "epoch_loop.scheduler_progress": _progress(epoch, 1 if at_end else 0, started=False),
        "epoch_loop.automatic_optimization.state_dict": {},
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": optimizer},
        "epoch_loop.manual_optimization.state_dict": {},
        "epoch_loop.manual_optimization.optim_step_progress": _progress(0, 0, started=False),
        "epoch_loop.val_loop.state_dict": {}, "epoch_loop.val_loop.batch_progress": idle,
        "epoch_progress": epochs}
    evaluation = {"state_dict": {}, "batch_progress": idle}
    return {"fit_loop": fit_loop, "validate_loop": evaluation, "test_loop": evaluation,
            "predict_loop": {"state_dict": {}, "batch_progress": _progress(0, 0)}}


def _hyper_parameters(entry: dict[str, Any]) -> dict[str, Any]:
    """Lightning's hyper-parameter keys from the entry (values that are not plain data stay sealed; an OmegaConf
    config's type is named as text, which Lightning reads back as an ``AttributeDict``)."""
    found: dict[str, Any] = {}
    saved = entry.get("hyper_parameters") or {}
    for role, prefix in (("module", ""), ("datamodule", "datamodule_")):
        if saved.get(role):
            found[f"{prefix}hparams_name"] = saved.get(f"{role}_name", "kwargs")
            found[f"{prefix}hyper_parameters"] = saved[role]
            if saved.get(f"{role}_type"):
                found[f"{prefix}hparams_type"] = saved[f"{role}_type"]
    return found


def compose(values: dict[str, Any]) -> dict[str, Any]:
    """The ``.ckpt`` dict of an engine checkpoint's values (``Accelerator.state_values``) holding the trainer's
    entry: Lightning's keys first, then ``"ember"``."""
    entry = trainer_entry(values["custom"])
    if entry is None:
        raise CheckpointError("The checkpoint holds no trainer entry: it was not taken by a Trainer.")
    state, models = entry["trainer"]["state"], values["models"]
    checkpoint: dict[str, Any] = {
        "epoch": lightning_epoch(state), "global_step": int(state["global_step"]),
        "pytorch-lightning_version": LIGHTNING_VERSION, "state_dict": models[0] if models else {},
        "loops": loops_of(state), "callbacks": entry["trainer"]["callbacks"],
        "optimizer_states": values["optimizers"], "lr_schedulers": values["schedulers"]}
    if values.get("scaler") is not None:
        checkpoint[SCALER_KEY] = values["scaler"]
    checkpoint.update(_hyper_parameters(entry))
    datamodule, key = entry["trainer"].get("datamodule"), entry["trainer"].get("datamodule_key")
    if datamodule and key and key not in checkpoint:  # Lightning's place for it: the class's __qualname__ (small)
        checkpoint[key] = datamodule
    for key, value in (entry.get("checkpoint") or {}).items():  # what on_save_checkpoint hooks added, as Lightning
        checkpoint.setdefault(key, value)
    checkpoint[EMBER_KEY] = {"format": FORMAT, "version": VERSION, "ember_version": __version__,
                             "created": time.time(), "weights_only": False, "step": values["step"], "world_size": values["world_size"],
                             "models": models[1:], "custom": values["custom"], "ranks": values["ranks"]}
    return checkpoint


def compose_weights(weights: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """A weights-only ``.ckpt`` dict (Lightning's ``save_weights_only``: no optimizer, scheduler or callback
    state): the module's ``weights``, the counters, the hyper-parameters and the run identity."""
    state = entry["trainer"]["state"]
    checkpoint: dict[str, Any] = {
        "epoch": lightning_epoch(state), "global_step": int(state["global_step"]),
        "pytorch-lightning_version": LIGHTNING_VERSION, "state_dict": weights, "loops": loops_of(state)}
    checkpoint.update(_hyper_parameters(entry))
    checkpoint[EMBER_KEY] = {"format": FORMAT, "version": VERSION, "ember_version": __version__,
                             "created": time.time(), "weights_only": True, "run": entry.get("run") or {}}
    return checkpoint


def is_ember(checkpoint: dict[str, Any]) -> bool:
    """Whether ``checkpoint`` was written by Ember (else: Lightning, or another tool with Lightning's keys)."""
    ember = checkpoint.get(EMBER_KEY)
    return isinstance(ember, dict) and ember.get("format") == FORMAT


def check_version(checkpoint: dict[str, Any], path: str) -> None:
    """Raise unless this Ember can read the file's Ember part."""
    version = checkpoint[EMBER_KEY].get("version", 0)
    if version > VERSION:
        raise CheckpointError(f"{path} was written by a newer Ember (.ckpt format version {version} > {VERSION}): "
                              "upgrade ember-train to load it.")


def values_of(checkpoint: dict[str, Any], path: str) -> dict[str, Any]:
    """The engine values (``Accelerator.load_state_values``) of an Ember ``.ckpt`` dict: ``compose`` undone."""
    ember = checkpoint[EMBER_KEY]
    if ember.get("weights_only"):
        raise CheckpointError(f"{path} holds the module's weights only (save_weights_only=True / "
                              "save_checkpoint(weights_only=True)): it cannot resume a run. Load it with "
                              "Module.load_from_checkpoint, or resume from a complete checkpoint.")
    return {"step": ember["step"], "world_size": ember["world_size"],
            "models": [checkpoint["state_dict"], *ember["models"]], "optimizers": checkpoint["optimizer_states"],
            "schedulers": checkpoint["lr_schedulers"], "scaler": checkpoint.get(SCALER_KEY),
            "custom": ember["custom"], "ranks": ember["ranks"]}


def identity_in(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The run identity an Ember ``.ckpt`` dict records (``{}`` when none, None: no trainer entry)."""
    ember = checkpoint[EMBER_KEY]
    if ember.get("weights_only"):
        return dict(ember.get("run") or {})
    entry = trainer_entry(ember.get("custom", []))
    return None if entry is None else dict(entry.get("run") or {})
