"""`Checkpointer`: writes the trainer's checkpoints at boundaries, finds them by ``ckpt_path``, restores runs.

Inside ``fit``, checkpoints are written only at *boundaries*, points from which a run continues exactly: after
a training batch is completely done (its optimizer step, validation, schedulers and stop decision), or after an
epoch's end hooks and epoch schedulers, with ``TrainState`` already moved to the next epoch. A save asked for
anywhere else in the loop (``trainer.save_checkpoint`` in a hook, ``ModelCheckpoint``) waits for the next one.
The format is described in ``trainer.checkpoint_format``.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from callbacks import Callback, ModelCheckpoint
from engine import Accelerator, broadcast_object_list
from engine import checkpointing as folders
from engine.checkpoint_io import CheckpointError, load_safetensors, load_torch
from engine.checkpoint_state import model_name
from trainer.checkpoint_format import (
    FORMAT,
    VERSION,
    TrainerCheckpointState,
    check_plain,
    committed_checkpoints,
)
from trainer.data import loader_length
from trainer.fallback import load_first_intact
from trainer.hooks import overrides
from trainer.hparams_io import encode_hparams
from trainer.loss_check import LossCheck
from trainer.metrics import MetricLogger
from trainer.module import TrainModule
from trainer.plan import RunPlan
from trainer.profiling import Profiler, profile
from trainer.setup import Attached
from trainer.state import TrainState
from trainer.stop import StopController
from trainer.tracking import TrackerLink


class Checkpointer:
    """Owns the boundary queue, the trainer's checkpoint entry, ``ckpt_path`` resolution and restoring.

    It is given the trainer's long-lived parts at construction, among them ``attached`` (the callbacks, module
    and data module the trainer's runs work on), and ``owner``: what callback hooks receive as their first
    argument (the trainer, held weakly as an opaque value, as ``HookTable`` holds it).
    """

    def __init__(self, accelerator: Accelerator, state: TrainState, plan: RunPlan, metrics: MetricLogger,
                 stop: StopController, loss_check: LossCheck, trackers: TrackerLink, attached: Attached,
                 owner: Any) -> None:
        self.accelerator = accelerator
        self.state = state
        self.plan = plan
        self.metrics = metrics
        self.stop = stop
        self.loss_check = loss_check
        self.trackers = trackers
        self.attached = attached
        self._owner = weakref.ref(owner)  # weakly: the owner holds this object (no reference cycle)
        self._queue: list[Callable[[], Any]] | None = None  # saves waiting for the next boundary, inside fit
        self._last_save_position: tuple[int, int, int] | None = None
        # What the last resolve() chose: ckpt_path as given, and the older committed checkpoints "last" may
        # fall back to when the chosen one is damaged (decided on process 0, the same on every process).
        self._resolved: tuple[str, list[str]] = ("", [])
        self.last_saved: str | None = None  # the newest checkpoint this trainer wrote (for interrupt messages)
        self.profiler: Profiler | None = None  # set by the trainer: times each save as "save_checkpoint"
        # The trainer's part of every engine checkpoint (TrainState, callbacks, trackers...): plain values only.
        self.entry = TrainerCheckpointState(self.payload)
        accelerator.register_for_checkpointing(self.entry)

    @property
    def owner(self) -> Any:
        return self._owner()

    # -- where checkpoints go -----------------------------------------------------------------------------------
    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        """Every ``ModelCheckpoint`` in the run's callbacks, in order."""
        return [c for c in self.attached.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def default_dir(self) -> str:
        """``{project_dir}/checkpoints``: ModelCheckpoint's default ``dirpath`` and where preemption saves go."""
        return os.path.join(os.path.abspath(self.accelerator.project_dir or os.getcwd()), "checkpoints")

    def directories(self) -> list[str]:
        dirs = [self.default_dir] + [c.dirpath for c in self.checkpoint_callbacks if c.dirpath]
        return list(dict.fromkeys(os.path.abspath(d) for d in dirs))

    # -- the boundary queue -------------------------------------------------------------------------------------
    def run_at_boundary(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` at the next checkpoint boundary of ``fit``, or now outside it."""
        if self._queue is None:
            fn()
        else:
            self._queue.append(fn)

    def flush(self, stepped: bool) -> None:
        """Run what waits for a boundary. Under FSDP2 only after an optimizer step (the engine cannot save
        sharded gradients mid-accumulation), so such saves wait for the end of the accumulation window."""
        queue = self._queue
        if not queue or (not stepped and self.accelerator.is_fsdp2):
            return
        self._queue = None  # saves asked for while flushing happen at once: this is the boundary
        try:
            while queue:
                queue.pop(0)()
        finally:
            self._queue = queue

    @contextlib.contextmanager
    def boundaries(self) -> Iterator[None]:
        """Inside the block, saves wait for a boundary; whatever still waits at its end runs then."""
        self._queue = []
        try:
            yield
        finally:
            queue, self._queue = self._queue, None
        for fn in queue or []:
            fn()
        self.accelerator.wait_for_checkpoint()  # fit ends with its last checkpoint committed (or its error)

    # -- saving -------------------------------------------------------------------------------------------------
    def save(self, filepath: Any, weights_only: bool = False, storage_options: Any = None,
             async_save: bool = False) -> None:
        """``trainer.save_checkpoint``: a complete checkpoint (or the weights only) at the next boundary."""
        if storage_options is not None:
            raise ValueError(f"save_checkpoint(storage_options={storage_options!r}) is not supported: checkpoints "
                             "go to a local or mounted path.")
        path, module = str(filepath), self.attached.module
        if weights_only and module is None:
            raise ValueError("save_checkpoint(weights_only=True) needs a module: fit or validate one first.")
        if weights_only:
            self.run_at_boundary(lambda: self.accelerator.save_model(module, path))
        else:
            self.run_at_boundary(lambda: self.write(path, async_save))

    def position(self) -> tuple[int, int, int]:
        return self.state.epoch, self.state.batch_in_epoch, self.state.micro_step

    def write(self, path: str, async_save: bool = False) -> str:
        """Save a complete checkpoint into ``path`` now (in the background with ``async_save``); returns the
        folder."""
        with profile(self.profiler, "save_checkpoint"):
            self.stop.update_time()  # time_elapsed is otherwise only current per step with max_time
            self.loss_check.check()  # never a checkpoint of weights a non-finite loss went into
            payload = self.payload()
            check_plain(payload, "checkpoint")
            self.entry.pending = payload
            try:
                folder = self.accelerator.save_state(path, async_save=async_save)
            finally:
                self.entry.pending = None
        self._last_save_position = self.position()
        self.last_saved = folder
        return folder

    def payload(self) -> dict[str, Any]:
        """The trainer's entry of a checkpoint; runs the ``on_save_checkpoint`` hooks (callbacks, then module)."""
        extra: dict[str, Any] = {"epoch": self.state.epoch, "global_step": self.state.global_step}
        self.call_hooks("on_save_checkpoint", extra)
        metrics = {name: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                   for name, value in self.metrics.callback_metrics.items()
                   if isinstance(value, (torch.Tensor, int, float))}
        # What load_from_checkpoint rebuilds the module and data module from (non-plain values sealed).
        hparams = {"module": encode_hparams(getattr(self.attached.module, "hparams", None)),
                   "datamodule": encode_hparams(getattr(self.attached.datamodule, "hparams", None))}
        return {"format": FORMAT, "version": VERSION, "trainer": self.state_dict(),
                "trackers": self.accelerator.tracker_state_dict(), "checkpoint": extra,
                "callback_metrics": metrics, "prepared": list(self.plan.prepared), "hyper_parameters": hparams}

    def state_dict(self) -> dict[str, Any]:
        """``TrainState``, every callback's state (by ``state_key``), the data module's state."""
        callbacks: dict[str, Any] = {}
        for callback in self.attached.callbacks:
            state = callback.state_dict()
            if state:
                if callback.state_key in callbacks:
                    raise ValueError(f"Two callbacks save state under the key {callback.state_key!r}: override "
                                     "`state_key` so each is unique (e.g. include its arguments).")
                callbacks[callback.state_key] = state
        datamodule = self.attached.datamodule.state_dict() if self.attached.datamodule is not None else {}
        return {"state": self.state.state_dict(), "callbacks": callbacks, "datamodule": datamodule}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (callbacks matched by ``state_key``)."""
        self.state.load_state_dict(state_dict["state"])
        for callback in self.attached.callbacks:
            if callback.state_key in state_dict["callbacks"]:
                callback.load_state_dict(state_dict["callbacks"][callback.state_key])
        if self.attached.datamodule is not None and state_dict.get("datamodule"):
            self.attached.datamodule.load_state_dict(state_dict["datamodule"])

    def call_hooks(self, name: str, checkpoint: dict[str, Any]) -> None:
        """``on_save_checkpoint`` / ``on_load_checkpoint`` on the callbacks, then the module."""
        module = self.attached.module
        for callback in self.attached.callbacks:
            if overrides(callback, Callback, name):
                getattr(callback, name)(self.owner, module, checkpoint)
        if module is not None and overrides(module, TrainModule, name):
            getattr(module, name)(checkpoint)

    def newest(self) -> str | None:
        """The newest committed checkpoint a ``ckpt_path="last"`` resume would start from (None: none yet)."""
        found = committed_checkpoints(self.directories())
        return found[0] if found else None

    def save_interrupted(self, reason: str) -> None:
        """Save the current boundary for a resume (preemption, max_time), unless it was just saved."""
        if self._last_save_position == self.position():
            self.accelerator.wait_for_checkpoint()  # saved in the background: on disk before the process stops
            for callback in self.checkpoint_callbacks:
                callback.finish_pending(self.owner)
            return
        found = self.checkpoint_callbacks
        if found:
            callback, owner = found[0], self.owner
            self.run_at_boundary(lambda: callback.save_now(owner, reason))  # its last one, in its bookkeeping
        else:
            self.run_at_boundary(lambda: self.write(os.path.join(self.default_dir, reason)))
        self.flush(stepped=True)  # we are at a boundary: write it now

    # -- ckpt_path ----------------------------------------------------------------------------------------------
    def resolve(self, ckpt_path: str | os.PathLike[str] | None, entry: str, best_path: str | None,
                required: bool = False) -> str | None:
        """The folder ``ckpt_path`` names, decided on process 0 and shared, or ``None`` (start fresh).

        ``"last"``: the newest committed checkpoint in ``{project_dir}/checkpoints`` and every ModelCheckpoint's
        ``dirpath`` (``None`` when there is none yet, said on stdout); ``"best"``: ``best_path`` (the first
        ModelCheckpoint's ``best_model_path``); anything else: a committed checkpoint folder.
        """
        if ckpt_path is None:
            return None
        outcome: list[Any] = [None]
        if self.accelerator.is_main_process:
            try:
                found = self._find(os.fspath(ckpt_path), entry, best_path)
                outcome[0] = ("ok", found[0] if found else None, found[1:])
            except (ValueError, FileNotFoundError) as error:
                outcome[0] = (type(error).__name__, str(error), [])
        if self.accelerator.num_processes > 1:
            broadcast_object_list(outcome)
        kind, value, older = outcome[0]
        if kind != "ok":
            raise (FileNotFoundError if kind == "FileNotFoundError" else ValueError)(value)
        self._resolved = (os.fspath(ckpt_path), older)
        if value is None and required:
            raise FileNotFoundError(f"{entry}(ckpt_path={ckpt_path!r}): no committed checkpoint in "
                                    f"{self.directories()}.")
        if value is None:
            self.accelerator.print(f"{entry}(ckpt_path={ckpt_path!r}): no committed checkpoint in "
                                   f"{self.directories()}; starting a new run.")
        return value

    def _find(self, ckpt_path: str, entry: str, best_path: str | None) -> list[str]:
        """The folder to load first, then (for ``"last"``) the older committed ones to fall back to."""
        if ckpt_path == "last":
            return committed_checkpoints(self.directories())
        if ckpt_path == "best":
            found = self.checkpoint_callbacks
            if not best_path:
                raise ValueError(f"{entry}(ckpt_path='best') needs a ModelCheckpoint that has saved a checkpoint; "
                                 f"{'it has saved none yet' if found else 'there is none'}. Pass a path or 'last'.")
            return [best_path]
        folder = os.path.abspath(ckpt_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{entry}(ckpt_path={ckpt_path!r}): no such checkpoint folder ({folder}). Pass "
                                    "a folder written by trainer.save_checkpoint / ModelCheckpoint, 'last' for the "
                                    "newest one in the project, or None to start fresh.")
        if not folders.is_committed(folder):
            raise ValueError(f"{entry}(ckpt_path={ckpt_path!r}) is not a committed checkpoint: it has no valid "
                             f"{folders.MANIFEST_NAME} (an interrupted save, or not written by Ember).")
        return [folder]

    # -- restoring ----------------------------------------------------------------------------------------------
    def restore(self, folder: str) -> None:
        """Load everything a resume needs from ``folder``, then line the loaders up with ``TrainState``."""
        self.entry.loaded = None
        ckpt_path, older = self._resolved
        folder = load_first_intact(self.accelerator, [folder, *older], ckpt_path or folder, "fit")
        loaded = self.entry.loaded
        if loaded is None:
            raise CheckpointError(f"{folder} holds no trainer state: it was not written by a Trainer.")
        self.entry.loaded = None
        if loaded["prepared"] != self.plan.prepared:
            raise CheckpointError(
                f"{folder} was saved after the trainer prepared {loaded['prepared']}, but this run prepared "
                f"{self.plan.prepared}, so loader and model states would land on the wrong objects. Resume with the "
                "same sequence of trainer calls as the run that saved it (e.g. the same validate() before fit()).")
        self.load_state_dict(loaded["trainer"])
        if not self.trackers.started:  # a second fit keeps the runs already open
            self.accelerator.load_tracker_state_dict(loaded["trackers"])
        device = self.accelerator.device
        self.metrics.callback_metrics.update({name: value.to(device) if isinstance(value, torch.Tensor) else value
                                              for name, value in loaded["callback_metrics"].items()})
        self.call_hooks("on_load_checkpoint", loaded["checkpoint"])
        # Saved at a stop decision or not, the resumed run goes on until its own limits say otherwise.
        self.stop.start()
        self._last_save_position = self.position()
        self._line_up_loaders()
        self.accelerator.print(f"Resumed from {folder} at epoch {self.state.epoch}, batch {self.state.batch_in_epoch}"
                               f", step {self.state.global_step}.")

    def _line_up_loaders(self) -> None:
        """Bring the restored loaders to where ``TrainState`` says the run is.

        A checkpoint is taken at a boundary, when the loop may not have asked the loader for its end yet: the
        last batch was handed out, or a limited epoch stopped reading early. The training loader's pass is then
        finished here without fetching a batch (its sampler state moves past the epoch, as in the run that saved
        it). Validation passes never span a checkpoint, so a restored one starts from its first batch.
        """
        state, loader, count = self.state, self.plan.train_loader, self.plan.num_training_batches
        position = loader.state_dict() if callable(getattr(loader, "state_dict", None)) else None
        if position is not None and position["batches_yielded"] > 0:
            done = position["iteration"] < state.epoch or (count is not None and state.batch_in_epoch >= count)
            length = loader_length(loader)  # an unsized loader always ran to its end: nothing to finish
            if done and length is not None:
                loader.load_state_dict({**position, "batches_yielded": length})  # type: ignore[union-attr]
                for _ in loader:  # type: ignore[union-attr]
                    raise AssertionError("a loader restored at its end yielded a batch")
        for val_loader in self.plan.val_loaders:
            if callable(getattr(val_loader, "state_dict", None)):
                position = val_loader.state_dict()  # type: ignore[attr-defined]
                if position["batches_yielded"]:
                    val_loader.load_state_dict({**position, "batches_yielded": 0})  # type: ignore[attr-defined]

    def load_weights(self, folder: str) -> None:
        """Load only the module's weights from ``folder`` (validate / test / predict with ``ckpt_path``)."""
        module = self.attached.module
        assert module is not None
        manifest = folders.read_manifest(folder)
        assert manifest is not None  # _find checked it is committed
        name = next((model_name(0, safe) for safe in (True, False) if model_name(0, safe) in manifest["files"]), None)
        if name is None:
            raise CheckpointError(f"{folder} holds no full model weights (model.safetensors): a sharded FSDP "
                                  "checkpoint is loaded by fit(ckpt_path=...) or accelerator.load_state.")
        folders.check_sizes(folder, manifest)
        folders.check_file(folder, name, manifest["files"][name])()
        path = os.path.join(folder, name)
        module.load_state_dict(load_safetensors(path) if name.endswith(".safetensors") else load_torch(path))
