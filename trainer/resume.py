"""Trainer checkpoints: what they hold beyond the engine's state, where in the loop they are written, resuming.

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
                                      "callback_metrics": {name: tensor}, "prepared": [...]}

Inside ``fit``, checkpoints are written only at *boundaries*, points from which a run continues exactly: after
a training batch is completely done (its optimizer step, validation, schedulers and stop decision), or after an
epoch's end hooks and epoch schedulers, with ``TrainState`` already moved to the next epoch. A save asked for
anywhere else in the loop (``trainer.save_checkpoint`` in a hook, ``ModelCheckpoint``) waits for the next one.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from callbacks import Callback, ModelCheckpoint
from engine import Accelerator, broadcast_object_list
from engine import checkpointing as folders
from engine.checkpoint_io import CheckpointError, load_safetensors
from engine.checkpoint_state import model_name
from engine.checksum import hash_file
from trainer.data import loader_length
from trainer.hooks import overrides
from trainer.module import TrainModule
from trainer.state import TrainState

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from trainer.datamodule import DataModule
    from trainer.metrics import MetricLogger

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


def newest_checkpoint(directories: list[str]) -> str | None:
    """The most recently committed checkpoint folder directly inside any of ``directories`` (by its manifest)."""
    best: tuple[float, str] | None = None
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
                created = float(manifest.get("created", 0.0))
                if best is None or created > best[0]:
                    best = (created, path)
    return None if best is None else best[1]


class CheckpointMixin:
    """``save_checkpoint``, the boundary queue, ``ckpt_path`` resolution and restoring a run."""

    accelerator: Accelerator
    state: TrainState
    callbacks: list[Callback]
    module: TrainModule | None
    datamodule: DataModule | None
    train_dataloader: DataLoader | None
    val_dataloaders: list[DataLoader]
    num_training_batches: int | None
    _metrics: MetricLogger
    _hooks: Any
    _trackers_started: bool
    _stop_requested: bool
    _fit_clock: float
    _prepared: list[str]
    _boundary_queue: list[Callable[[], None]] | None
    _last_save_position: tuple[int, int, int] | None
    _checkpoint_state: TrainerCheckpointState
    state_dict: Callable[[], dict[str, Any]]
    load_state_dict: Callable[[dict[str, Any]], None]
    _update_time: Callable[[], float]
    _check_losses: Callable[[], bool]

    # -- where checkpoints go -----------------------------------------------------------------------------------
    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        """Every ``ModelCheckpoint`` in ``callbacks``, in order."""
        return [c for c in self.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first ``ModelCheckpoint`` (``None`` without one)."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def default_checkpoint_dir(self) -> str:
        """``{project_dir}/checkpoints``: ModelCheckpoint's default ``dirpath`` and where preemption saves go."""
        return os.path.join(os.path.abspath(self.accelerator.project_dir or os.getcwd()), "checkpoints")

    def _checkpoint_dirs(self) -> list[str]:
        dirs = [self.default_checkpoint_dir] + [c.dirpath for c in self.checkpoint_callbacks if c.dirpath]
        return list(dict.fromkeys(os.path.abspath(d) for d in dirs))

    # -- saving -------------------------------------------------------------------------------------------------
    def save_checkpoint(self, filepath: str | os.PathLike[str], weights_only: bool = False,
                        storage_options: Any = None) -> None:
        """Save a complete checkpoint folder at ``filepath`` (replacing one saved there before, atomically).

        Called inside ``fit`` (e.g. from a callback), it is written at the next boundary, so resuming from it
        continues exactly; elsewhere at once. ``weights_only=True`` writes only the module's weights
        (``accelerator.save_model``), for inference. Every process must call it.
        """
        if storage_options is not None:
            raise ValueError(f"save_checkpoint(storage_options={storage_options!r}) is not supported: checkpoints "
                             "go to a local or mounted path.")
        path = os.fspath(filepath)
        module = self.module
        if weights_only and module is None:
            raise ValueError("save_checkpoint(weights_only=True) needs a module: fit or validate one first.")

        def save() -> None:
            if weights_only:
                self.accelerator.save_model(module, path)  # type: ignore[arg-type]
            else:
                self._write_checkpoint(path)

        self.run_at_boundary(save)

    def run_at_boundary(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` at the next checkpoint boundary of ``fit`` (see the module docstring), or now outside it.

        ``ModelCheckpoint`` uses it so a step's checkpoint is taken after that step's validation.
        """
        if self._boundary_queue is None:
            fn()
        else:
            self._boundary_queue.append(fn)

    def _flush_boundary(self, stepped: bool) -> None:
        """Run what waits for a boundary. Under FSDP2 only after an optimizer step (the engine cannot save
        sharded gradients mid-accumulation), so such saves wait for the end of the accumulation window."""
        queue = self._boundary_queue
        if not queue or (not stepped and self.accelerator.is_fsdp2):
            return
        self._boundary_queue = None  # saves asked for while flushing happen at once: this is the boundary
        try:
            while queue:
                queue.pop(0)()
        finally:
            self._boundary_queue = queue

    @contextlib.contextmanager
    def _boundaries(self) -> Iterator[None]:
        """Inside the block, saves wait for a boundary; whatever still waits at its end runs then."""
        self._boundary_queue = []
        try:
            yield
        finally:
            queue, self._boundary_queue = self._boundary_queue, None
        for fn in queue or []:
            fn()

    def _position(self) -> tuple[int, int, int]:
        return self.state.epoch, self.state.batch_in_epoch, self.state.micro_step

    def _write_checkpoint(self, path: str) -> str:
        """Save a complete checkpoint into ``path`` now; returns the committed folder."""
        self._update_time()  # time_elapsed is otherwise only current per step with max_time
        self._check_losses()  # never a checkpoint of weights a non-finite loss went into
        payload = self._checkpoint_payload()
        check_plain(payload, "checkpoint")
        self._checkpoint_state.pending = payload
        try:
            folder = self.accelerator.save_state(path)
        finally:
            self._checkpoint_state.pending = None
        self._last_save_position = self._position()
        return folder

    def _checkpoint_payload(self) -> dict[str, Any]:
        """The trainer's entry of a checkpoint; runs the ``on_save_checkpoint`` hooks (callbacks, then module)."""
        extra: dict[str, Any] = {"epoch": self.state.epoch, "global_step": self.state.global_step}
        self._call_checkpoint_hooks("on_save_checkpoint", extra)
        metrics = {name: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                   for name, value in self._metrics.callback_metrics.items()
                   if isinstance(value, (torch.Tensor, int, float))}
        return {"format": FORMAT, "version": VERSION, "trainer": self.state_dict(),
                "trackers": self.accelerator.tracker_state_dict(), "checkpoint": extra,
                "callback_metrics": metrics, "prepared": list(self._prepared)}

    def _call_checkpoint_hooks(self, name: str, checkpoint: dict[str, Any]) -> None:
        module = self.module
        for callback in self.callbacks:
            if overrides(callback, Callback, name):
                getattr(callback, name)(self, module, checkpoint)
        if module is not None and overrides(module, TrainModule, name):
            getattr(module, name)(checkpoint)

    def _save_interrupted(self, reason: str) -> None:
        """Save the current boundary for a resume (preemption, max_time), unless it was just saved."""
        if self._last_save_position == self._position():
            return
        callback = self.checkpoint_callback
        if callback is not None:
            self.run_at_boundary(lambda: callback.save_now(self, reason))  # its last one, in its bookkeeping
        else:
            self.run_at_boundary(lambda: self._write_checkpoint(os.path.join(self.default_checkpoint_dir, reason)))
        self._flush_boundary(stepped=True)  # we are at a boundary: write it now

    # -- ckpt_path ----------------------------------------------------------------------------------------------
    def _resolve_ckpt_path(self, ckpt_path: str | os.PathLike[str] | None, entry: str,
                           required: bool = False) -> str | None:
        """The folder ``ckpt_path`` names, decided on process 0 and shared, or ``None`` (start fresh).

        ``"last"``: the newest committed checkpoint in ``{project_dir}/checkpoints`` and every ModelCheckpoint's
        ``dirpath`` (``None`` when there is none yet, said on stdout); ``"best"``: the first ModelCheckpoint's
        ``best_model_path``; anything else: a committed checkpoint folder.
        """
        if ckpt_path is None:
            return None
        outcome: list[Any] = [None]
        if self.accelerator.is_main_process:
            try:
                outcome[0] = ("ok", self._find_checkpoint(os.fspath(ckpt_path), entry))
            except (ValueError, FileNotFoundError) as error:
                outcome[0] = (type(error).__name__, str(error))
        if self.accelerator.num_processes > 1:
            broadcast_object_list(outcome)
        kind, value = outcome[0]
        if kind != "ok":
            raise (FileNotFoundError if kind == "FileNotFoundError" else ValueError)(value)
        if value is None and required:
            raise FileNotFoundError(f"{entry}(ckpt_path={ckpt_path!r}): no committed checkpoint in "
                                    f"{self._checkpoint_dirs()}.")
        if value is None:
            self.accelerator.print(f"{entry}(ckpt_path={ckpt_path!r}): no committed checkpoint in "
                                   f"{self._checkpoint_dirs()}; starting a new run.")
        return value

    def _find_checkpoint(self, ckpt_path: str, entry: str) -> str | None:
        if ckpt_path == "last":
            return newest_checkpoint(self._checkpoint_dirs())
        if ckpt_path == "best":
            callback = self.checkpoint_callback
            if callback is None or not callback.best_model_path:
                raise ValueError(f"{entry}(ckpt_path='best') needs a ModelCheckpoint that has saved a checkpoint; "
                                 f"{'it has saved none yet' if callback else 'there is none'}. Pass a path or "
                                 "'last'.")
            return callback.best_model_path
        folder = os.path.abspath(ckpt_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{entry}(ckpt_path={ckpt_path!r}): no such checkpoint folder ({folder}). Pass "
                                    "a folder written by trainer.save_checkpoint / ModelCheckpoint, 'last' for the "
                                    "newest one in the project, or None to start fresh.")
        if not folders.is_committed(folder):
            raise ValueError(f"{entry}(ckpt_path={ckpt_path!r}) is not a committed checkpoint: it has no valid "
                             f"{folders.MANIFEST_NAME} (an interrupted save, or not written by Ember).")
        return folder

    # -- restoring ----------------------------------------------------------------------------------------------
    def _restore(self, folder: str) -> None:
        """Load everything a resume needs from ``folder``, then line the loaders up with ``TrainState``."""
        self._checkpoint_state.loaded = None
        self.accelerator.load_state(folder)
        loaded = self._checkpoint_state.loaded
        if loaded is None:
            raise CheckpointError(f"{folder} holds no trainer state: it was not written by a Trainer.")
        self._checkpoint_state.loaded = None
        if loaded["prepared"] != self._prepared:
            raise CheckpointError(
                f"{folder} was saved after the trainer prepared {loaded['prepared']}, but this run prepared "
                f"{self._prepared}, so loader and model states would land on the wrong objects. Resume with the same "
                "sequence of trainer calls as the run that saved it (e.g. the same validate() before fit()).")
        self.load_state_dict(loaded["trainer"])
        if not self._trackers_started:  # a second fit keeps the runs already open
            self.accelerator.load_tracker_state_dict(loaded["trackers"])
        device = self.accelerator.device
        self._metrics.callback_metrics.update({name: value.to(device) if isinstance(value, torch.Tensor) else value
                                               for name, value in loaded["callback_metrics"].items()})
        self._call_checkpoint_hooks("on_load_checkpoint", loaded["checkpoint"])
        # Saved at a stop decision or not, the resumed run goes on until its own limits say otherwise.
        self.state.should_stop = self._stop_requested = False
        self._fit_clock = time.monotonic() - self.state.time_elapsed
        self._last_save_position = self._position()
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
        state, loader, count = self.state, self.train_dataloader, self.num_training_batches
        position = loader.state_dict() if callable(getattr(loader, "state_dict", None)) else None
        if position is not None and position["batches_yielded"] > 0:
            done = position["iteration"] < state.epoch or (count is not None and state.batch_in_epoch >= count)
            length = loader_length(loader)  # an unsized loader always ran to its end: nothing to finish
            if done and length is not None:
                loader.load_state_dict({**position, "batches_yielded": length})  # type: ignore[union-attr]
                for _ in loader:  # type: ignore[union-attr]
                    raise AssertionError("a loader restored at its end yielded a batch")
        for val_loader in self.val_dataloaders:
            if callable(getattr(val_loader, "state_dict", None)):
                position = val_loader.state_dict()  # type: ignore[attr-defined]
                if position["batches_yielded"]:
                    val_loader.load_state_dict({**position, "batches_yielded": 0})  # type: ignore[attr-defined]

    def _load_weights(self, folder: str) -> None:
        """Load only the module's weights from ``folder`` (validate / test / predict with ``ckpt_path``)."""
        module = self.module
        assert module is not None
        manifest = folders.read_manifest(folder)
        assert manifest is not None  # _find_checkpoint checked it is committed
        name = next((model_name(0, safe) for safe in (True, False) if model_name(0, safe) in manifest["files"]), None)
        if name is None:
            raise CheckpointError(f"{folder} holds no full model weights (model.safetensors): a sharded FSDP "
                                  "checkpoint is loaded by fit(ckpt_path=...) or accelerator.load_state.")
        folders.check_sizes(folder, manifest)
        record = manifest["files"][name]
        if hash_file(os.path.join(folder, name), record.algorithm) != record:
            raise CheckpointError(f"{os.path.join(folder, name)} does not match the checksum in its manifest.")
        if name.endswith(".safetensors"):
            weights = load_safetensors(os.path.join(folder, name))
        else:
            from engine.checkpoint_io import load_torch

            weights = load_torch(os.path.join(folder, name))
        module.load_state_dict(weights)
