"""`Checkpointer`: writes the trainer's checkpoints, at boundaries inside ``fit`` and at once outside it.

Inside ``fit``, checkpoints are written only at *boundaries*, points from which a run continues exactly: after
a training batch is completely done (its optimizer step, validation, schedulers and stop decision), or after an
epoch's end hooks and epoch schedulers, with ``TrainState`` already moved to the next epoch. A save asked for
anywhere else in the loop (``trainer.save_checkpoint`` in a hook, ``ModelCheckpoint``) waits for the next one.
What a checkpoint holds is the engine's state plus the trainer's entry (``trainer.checkpoint.entry``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from callbacks import ModelCheckpoint
from engine import Accelerator, gather_object
from engine.checkpoint.io import CheckpointError
from engine.checkpoint.save import describe, first_failure, raise_agreed
from engine.environment import EngineEnvironment
from trainer.checkpoint import ckpt_file
from trainer.checkpoint.early_callbacks import restore_early
from trainer.checkpoint.entry import TrainerEntry
from trainer.checkpoint.lightning_format import compose, compose_weights
from trainer.checkpoint.lightning_import import restore_lightning
from trainer.checkpoint.resume import Resume, newest, resolve, restore
from trainer.plugins.environments import ClusterEnvironment
from trainer.profiling import Profiler, datamodule_hook, profile


class Checkpointer:
    """Owns the boundary queue, the writing of checkpoints and where they go (``ckpt_path`` resolution).

    Args:
        accelerator: writes the checkpoint folders (``save_state``); the entry is registered with it here.
        entry: the trainer's part of every checkpoint.
        before_save: called before each complete checkpoint (the trainer brings its clock up to date and makes
            sure no non-finite loss went into the weights).
        profiler: times each save as ``"save_checkpoint"`` when it records.
        log_dir: the first file logger's run folder: checkpoints go to ``{log_dir}/checkpoints`` by default, as in
            Lightning (``None``: ``{project_dir}/checkpoints``).
        versions: the folder of that logger's ``version_N`` siblings when its version was picked automatically:
            ``ckpt_path="last"`` also looks in their ``checkpoints`` (a restarted script gets a new version).
        cluster: the run's cluster environment. Its ``job_key()`` (a name of this job that survives a requeue) is
            recorded in every checkpoint, and ``fit(ckpt_path=None)`` resumes from the newest checkpoint of this
            job; its ``fallbacks(ckpt_path)`` may stand in for a damaged ``fit(ckpt_path=...)`` (Ray Train's older
            reported checkpoints).
        window: the length of the trainer's accumulation window now: checkpoints hold gradients only inside one.
    """

    def __init__(self, accelerator: Accelerator, entry: TrainerEntry, before_save: Callable[[], None],
                 profiler: Profiler | None = None, log_dir: str | None = None, versions: str | None = None,
                 cluster: ClusterEnvironment | None = None, window: Callable[[], int] = lambda: 1) -> None:
        self.accelerator = accelerator
        self.window = window  # the accumulation window's length now (the trainer owns it; a callback may change it)
        self.cluster = cluster
        self.job = entry.job = cluster.job_key() if cluster is not None else None
        self.log_dir = log_dir
        self.versions = versions
        self.entry = entry
        self.before_save = before_save
        self.profiler = profiler
        self._queue: list[Callable[[], Any]] | None = None  # saves waiting for the next boundary, inside fit
        self.saved_position: tuple[int, int, int] | None = None  # where the newest checkpoint of this run stands
        self.restored_position: tuple[int, int, int] | None = None  # where the last resume of this run started
        self.ckpt_path: str | None = None  # the folder the last fit / validate / test / predict loaded (a record)
        # EMBER_ALLOW_WORLD_SIZE_CHANGE, read when the Trainer is built: a fit may resume a checkpoint of another
        # number of processes (trainer.checkpoint.world_size says why it is refused by default).
        self.allow_world_size_change = EngineEnvironment.from_env().allow_world_size_change
        accelerator.register_for_checkpointing(entry)

    # -- where checkpoints go -----------------------------------------------------------------------------------
    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        """Every ``ModelCheckpoint`` in the run's callbacks, in order."""
        return [c for c in self.entry.attached.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def default_dir(self) -> str:
        """``{log_dir}/checkpoints`` or ``{project_dir}/checkpoints``: ModelCheckpoint's default ``dirpath`` and
        where preemption saves go without one."""
        root = self.log_dir or self.accelerator.project_dir or os.getcwd()
        return os.path.join(os.path.abspath(root), "checkpoints")

    def directories(self) -> list[str]:
        """Where ``ckpt_path="last"`` looks: the default folder, then every ModelCheckpoint's ``dirpath``, then the
        checkpoints of the logger's other versions."""
        dirs = [self.default_dir] + [c.dirpath for c in self.checkpoint_callbacks if c.dirpath]
        if self.versions is not None:
            dirs += sorted(glob.glob(os.path.join(glob.escape(self.versions), "version_*", "checkpoints")))
        return list(dict.fromkeys(os.path.abspath(d) for d in dirs))

    def newest(self) -> str | None:
        """The checkpoint a ``ckpt_path="last"`` resume would start from (None: none yet)."""
        return newest(self.directories())

    def resolve(self, ckpt_path: Any, entry: str, required: bool = False, unpickle: bool = False) -> Resume | None:
        """``ckpt_path`` of the trainer method ``entry`` as a ``Resume`` value (see ``trainer.checkpoint.resume``);
        ``unpickle``: the caller passed ``weights_only=False`` (a Lightning file with pickled objects loads)."""
        found = self.checkpoint_callbacks
        fallbacks: list[str] = []
        if self.cluster is not None and entry == "fit" and isinstance(ckpt_path, (str, os.PathLike)) and \
                os.fspath(ckpt_path) not in ("last", "best"):
            fallbacks = self.cluster.fallbacks(os.fspath(ckpt_path))  # on every process: it may fetch them
        resume = resolve(self.accelerator, ckpt_path, entry, directories=self.directories(),
                         best_path=found[0].best_model_path if found else None,
                         has_checkpoint_callback=bool(found), required=required,
                         job=self.job if entry == "fit" else None, fallbacks=fallbacks)
        self.ckpt_path = resume.folder if resume is not None else None
        return None if resume is None else dataclasses.replace(resume, unpickle=unpickle)

    def restore(self, resume: Resume, module: torch.nn.Module) -> str:
        """Load the checkpoint ``resume`` names for ``fit`` (see ``trainer.checkpoint.resume.restore``); returns
        the folder loaded."""
        return restore(self.accelerator, resume, "fit", module, allow_world_size_change=self.allow_world_size_change,
                       lightning=self._restore_lightning,
                       before_load=lambda path: restore_early(self.entry.attached.callbacks, path, resume.unpickle))

    def _restore_lightning(self, checkpoint: dict[str, Any], path: str) -> None:
        """Resume from a checkpoint Lightning wrote (``trainer.checkpoint.lightning_import``), saying what it lacks."""
        owner, module = self.entry.owner, self.entry.attached.module
        assert owner is not None and module is not None
        position = restore_lightning(checkpoint, path, module, owner.optimizers,
                                     [config.scheduler for config in owner.lr_scheduler_configs],
                                     self.accelerator.scaler, self.entry.state)
        datamodule = self.entry.attached.datamodule
        if datamodule is not None and type(datamodule).__qualname__ in checkpoint:  # where Lightning saves it
            datamodule_hook(self.profiler, datamodule, "load_state_dict")(checkpoint[type(datamodule).__qualname__])
        self.accelerator.print(
            f"{path} was written by Lightning {checkpoint.get('pytorch-lightning_version', '(unknown version)')}: "
            f"restored the weights, optimizer and scheduler states, epoch and global step ({position.global_step}); "
            f"training continues at the start of epoch {position.epoch}, not exactly (Lightning records no RNG "
            "states or data positions), and callback states are not restored.")

    # -- the boundary queue -------------------------------------------------------------------------------------
    def run_at_boundary(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` at the next checkpoint boundary of ``fit``, or now outside it."""
        if self._queue is None:
            fn()
        else:
            self._queue.append(fn)

    def flush(self, stepped: bool) -> None:
        """Run what waits for a boundary. Where the backend cannot save mid-accumulation (FSDP2's sharded
        gradients) only after an optimizer step, so such saves wait for the end of the accumulation window."""
        queue = self._queue
        if not queue or (not stepped and not self.accelerator.backend.saves_mid_accumulation):
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
        path, module = str(filepath), self.entry.attached.module
        if module is None:  # Lightning's type and sentence first, then the fix
            raise AttributeError("Saving a checkpoint is only possible if a model is attached to the Trainer: "
                                 f"save_checkpoint({path!r}) came before any fit / validate / test / predict. Call "
                                 "one of them with the module first.")
        if weights_only and self.one_file:
            self.run_at_boundary(lambda: self._write_weights(path))
        elif weights_only:
            self.run_at_boundary(lambda: self.accelerator.save_model(module, path))
        else:
            self.run_at_boundary(lambda: self.write(path, async_save))

    @property
    def one_file(self) -> bool:
        """Whether checkpoints are one ``.ckpt`` file: where one process holds the whole state (one device, DDP),
        as Lightning writes them. Sharded backends (FSDP2, DeepSpeed, tensor parallelism, DTensor parameters the
        user made) write folders."""
        if not self.accelerator.backend.saves_mid_accumulation or self.accelerator.state.fsdp_plugin is not None:
            return False
        module = self.entry.attached.module
        return module is None or not any(hasattr(p, "device_mesh") for p in module.parameters())

    def write(self, path: str, async_save: bool = False, local_parts: bool = False) -> str:
        """Save a complete checkpoint into ``path`` now; returns it.

        A ``.ckpt`` file where one process holds the whole state (``one_file``); otherwise, and for
        ``async_save`` (written in the background by the engine) or ``local_parts`` (each process writes its own
        part into its own ``path``, ``save_state(local_parts=True)``: no shared file system; Ray Train merges
        the parts), an engine checkpoint folder. The engine takes the trainer's entry on every process
        (``TrainerEntry.state_dict``).
        """
        state = self.entry.state
        if state.batch_open:
            raise CheckpointError(
                f"A complete checkpoint cannot be taken now ({path}): training batch {state.batch_in_epoch} of epoch "
                f"{state.epoch} stopped before it was done (an exception inside it), so its samples are drawn and the "
                "weights may hold part of it; a resume from here would not continue exactly. Save the weights only "
                "(trainer.save_checkpoint(path, weights_only=True), as OnExceptionCheckpoint does), or resume from the "
                "last complete checkpoint (a ModelCheckpoint's, with fit(ckpt_path='last')).")
        with profile(self.profiler, "save_checkpoint"):
            self.before_save()
            # Gradients matter only inside an unfinished accumulation window (the window's first batch zeroes
            # them): elsewhere they are spent, and leaving them out keeps the checkpoint smaller (and loadable on
            # another number of processes, as Lightning's is).
            pending = self.mid_window()
            # An asynchronous save is the engine's (a folder, written in the background), unless a file already
            # stands at ``path``: a folder is never written over a file, so that one is written as a file again.
            if self.one_file and not local_parts and (not async_save or os.path.isfile(path)):
                self._write_file(path, pending)
            else:
                path = self.accelerator.save_state(path, async_save=async_save, include_gradients=pending,
                                                   local_parts=local_parts)
        self.saved_position = self.position()
        return path

    def mid_window(self) -> bool:
        """Whether the run stands inside an accumulation window (gradients of its micro-steps pending): windows
        start at batches ``0, k, 2k...`` of an epoch, and an epoch's last batch always steps. With manual
        optimisation the module decides when it steps: its gradients are always kept."""
        if not getattr(self.entry.attached.module, "automatic_optimization", True):
            return True
        return self.entry.state.batch_in_epoch % max(1, int(self.window())) != 0

    def _write_file(self, path: str, gradients: bool) -> None:
        """Every process gives its state (RNG, loader positions, pending gradients go to process 0); process 0
        writes the one file."""
        values = self.accelerator.state_values(include_gradients=gradients)
        error: BaseException | None = None
        if values is not None:
            try:
                ckpt_file.write(path, compose(values))
            except Exception as err:  # noqa: BLE001 - shared with every process just below
                error = err
        self._agree(error)

    def _write_weights(self, path: str) -> None:
        """A weights-only ``.ckpt`` (``save_checkpoint(path, weights_only=True)``), written by process 0."""
        module = self.entry.attached.module
        weights = self.accelerator.get_state_dict(module)  # every process: a collective where sharded
        error: BaseException | None = None
        if self.accelerator.is_main_process:
            try:
                ckpt_file.write(path, compose_weights(weights, self.entry.identity_entry()))
            except Exception as err:  # noqa: BLE001 - shared with every process just below
                error = err
        self._agree(error)

    def _agree(self, error: BaseException | None) -> None:
        """Raise on every process when the write failed on the one that wrote (none goes on believing it saved)."""
        if self.accelerator.num_processes > 1:
            failure = first_failure(gather_object([(self.accelerator.process_index, describe(error))]))
            if failure is not None:
                raise_agreed(failure, error, self.accelerator.process_index)
        elif error is not None:
            raise error

    def position(self) -> tuple[int, int, int]:
        """Where the run stands now: ``(epoch, batch_in_epoch, micro_step)``."""
        state = self.entry.state
        return state.epoch, state.batch_in_epoch, state.micro_step

    def restored_here(self) -> None:
        """The run was just restored from a checkpoint of this very position: an interrupt now saves nothing."""
        self.saved_position = self.restored_position = self.position()

    def restarting(self, whole_epoch: bool) -> bool:
        """Lightning 2.6.6's ``restarting`` flags (observed): only a resume from the middle of an epoch restarts (one
        from an epoch's end starts the next epoch afresh); ``fit_loop.restarting`` (``whole_epoch``) then stays True
        until that epoch ends, ``fit_loop.epoch_loop.restarting`` until the run moves on from where it was restored."""
        restored = self.restored_position
        if restored is None or restored[1] == 0:
            return False
        return self.entry.state.epoch == restored[0] if whole_epoch else restored == self.position()

    def saved_here(self) -> bool:
        """Whether the newest checkpoint of this run holds the position the run stands at now."""
        return self.saved_position == self.position()

    def save_interrupted(self, reason: str, owner: Any) -> None:
        """Save the current boundary for a resume (preemption, max_time), unless it was just saved.

        ``owner`` is what the first ModelCheckpoint's ``save_now`` receives (the trainer): the save is then its
        last one, in its bookkeeping; without a ModelCheckpoint it goes to ``{default_dir}/{reason}``.
        """
        found = self.checkpoint_callbacks
        if self.saved_here():
            self.accelerator.wait_for_checkpoint()  # saved in the background: on disk before the process stops
            for callback in found:
                callback.finish_pending(owner)
            return
        if found:
            self.run_at_boundary(lambda: found[0].save_now(owner, reason))
        else:
            self.run_at_boundary(lambda: self.write(os.path.join(self.default_dir, reason)))
        self.flush(stepped=True)  # we are at a boundary: write it now
