"""Which run a checkpoint belongs to, and whether it fits the module being fitted.

A *run* is one ``fit`` started without a checkpoint and every resume of it. Its id is drawn when the trainer is
built and replaced by the checkpoint's at each resume ("last" or an explicit path alike: a resumed run continues
the checkpoint's run, as its counters, callbacks and tracker runs do). Every checkpoint's trainer entry holds
``{"id": run id, "module": the module's class, "parameters": {name: shape}}`` (``identity_of``).

``ckpt_path="last"`` falls back from a damaged newest checkpoint only to older checkpoints of the same run
(``same_run``), so another run's checkpoint in a shared folder is never loaded in its place; and before any
checkpoint is loaded into a module, ``check_module`` compares the saved parameter names and shapes with the
module's, so a checkpoint of another model is an error naming both instead of a load that fails half-way (or,
when the names happen to match, a run that silently takes another run's counters).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import torch

from engine.checkpoint import folders
from engine.checkpoint.io import CheckpointError, CorruptCheckpointError, load_torch
from trainer.checkpoint import ckpt_file
from trainer.checkpoint.format import FORMAT
from trainer.checkpoint.lightning_format import identity_in, is_ember


def new_run_id() -> str:
    """A fresh run id (random, so two runs never share one)."""
    return uuid.uuid4().hex


def class_name(module: Any) -> str:
    """``module.path.ClassName`` of ``module``'s class."""
    return f"{type(module).__module__}.{type(module).__qualname__}"


def module_signature(module: torch.nn.Module) -> dict[str, list[int]]:
    """``{name: shape}`` of everything ``module.state_dict()`` holds: global shapes, whether the parameters are
    whole, DTensors (FSDP2, tensor parallelism) or DeepSpeed ZeRO-3 partitions (their ``ds_shape``; the local
    tensor is empty outside a gather, so a signature taken from it would not match the checkpoint's).

    Example:
        >>> module_signature(torch.nn.Linear(3, 2))
        {'weight': [2, 3], 'bias': [2]}
    """
    return {name: list(getattr(value, "ds_shape", None) or value.shape)
            for name, value in module.state_dict(keep_vars=True).items() if isinstance(value, torch.Tensor)}


def identity_of(run_id: str, module: Any, job: str | None = None) -> dict[str, Any]:
    """What a checkpoint's trainer entry records about its run (``module`` may be None: nothing attached yet);
    ``job``: the cluster job that wrote it (``ClusterEnvironment.job_key``, e.g. ``"slurm:4242"``)."""
    if module is None:
        return {"id": run_id, "module": None, "parameters": None, "job": job}
    return {"id": run_id, "module": class_name(module), "parameters": module_signature(module), "job": job}


def of_job(candidates: list[str], job: str) -> list[str]:
    """The checkpoints among ``candidates`` (newest first) that ``job`` wrote; one whose trainer entry cannot be
    read is left out (whose it is cannot be told, so it is never taken for this job's)."""
    kept = []
    for path in candidates:
        try:
            identity = read_identity(path)
        except CorruptCheckpointError:
            continue
        if identity is not None and identity.get("job") == job:
            kept.append(path)
    return kept


def read_identity(folder: str) -> dict[str, Any] | None:
    """The run identity in the trainer entry of committed checkpoint ``folder`` (or ``.ckpt`` file): ``{}`` for a checkpoint written
    before identities existed, ``None`` when it holds no trainer entry (an engine-only checkpoint).

    Raises:
        CorruptCheckpointError: the entry's file fails its manifest check, or the folder has no valid manifest.
    """
    if os.path.isfile(folder):
        return _file_identity(folder)
    manifest = folders.read_manifest(folder)
    if manifest is None:
        raise CorruptCheckpointError(f"Checkpoint {folder} has no valid {folders.MANIFEST_NAME}.")
    for name, record in manifest["files"].items():
        if name.startswith("custom_checkpoint_") and name.endswith(".pkl"):
            folders.check_file(folder, name, record)()  # only a verified entry is trusted (small: read at once)
            payload = load_torch(os.path.join(folder, name))
            if isinstance(payload, dict) and payload.get("format") == FORMAT:
                return dict(payload.get("run") or {})
    return None


def _file_identity(path: str) -> dict[str, Any] | None:
    """The identity in a ``.ckpt`` file, its Ember part's digest checked (not the weights': they are not read);
    ``None`` for a file Lightning wrote (it records no run)."""
    checkpoint = ckpt_file.load(path, mmap=True)
    if not is_ember(checkpoint):
        return None
    ckpt_file.verify(path, checkpoint, keys=[ckpt_file.EMBER_KEY])
    return identity_in(checkpoint)


def same_run(candidates: list[str], context: str) -> list[str]:
    """The newest of ``candidates`` (newest first), then the older ones written by the same run.

    Raises:
        CorruptCheckpointError: the newest one's trainer entry is damaged: its run is unknown, so no older
            checkpoint can safely stand in for it.
    """
    newest, older = candidates[0], candidates[1:]
    try:
        run = _run_id(read_identity(newest))
    except CorruptCheckpointError as error:
        listed = "".join(f"\n  {path}" for path in older) or " (none)"
        raise CorruptCheckpointError(
            f"{context}: {error} Its trainer entry is damaged, so which run it belongs to is unknown, and no older "
            "checkpoint is loaded in its place (it could be another run's). Pass the checkpoint to resume as "
            f"ckpt_path=<folder> (the older committed ones:{listed}), or ckpt_path=None to start fresh.") from error
    kept = [newest]
    for path in older:
        try:
            if _run_id(read_identity(path)) == run:
                kept.append(path)
        except CorruptCheckpointError:
            continue  # its run cannot be told either: never a stand-in
    return kept


def _run_id(identity: dict[str, Any] | None) -> Any:
    """The run id of an identity; ``None`` for checkpoints without one (they only stand in for each other)."""
    return None if identity is None else identity.get("id")


def check_module(folder: str, module: torch.nn.Module, context: str, verb: str = "fitted",
                 strict: bool = True) -> None:
    """Raise unless the parameters saved in ``folder`` have ``module``'s names and shapes (checkpoints without a
    recorded identity are not checked here: loading them fails on its own if they differ). ``strict=False`` (the
    module's ``strict_loading = False``) accepts names missing on either side, as ``load_state_dict`` then does;
    other shapes of a shared name still raise.

    Raises:
        CheckpointError: other names or shapes; the message names both classes and the differences.
        CorruptCheckpointError: the trainer entry fails its check.
    """
    identity = read_identity(folder) or {}
    saved = identity.get("parameters")
    if saved is None:
        return
    current = module_signature(module)
    if saved == current:
        return
    missing = [n for n in current if n not in saved] if strict else []
    unexpected = [n for n in saved if n not in current] if strict else []
    shapes = [f"{n} (checkpoint {saved[n]}, module {current[n]})" for n in current
              if n in saved and saved[n] != current[n]]
    parts = [f"{label}: {_few(names)}" for label, names in (("not in the checkpoint", missing),
                                                           ("not in the module", unexpected),
                                                           ("other shapes", shapes)) if names]
    if not parts:
        return
    raise CheckpointError(
        f"{context}: the checkpoint {folder} was saved from {identity.get('module') or 'another module'} (run "
        f"{identity.get('id')}), whose parameters do not match the {class_name(module)} being {verb}: "
        f"{'; '.join(parts)}. Pass the module the checkpoint was saved from, a checkpoint of this module, or "
        "ckpt_path=None to start fresh.")


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
