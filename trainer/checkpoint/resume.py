"""``ckpt_path`` resolved to a ``Resume`` value, and a run or a module restored from it.

``"last"``: the newest committed checkpoint in ``{project_dir}/checkpoints`` and every ModelCheckpoint's
``dirpath``; when it fails its checks (flipped bits on disk, a truncated copy), the previous committed one *of
the same run* is loaded instead, with a warning naming the damaged one (``trainer.checkpoint.identity``).
``"best"``: the first ModelCheckpoint's ``best_model_path``. Anything else: that committed checkpoint folder,
never swapped for another. Before a checkpoint is loaded into a module, its saved parameter names and shapes
are compared with the module's.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine import Accelerator, broadcast_object_list, gather_object
from engine.checkpoint import folders
from engine.checkpoint.io import CheckpointError, CorruptCheckpointError, UnsafeCheckpointError
from engine.checkpoint.save import describe, first_failure, raise_agreed
from engine.checkpoint.state import read_model_weights
from trainer.checkpoint import ckpt_file, discovery
from trainer.checkpoint.identity import check_module, of_job, same_run
from trainer.checkpoint.lightning_format import check_version, is_ember, values_of
from trainer.checkpoint.world_size import check_world_size

# Applies a checkpoint Lightning wrote (its dict, its path) to the run's parts (``lightning_import``).
LightningRestore = Callable[[dict[str, Any], str], None]

_ERRORS: dict[str, type[Exception]] = {"FileNotFoundError": FileNotFoundError, "ValueError": ValueError,
                                       "CheckpointError": CheckpointError,
                                       "CorruptCheckpointError": CorruptCheckpointError,
                                       "UnsafeCheckpointError": UnsafeCheckpointError}


@dataclass(frozen=True)
class Resume:
    """Where a run resumes from: ``ckpt_path`` as given, and the committed checkpoints (folders or ``.ckpt``
    files) to try, newest first; ``unpickle``: the caller opted in to full unpickling (``weights_only=False``).

    Only ``"last"`` has more than one candidate (the older ones it may fall back to).
    """

    ckpt_path: str
    candidates: tuple[str, ...]
    unpickle: bool = False

    @property
    def folder(self) -> str:
        """The folder to load first."""
        return self.candidates[0]


def newest(directories: list[str]) -> str | None:
    """The newest committed checkpoint in ``directories`` (what ``ckpt_path="last"`` loads first), or None."""
    found = discovery.committed(*directories)
    return found[-1] if found else None


def resolve(accelerator: Accelerator, ckpt_path: str | os.PathLike[str] | None, entry: str, *,
            directories: list[str], best_path: str | None, has_checkpoint_callback: bool,
            required: bool = False, job: str | None = None, fallbacks: list[str] | None = None) -> Resume | None:
    """What ``ckpt_path`` names, decided on process 0 and shared; ``None``: start fresh.

    Args:
        ckpt_path: ``"last"``, ``"best"``, a checkpoint folder, or None.
        entry: the trainer method asking (``"fit"``, ``"test"``...), for the messages.
        directories: where ``"last"`` looks (the default folder, then every ModelCheckpoint's ``dirpath``).
        best_path: the first ModelCheckpoint's ``best_model_path`` (``"best"``).
        has_checkpoint_callback: whether there is a ModelCheckpoint at all (for the message about ``"best"``).
        required: no checkpoint found is an error (evaluation), not a fresh start (``fit``).
        job: the cluster job key (``ClusterEnvironment.job_key``): with ``ckpt_path=None``, the newest committed
            checkpoint this job wrote is resumed (a requeued job continues by itself); none: a fresh start.
        fallbacks: older checkpoints the cluster keeps (``ClusterEnvironment.fallbacks``, newest first): an
            explicit ``ckpt_path`` that is damaged or not committed falls back to those of its run, as "last" does.
    """
    if ckpt_path is None or ckpt_path == "hpc":  # "hpc": Lightning's name for a requeued SLURM job's checkpoint
        if job is None:
            if ckpt_path is None:
                return None
            raise ValueError(f"{entry}(ckpt_path='hpc') resumes a requeued SLURM job from its own checkpoint, but "
                             "this process is not a task of a SLURM batch job (no SLURMEnvironment). Pass "
                             "ckpt_path='last' for the newest checkpoint of the project, or a checkpoint folder.")
        resume = _job_resume(accelerator, directories, job)
        if resume is None and ckpt_path == "hpc":
            accelerator.print(f"{entry}(ckpt_path='hpc'): {job} has written no checkpoint yet; starting a new run.")
        return resume
    outcome: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            outcome[0] = ("ok", _find(os.fspath(ckpt_path), entry, directories, best_path, has_checkpoint_callback,
                                      fallbacks or []))
        except (ValueError, FileNotFoundError, CheckpointError) as error:  # raised on every process alike
            outcome[0] = (type(error).__name__, str(error))
    if accelerator.num_processes > 1:
        broadcast_object_list(outcome)
    kind, value = outcome[0]
    if kind != "ok":
        raise _ERRORS.get(kind, ValueError)(value)
    if not value:
        message = f"{entry}(ckpt_path={ckpt_path!r}): no committed checkpoint in {directories}"
        if required:
            raise FileNotFoundError(message + ".")
        if accelerator.is_main_process:  # a warning, as Lightning's (its words: "No checkpoint will be loaded")
            warnings.warn(f"{message}. No checkpoint will be loaded; starting a new run.", UserWarning, stacklevel=4)
        return None
    return Resume(os.fspath(ckpt_path), tuple(value))


def _job_resume(accelerator: Accelerator, directories: list[str], job: str) -> Resume | None:
    """The checkpoints ``job`` wrote in ``directories``, newest first, as a ``"last"`` resume (a damaged newest
    one falls back to the job's previous one); None when it wrote none (its first start)."""
    found: list[Any] = [None]
    if accelerator.is_main_process:
        found[0] = of_job(list(reversed(discovery.committed(*directories))), job)
    if accelerator.num_processes > 1:
        broadcast_object_list(found)
    if not found[0]:
        return None
    accelerator.print(f"fit(ckpt_path=None): {job} wrote checkpoints before (the job was requeued); resuming from "
                      f"its newest, {found[0][0]}.")
    return Resume("last", tuple(found[0]))


def _find(ckpt_path: str, entry: str, directories: list[str], best_path: str | None,
          has_checkpoint_callback: bool, fallbacks: list[str]) -> list[str]:
    """The folder to load first, then (for ``"last"``) the older committed ones to fall back to."""
    if ckpt_path == "last":
        found = list(reversed(discovery.committed(*directories)))
        return same_run(found, f"{entry}(ckpt_path='last')") if found else []
    if ckpt_path == "best":
        if not best_path:
            raise ValueError(f"{entry}(ckpt_path='best') needs a ModelCheckpoint that has saved a checkpoint; "
                             f"{'it has saved none yet' if has_checkpoint_callback else 'there is none'}. Pass a "
                             "path or 'last'.")
        return [best_path]
    folder = os.path.abspath(ckpt_path)
    if fallbacks:  # the cluster's older checkpoints of the same run may stand in for a damaged one
        found = [path for path in (folder, *fallbacks) if discovery.is_checkpoint(path)]
        if found:
            return same_run(found, f"{entry}(ckpt_path={ckpt_path!r})")
    if os.path.isfile(folder):  # a .ckpt file: Ember's (verified when loaded) or Lightning's
        return [folder]
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{entry}(ckpt_path={ckpt_path!r}): Checkpoint file not found: {folder}. "
                                "Pass a .ckpt written by trainer.save_checkpoint / ModelCheckpoint (or Lightning), "
                                "'last' for the newest one in the project, or None to start fresh.")
    if not folders.is_committed(folder):
        raise ValueError(f"{entry}(ckpt_path={ckpt_path!r}) is not a committed checkpoint: it has no valid "
                         f"{folders.MANIFEST_NAME} (an interrupted save, or not written by Ember).")
    return [folder]


def read_agreed(accelerator: Accelerator, path: str, unpickle: bool) -> dict[str, Any]:
    """Read and verify the ``.ckpt`` file ``path`` on every process; a failure on any one is raised on all (so
    none waits in the load's collectives while another gave up)."""
    loaded, error = None, None
    try:
        loaded = ckpt_file.read(path, unpickle=unpickle)
    except Exception as err:  # noqa: BLE001 - shared with every process just below
        error = err
    if accelerator.num_processes > 1:
        failure = first_failure(gather_object([(accelerator.process_index, describe(error))]))
        if failure is not None:
            raise_agreed(failure, error, accelerator.process_index)
    elif error is not None:
        raise error
    assert loaded is not None
    return loaded


def strict_loading(module: torch.nn.Module) -> bool:
    """Whether a resume or an evaluation's ``ckpt_path`` loads the weights strictly: the module's
    ``strict_loading`` (``None``, the default, is strict), as Lightning does.

    >>> strict_loading(torch.nn.Linear(1, 1))
    True
    """
    return getattr(module, "strict_loading", None) is not False


def restore(accelerator: Accelerator, resume: Resume, entry: str, module: torch.nn.Module, *,
            allow_world_size_change: bool = False, lightning: LightningRestore | None = None,
            before_load: Callable[[str], None] | None = None) -> str:
    """Load the first candidate of ``resume`` that verifies; returns the checkpoint loaded.

    A folder is loaded by ``accelerator.load_state``; an Ember ``.ckpt`` file is read and verified on every
    process and applied by ``accelerator.load_state_values``; a file Lightning wrote is applied by ``lightning``.

    Everything registered with the engine is restored by it, the trainer's own entry included. A damaged
    explicit path raises at once, saying what to do instead; a checkpoint of another model (other parameter
    names or shapes than ``module``'s), or one saved by another number of processes (unless
    ``allow_world_size_change``: ``trainer.checkpoint.world_size``), raises before anything is loaded. The weights
    load as strictly as ``strict_loading(module)`` says (a module with ``strict_loading = False`` takes a
    checkpoint missing some of its parameters, e.g. frozen ones its ``state_dict`` leaves out).
    """
    context = f"{entry}(ckpt_path={resume.ckpt_path!r})"
    strict = strict_loading(module)

    def load(folder: str) -> None:
        if before_load is not None:  # what must happen before the engine loads this candidate (early callbacks)
            before_load(folder)
        if os.path.isfile(folder):
            load_file(folder)
            return
        check_module(folder, module, context, strict=strict)
        check_world_size(folder, accelerator.num_processes, allow_world_size_change, context)
        accelerator.load_state(folder, strict=strict)

    def load_file(path: str) -> None:
        checkpoint = read_agreed(accelerator, path, resume.unpickle)
        if not is_ember(checkpoint):
            if lightning is None:
                raise CheckpointError(f"{context}: {path} was not written by Ember, and this entry point cannot "
                                      "resume another tool's checkpoint.")
            lightning(checkpoint, path)
            return
        check_version(checkpoint, path)
        check_module(path, module, context, strict=strict)
        values = values_of(checkpoint, path)
        check_world_size(path, accelerator.num_processes, allow_world_size_change, context,
                         saved=int(values["world_size"]))
        accelerator.load_state_values(values, path, strict=strict)

    if resume.ckpt_path == "last" or len(resume.candidates) > 1:  # or a cluster's, with older ones to fall back to
        return folders.load_first_intact(
            load, resume.candidates, context=context, warn=accelerator.is_main_process,
            advice="To start a new run, pass ckpt_path=None (or move these folders out of the checkpoint "
                   "directory); the damaged folders are left in place for inspection.")
    try:
        load(resume.folder)
    except CorruptCheckpointError as error:
        raise CorruptCheckpointError(
            f"{entry}(ckpt_path={resume.ckpt_path!r}): {error} Pass ckpt_path='last' to resume from the newest "
            "checkpoint that verifies, another checkpoint folder, or ckpt_path=None to start fresh.") from error
    return resume.folder


def load_weights(module: torch.nn.Module, resume: Resume, entry: str) -> None:
    """Load only the module's weights from ``resume``'s folder (validate / test / predict with ``ckpt_path``), as
    strictly as ``strict_loading(module)`` says."""
    folder, strict = resume.folder, strict_loading(module)
    if os.path.isfile(folder):
        checkpoint = ckpt_file.read(folder, unpickle=resume.unpickle)
        if is_ember(checkpoint):
            check_module(folder, module, f"{entry}(ckpt_path={resume.ckpt_path!r})", verb="evaluated", strict=strict)
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
        return
    check_module(folder, module, f"{entry}(ckpt_path={resume.ckpt_path!r})", verb="evaluated", strict=strict)
    weights = read_model_weights(folder)
    if weights is None:
        raise CheckpointError(f"{folder} holds no full model weights (model.safetensors): a sharded FSDP "
                              "checkpoint is loaded by fit(ckpt_path=...) or accelerator.load_state.")
    module.load_state_dict(weights, strict=strict)
