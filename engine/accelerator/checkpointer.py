"""``Checkpointer``: the part of an Accelerator that takes its checkpoints (``save_state`` / ``load_state``,
``save``, ``save_model`` and the save / load pre-hooks); the Accelerator's methods of those names call it.

Where Accelerate writes straight into the final folder and unpickles everything, Ember commits each checkpoint
atomically (``engine.checkpoint.folders``), loads nothing with full pickle unless ``allow_unsafe_pickle=True``, and
restores the data loaders' positions, pending gradients and ``project_configuration.iteration`` too.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
from torch.utils.hooks import RemovableHandle

from engine.accelerator.registry import PreparedObjects
from engine.backends.base import Backend
from engine.checkpoint import folders
from engine.checkpoint.async_save import AsyncCheckpointer
from engine.checkpoint.checksum import default_algorithm, hash_file
from engine.checkpoint.io import (
    CheckpointError,
    CorruptCheckpointError,
    atomic_write,
    save_safetensors,
    save_torch,
)
from engine.checkpoint.save import Failure, PrunePlan, SaveJob, describe, first_failure, raise_agreed
from engine.checkpoint.state import (
    CapturedState,
    LoadedCheckpoint,
    capture_state,
    checked_while_read,
    read_checkpoint,
    restore_gradients,
)
from engine.checkpoint.values import capture_values, to_loaded
from engine.config import ProjectConfiguration
from engine.gradient_state import GradientState
from engine.operations import broadcast_object_list, gather_object
from engine.random import capture_rng_state, restore_rng_state
from engine.state import AcceleratorState


class Restored(NamedTuple):
    """What ``Checkpointer.load_state`` loaded: the folder, and the Accelerator's step it holds."""

    folder: str
    step: int


class Checkpointer:
    """An Accelerator's checkpoints: ``save_state`` / ``load_state``, ``save``, ``save_model`` and the save / load
    pre-hooks.

    Args:
        state: the process's state (ranks, device, process group).
        project_configuration: where automatic checkpoints go, how many are kept, who writes.
        prepared: the objects whose state a checkpoint holds, in the order they were prepared.
        gradient_state: whether this step closes the accumulation window (a backend may refuse to save inside).
        scaler: the fp16 ``GradScaler`` saved and restored with the rest (None without one).
    """

    def __init__(self, state: AcceleratorState, project_configuration: ProjectConfiguration,
                 prepared: PreparedObjects, gradient_state: GradientState, scaler: Any) -> None:
        self.state = state
        self.project_configuration = project_configuration
        self.prepared = prepared
        self.gradient_state = gradient_state
        self.scaler = scaler
        self._save_model_state_pre_hook: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self._load_model_state_pre_hook: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self._resumed_from: str | None = None  # never pruned: the run may still need to go back to it
        self.async_checkpointer: AsyncCheckpointer | None = None  # created by the first async_save

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before the models are written; returns a removable handle.

        Removing entries from ``weights`` skips writing them; files the hook writes into ``output_dir`` (the
        folder being written, renamed to its final name at commit) become part of the checkpoint.
        """
        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before the models are loaded; returns a removable handle.

        Removing a model from ``models`` skips loading it.
        """
        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle

    # -- who writes -------------------------------------------------------------------------------------------
    @property
    def _is_checkpoint_writer(self) -> bool:
        """The main process, or each node's local main process with ``save_on_each_node``."""
        if self.project_configuration.save_on_each_node:
            return bool(self.state.is_local_main_process)
        return bool(self.state.is_main_process)

    def _gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank over the default process group (``[obj]`` in one process)."""
        return gather_object([obj]) if self.state.use_distributed else [obj]

    def _agree(self, error: BaseException | None) -> Failure | None:
        """Tell every rank about the first failure on any rank (class name, message, rank), or None.

        Every rank calls this at the same point whether or not it failed, so a failure on one rank becomes an
        exception on all of them instead of a hang in the next collective.
        """
        return first_failure(self._gather((self.state.process_index, describe(error))))

    def _raise_agreed(self, failure: Failure, local: BaseException | None) -> None:
        raise_agreed(failure, local, self.state.process_index)

    # -- save -------------------------------------------------------------------------------------------------
    def save_state(self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True, *,
                   step: int, backend: Backend, async_save: bool = False, include_gradients: bool = True, local_parts: bool = False,
                   **save_model_func_kwargs: Any) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, data positions and registered objects;
        ``step`` is the Accelerator's micro-step counter at the call (restored by ``load_state``); ``backend``
        writes the models and optimizers (full files, or its own shards).

        The folder appears complete or not at all: files go to a temporary sibling, are fsynced, listed with their
        checksums in ``manifest.json`` and committed by one atomic rename. With
        ``ProjectConfiguration(automatic_checkpoint_naming=True)`` and no ``output_dir``, the folder is
        ``{project_dir}/checkpoints/checkpoint_{n}`` (``n`` continues after the highest existing one) and, after the
        commit, checkpoints beyond ``total_limit`` are pruned (never the newest one nor the one resumed from). An
        explicit ``output_dir`` is used as given, even with automatic naming (Accelerate ignores it); saving again
        into it replaces the previous checkpoint there as a whole. Returns the folder (committed, or to be).

        With ``async_save=True`` the call returns once the state is copied into host buffers reused from save to
        save (``checkpoint_snapshot_bytes``); a background thread writes and commits it while training goes on,
        and the checkpoint holds the state as it was at the call. One save is in flight at a time: the next
        ``save_state``, ``load_state``, ``wait_for_checkpoint()`` or ``end_training()`` waits for it and raises
        ``CheckpointError`` naming the checkpoint if its write failed (nothing of it is then visible).

        Unlike Accelerate, the models' gradients are saved too (each rank its own part): saved between backward and
        the optimizer step, or mid-accumulation, a resumed run then takes the very same step. A loop that knows its
        gradients are spent (saved after the step, zeroed before the next backward) passes
        ``include_gradients=False``: the checkpoint is smaller and loads on another number of processes.

        With ``local_parts=True`` each process writes only its own part into its own ``output_dir`` (a folder on
        its own disk; the processes may name different ones): no shared file system is needed. Process 0's part
        holds the manifest, which lists every part's files with their checksums, so the parts copied into one
        folder (Ray Train merges the folders its workers report with ``Checkpoint.from_directory``) form a
        checkpoint that ``load_state`` verifies and loads on every process; a part alone does not verify.

        >>> import tempfile
        >>> from engine import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
        >>> folder = accelerator.save_state(os.path.join(tempfile.mkdtemp(), "ckpt"))
        >>> sorted(os.listdir(folder))
        ['manifest.json', 'model.safetensors', 'random_states_0.pkl']
        >>> later = accelerator.save_state(os.path.join(tempfile.mkdtemp(), "ckpt"), async_save=True)
        >>> accelerator.wait_for_checkpoint() == later
        True
        """
        if save_model_func_kwargs:
            raise TypeError(f"save_state() got unexpected keyword arguments {sorted(save_model_func_kwargs)}: "
                            "Accelerate passes them to DeepSpeed, which Ember does not support. Remove them.")
        for name, flag in (("async_save", async_save), ("include_gradients", include_gradients),
                           ("local_parts", local_parts)):
            if not isinstance(flag, bool):
                raise TypeError(f"save_state({name}={flag!r}): pass True or False.")
        # Registered objects first, on every rank, as Accelerate calls their state_dict(): it may run code every
        # process must run (the trainer's checkpoint hooks), and whatever that draws from the random generators
        # is then part of the state saved. A failure is raised on every rank, after the collectives (_capture).
        custom, custom_error = self._capture_custom()
        rng_state = capture_rng_state()  # then nothing below may shift what gets saved
        self.wait_for_checkpoint()  # one save in flight at most; a failed one is raised here, naming it
        config = self.project_configuration
        auto = output_dir is None
        if auto and not config.automatic_checkpoint_naming:
            raise ValueError("save_state() needs output_dir=..., or ProjectConfiguration(project_dir=..., "
                             "automatic_checkpoint_naming=True) to name checkpoints automatically.")
        if auto and config.project_dir is None:
            raise ValueError("automatic_checkpoint_naming=True needs ProjectConfiguration(project_dir=...): "
                             "checkpoints go to {project_dir}/checkpoints.")
        if local_parts and auto:
            raise ValueError("save_state(local_parts=True) needs output_dir=...: a folder on this process's own disk.")
        if local_parts:
            final, temp, number = self._plan_part(output_dir)
        else:
            self._check_same_folder(output_dir)
            final, temp, number = self._plan_shared(output_dir)
        prune = None
        if auto and config.total_limit is not None:
            prune = PrunePlan(os.path.dirname(final), config.total_limit,
                              [self._resumed_from] if self._resumed_from else [])
        job = SaveJob(final=final, temp=temp, number=number, rank=self.state.process_index,
                      world_size=self.state.num_processes,
                      writer=self.state.is_main_process if local_parts else self._is_checkpoint_writer,
                      state=CapturedState(step=step, rng=rng_state), prune=prune, local_parts=local_parts)
        error: BaseException | None = None
        try:
            job.state = self._capture(job, step, backend, rng_state, safe_serialization, async_save, custom, custom_error,
                                      include_gradients)
        except Exception as err:  # noqa: BLE001 - shared with every rank (by the job, or just below)
            error = err
        if async_save:
            failure = self._agree(error)  # start writing only if every rank has its snapshot
            if failure is not None:
                if (job.writer or local_parts) and os.path.isdir(temp):
                    folders.remove_folder(temp)
                self._raise_agreed(failure, error)
            checkpointer = self.async_checkpointer
            assert checkpointer is not None
            checkpointer.start(job)
        else:
            job.run(self._gather, error)
        config.iteration = number + 1 if number is not None else config.iteration + 1
        return final

    def _capture_custom(self) -> tuple[list[Any], Exception | None]:
        """Every registered object's ``state_dict()``, or the error one of them raised."""
        try:
            return [obj.state_dict() for obj in self.prepared.custom], None
        except Exception as error:  # noqa: BLE001 - raised on every rank by _capture, after its collectives
            return [], error

    def _capture(self, job: SaveJob, step: int, backend: Backend, rng_state: dict[str, Any], safe_serialization: bool, async_save: bool,
                 custom: list[Any], custom_error: Exception | None, gradients: bool = True) -> CapturedState:
        """Run the collective parts and the pre-hooks, and take the state (a snapshot of it for ``async_save``)."""
        # Weights and hooks run on every rank (gathering a sharded model's state is collective). The backend may
        # write models and optimizers as per-rank shards instead (FSDP2 with SHARDED_STATE_DICT).
        to_save = backend.models_to_save(self.prepared.models, self.prepared.optimizers, self.gradient_state.sync_gradients)
        weights = to_save.weights
        os.makedirs(job.temp, exist_ok=True)  # with save_on_each_node, each node's disk needs its own
        checkpointer = None
        if async_save:
            if self.async_checkpointer is None:
                self.async_checkpointer = AsyncCheckpointer()
            checkpointer = self.async_checkpointer
            checkpointer.group(self.state.use_distributed)  # a collective: before anything that may fail
        if to_save.sharded:  # a collective: before anything that could fail on one rank only
            if checkpointer is None:
                for name in backend.write_shards(job.temp, self.prepared.models, self.prepared.optimizers, self.state.process_index):
                    job.records[name] = hash_file(os.path.join(job.temp, name), default_algorithm())
            else:
                job.shard_files = backend.write_shards_async(
                    job.temp, self.prepared.models, self.prepared.optimizers, self.state.process_index,
                    lambda name: checkpointer.shard_channel(name, self.state.use_distributed))
        if custom_error is not None:  # user code too: may have failed on one rank only
            raise custom_error
        for hook in self._save_model_state_pre_hook.values():  # user code: may fail on one rank only
            hook(self.prepared.models, weights, job.temp)
        state = capture_state(step=step, rng_state=rng_state, models=self.prepared.models,
                              dataloaders=self.prepared.dataloaders, shared=job.writer, weights=weights,
                              optimizers=to_save.optimizers, schedulers=self.prepared.schedulers, scaler=self.scaler,
                              custom=custom, safe_serialization=safe_serialization, gradients=gradients)
        if checkpointer is None:
            return state
        buffers = checkpointer.buffers
        buffers.begin()
        try:
            snapshot = CapturedState(**{name: buffers.copy(value, (name,)) for name, value in vars(state).items()})
        finally:
            buffers.end()
        job.before_write = buffers.ready
        return snapshot

    def state_values(self, *, step: int, backend: Backend, include_gradients: bool = True) -> dict[str, Any] | None:
        """What ``save_state`` would write, as values gathered on the main process (``None`` on the others).

        For a caller that stores the checkpoint in one file of its own (``engine.checkpoint.values`` describes
        the values); ``load_state_values`` restores them exactly. Every rank must call it. Raises
        ``CheckpointError`` where ``backend`` writes shards (no process holds the whole state).
        """
        custom, custom_error = self._capture_custom()  # as save_state: first, on every rank
        rng_state = capture_rng_state()
        self.wait_for_checkpoint()
        error: BaseException | None = custom_error
        values = None
        prepared = self.prepared
        try:
            to_save = backend.models_to_save(prepared.models, prepared.optimizers, self.gradient_state.sync_gradients)
            if error is None:
                values = capture_values(
                    step=step, rng_state=rng_state, rank=self.state.process_index,
                    world_size=self.state.num_processes, main=self.state.is_main_process,
                    distributed=self.state.use_distributed, models=prepared.models, dataloaders=prepared.dataloaders,
                    to_save=to_save, schedulers=prepared.schedulers, scaler=self.scaler, custom=custom,
                    gradients=include_gradients)
        except Exception as err:  # noqa: BLE001 - shared with every rank below
            error = err
        failure = self._agree(error)
        if failure is not None:
            self._raise_agreed(failure, error)
        return values

    def load_state_values(self, values: dict[str, Any], source: str, *, backend: Backend, strict: bool = True) -> int:
        """Restore what ``state_values`` returned (read back on every rank); ``source`` names it in messages.
        Returns the Accelerator's step the values hold."""
        self.wait_for_checkpoint()

        def missing(what: str) -> None:
            raise CheckpointError(f"{source} holds {what}.")

        loaded = to_loaded(values, source, self.state.process_index, len(self.prepared.custom), missing)
        return self._apply(loaded, backend, strict)

    def wait_for_checkpoint(self) -> str | None:
        """Block until the asynchronous save in flight (if any) is committed; returns its folder, or None.

        Raises ``CheckpointError`` naming the checkpoint if its background write failed.
        """
        checkpointer = self.async_checkpointer
        return None if checkpointer is None else checkpointer.wait()

    @property
    def checkpoint_snapshot_bytes(self) -> int:
        """Host memory held for asynchronous saves (the state's snapshot buffers, reused by every save).

        FSDP2 shards saved with SHARDED_STATE_DICT are staged by torch.distributed.checkpoint's own stager
        (also reused between saves) and are not counted here.
        """
        checkpointer = self.async_checkpointer
        return 0 if checkpointer is None else checkpointer.buffers.nbytes

    def _check_same_folder(self, output_dir: str | os.PathLike[str] | None) -> None:
        """Refuse, on every rank and before anything is written, a save where the ranks name different folders.

        The ranks write one checkpoint together into rank 0's folder, so `load_state` from any other folder would
        find nothing (Accelerate saves there and fails at load with FileNotFoundError on the other ranks).
        """
        if not self.state.use_distributed:
            return
        try:
            mine = None if output_dir is None else os.path.abspath(os.fspath(output_dir))
        except TypeError:  # rank 0's planning reports it; this rank must still take part in the exchange
            mine = f"<not a path: {output_dir!r}>"
        everyone = gather_object([mine])
        if any(folder != everyone[0] for folder in everyone):
            listing = "\n".join(f"  - process {rank}: {folder}" for rank, folder in enumerate(everyone))
            raise ValueError("save_state() needs the same output_dir on every process (the processes write one "
                             f"checkpoint together), got:\n{listing}\nPass one path on every process, e.g. "
                             "make it on the main process and share it with `broadcast_object_list`.")

    def _plan_shared(self, output_dir: str | os.PathLike[str] | None) -> tuple[str, str, int | None]:
        """Rank 0 picks the folder names (and cleans crash leftovers); everyone else uses the same ones."""
        plan: list[Any] = [None]
        plan_error: BaseException | None = None
        if self.state.is_main_process:
            try:
                plan[0] = ("ok", self._plan_save(output_dir))
            except Exception as err:  # noqa: BLE001 - re-raised on every rank below
                plan_error, plan[0] = err, (type(err).__name__, str(err))
        broadcast_object_list(plan)
        if plan[0][0] != "ok":
            self._raise_agreed((plan[0][0], plan[0][1], 0), plan_error)
        return plan[0][1]

    def _plan_part(self, output_dir: str | os.PathLike[str] | None) -> tuple[str, str, int | None]:
        """Each rank plans its own part's folder on its own disk; a failure on any rank is raised on all."""
        plan, error = None, None
        try:
            plan = self._plan_save(output_dir)
        except Exception as err:  # noqa: BLE001 - agreed just below
            error = err
        failure = self._agree(error)
        if failure is not None:
            if plan is not None:
                folders.remove_folder(plan[1])
            self._raise_agreed(failure, error)
        assert plan is not None
        return plan

    def _plan_save(self, output_dir: str | os.PathLike[str] | None) -> tuple[str, str, int | None]:
        """(final folder, temporary folder, automatic number or None); creates the temporary folder."""
        config = self.project_configuration
        if output_dir is None:
            base = os.path.join(os.path.abspath(config.project_dir or "."), "checkpoints")
            os.makedirs(base, exist_ok=True)
            folders.clean_leftovers(base, folders.AUTO_PREFIX)
            number = folders.next_checkpoint_number(base, config.iteration)
            final = os.path.join(base, f"{folders.AUTO_PREFIX}{number}")
            return final, folders.new_temp_folder(final), number
        final = os.path.abspath(os.fspath(output_dir))
        parent, name = os.path.split(final)
        folders.clean_leftovers(parent, f"{name}-")
        folders.check_replaceable(final)
        return final, folders.new_temp_folder(final), None

    # -- load -------------------------------------------------------------------------------------------------
    def load_state(self, input_dir: str | os.PathLike[str] | None = None, load_kwargs: dict[str, Any] | None = None,
                   *, backend: Backend, allow_unsafe_pickle: bool = False, **load_model_func_kwargs: Any) -> Restored:
        """Restore everything ``save_state`` saved, exactly (``backend`` reads the models and optimizers); returns
        the folder loaded and the step it holds.

        Without ``input_dir`` (automatic naming), the newest committed checkpoint is loaded; if it is corrupted,
        the previous one is, with a warning. ``project_configuration.iteration`` continues after the loaded one.
        Nothing is unpickled beyond tensors and plain values unless ``allow_unsafe_pickle=True``: only pass it
        for checkpoints you trust. ``load_model_func_kwargs`` accepts ``strict`` (for ``load_state_dict``) and
        ``map_location`` (``"cpu"``, ``"on_device"`` or a device).
        """
        options = {**(load_kwargs or {}), **load_model_func_kwargs}
        unknown = sorted(set(options) - {"strict", "map_location"})
        if unknown:
            hint = " Use allow_unsafe_pickle=True instead of weights_only." if "weights_only" in unknown else ""
            raise TypeError(f"load_state() got unsupported options {unknown}: it accepts strict= and "
                            f"map_location=.{hint}")
        self.wait_for_checkpoint()  # the save in flight may be the very checkpoint asked for
        map_location = options.get("map_location", "cpu")
        if map_location == "on_device":
            map_location = self.state.device
        candidates = self._load_candidates(input_dir)
        strict = bool(options.get("strict", True))
        steps: dict[str, int] = {}  # by folder: the one that verified is the one returned
        # Two threads read, and check, side by side: loading is bound by memory bandwidth, not by one core.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="ember-load") as pool:
            def load(folder: str) -> None:
                steps[folder] = self._apply(self._read_agreed(folder, allow_unsafe_pickle, map_location, pool),
                                            backend, strict, pool, allow_unsafe_pickle)

            if input_dir is not None:  # an explicit folder is never swapped for another
                load(candidates[0])
                return Restored(candidates[0], steps[candidates[0]])
            folder = folders.load_first_intact(
                load, candidates, context="load_state()",
                advice=f"Delete or move the damaged folders out of {os.path.dirname(candidates[0])} to start afresh, "
                       "or load one of them by path with a copy of its files that verifies.")
            return Restored(folder, steps[folder])

    def _load_candidates(self, input_dir: str | os.PathLike[str] | None) -> list[str]:
        config = self.project_configuration
        if input_dir is not None:
            folder = os.path.abspath(os.fspath(input_dir))
            if not os.path.isdir(folder):
                parent, name = os.path.split(folder)
                # A crash between the two renames that replace an explicit folder leaves it moved aside.
                aside = sorted(p for p in (os.path.join(parent, n) for n in self._listdir(parent)
                                           if n.startswith(f"{folders.OLD_PREFIX}{name}-")) if folders.is_committed(p))
                if not aside:
                    raise ValueError(f"load_state(input_dir={os.fspath(input_dir)!r}): no such directory.")
                warnings.warn(f"{folder} is missing (a save replacing it was interrupted); loading the previous "
                              f"checkpoint from {aside[-1]}.", stacklevel=3)
                return [aside[-1]]
            return [folder]
        if not config.automatic_checkpoint_naming or config.project_dir is None:
            raise ValueError("load_state() needs input_dir=..., or ProjectConfiguration(project_dir=..., "
                             "automatic_checkpoint_naming=True) to find the newest checkpoint.")
        base = os.path.join(os.path.abspath(config.project_dir), "checkpoints")
        committed = folders.committed_checkpoints(base)
        if not committed:
            raise ValueError(f"load_state(): no committed checkpoint in {base} (folders without a valid "
                             f"{folders.MANIFEST_NAME} are never loaded).")
        return [path for _, path in reversed(committed)]

    @staticmethod
    def _listdir(folder: str) -> list[str]:
        try:
            return os.listdir(folder)
        except FileNotFoundError:
            return []

    def _read_agreed(self, folder: str, allow_unsafe_pickle: bool, map_location: Any,
                     pool: Executor) -> LoadedCheckpoint:
        """Check and read ``folder`` on every rank; raise on all ranks if it failed on any (nothing applied).

        One process per node checks every file's checksum, on ``pool`` while the files are read into new memory;
        nothing read is used before the check has passed (a corrupted file is reported as such, whatever error
        reading it raised). Reading first is safe: nothing is unpickled beyond tensors and plain values.
        """
        loaded = None
        error: BaseException | None = None
        try:
            manifest = folders.read_manifest(folder)
            if manifest is None:
                raise CorruptCheckpointError(
                    f"{folder} is not a committed Ember checkpoint: it has no valid {folders.MANIFEST_NAME} (a save "
                    "that never finished, or a folder not written by Ember's save_state).")
            folders.check_sizes(folder, manifest)
            check = self.state.is_local_main_process
            counts = {"num_models": len(self.prepared.models),
                      "num_optimizers": 0 if folders.holds_shards(manifest) else len(self.prepared.optimizers)}
            in_read = checked_while_read(manifest, map_location=map_location, **counts) if check else set()
            checked = folders.start_checksums(folder, manifest, pool, skip=in_read) if check else None
            try:
                loaded = read_checkpoint(
                    folder, manifest, rank=self.state.process_index, **counts,
                    num_schedulers=len(self.prepared.schedulers), num_dataloaders=len(self.prepared.dataloaders),
                    num_custom=len(self.prepared.custom), allow_unsafe_pickle=allow_unsafe_pickle,
                    map_location=map_location, pool=pool, check_while_reading=in_read)
            finally:
                if checked is not None:
                    checked()  # raises CorruptCheckpointError in place of whatever the read raised
        except Exception as err:  # noqa: BLE001 - shared with every rank by _agree
            error = err
        failure = self._agree(error)
        if failure is not None:
            self._raise_agreed(failure, error)
        assert loaded is not None
        return loaded

    def _apply(self, loaded: LoadedCheckpoint, backend: Backend, strict: bool, pool: Executor | None = None,
               allow_unsafe_pickle: bool = False) -> int:
        """Load what was read into the live objects; RNG states last, so nothing draws from them afterwards.
        Returns the Accelerator's step the checkpoint holds."""
        models = list(self.prepared.models)
        for hook in self._load_model_state_pre_hook.values():
            hook(models, loaded.folder)
        # Shards (any number of processes may have written them) or full files, into sharded models or not.
        backend.load_models(loaded.folder, loaded.manifest, loaded.models, loaded.model_files, models,
                                 loaded.optimizers, self.prepared.optimizers, self.prepared.models, strict, pool, allow_unsafe_pickle)
        for i, model in enumerate(self.prepared.models):
            restore_gradients(model, loaded.gradients.get(i))
        for scheduler, state in zip(self.prepared.schedulers, loaded.schedulers):
            scheduler.load_state_dict(state)
        if self.scaler is not None and loaded.scaler is not None:
            self.scaler.load_state_dict(loaded.scaler)
        for obj, state in zip(self.prepared.custom, loaded.custom):
            obj.load_state_dict(state)
        if loaded.world_size != self.state.num_processes:
            warnings.warn(f"Checkpoint {loaded.folder} was saved by {loaded.world_size} processes and is loaded by "
                          f"{self.state.num_processes}: RNG states and data positions are restored only for ranks "
                          "that existed, so the run will not continue exactly as before.", stacklevel=3)
        for i, state in loaded.dataloaders.items():
            load = getattr(self.prepared.dataloaders[i], "load_state_dict", None)  # the engine's loaders have it
            if callable(load):
                load(state)
        if loaded.rng is not None:
            step = int(loaded.rng["step"])
            restore_rng_state(loaded.rng["rng"])
        else:
            step = int(loaded.manifest.get("step", 0))
        self._resumed_from = loaded.folder
        number = folders.checkpoint_number(loaded.folder)
        if self.project_configuration.automatic_checkpoint_naming and number is not None:
            self.project_configuration.iteration = number + 1
        return step

    # -- single files -----------------------------------------------------------------------------------------
    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors) ``obj`` to ``f`` once per machine, replacing ``f`` atomically.

        Only the main process writes (each node's local main with ``save_on_each_node``).
        """
        if not self._is_checkpoint_writer:
            return
        if safe_serialization and not isinstance(obj, dict):
            raise TypeError(f"save(safe_serialization=True) needs a dict of tensors, got {type(obj).__name__}: "
                            "pass safe_serialization=False to torch.save it.")
        if not isinstance(f, (str, os.PathLike)):  # a file object: no atomic replacement possible
            if safe_serialization:
                from safetensors.torch import save as safetensors_bytes

                f.write(safetensors_bytes(obj, metadata={"format": "pt"}))
            else:
                torch.save(obj, f)
            return
        if safe_serialization:
            atomic_write(f, lambda path: save_safetensors(obj, path))
        else:
            atomic_write(f, lambda path: save_torch(obj, path))

    def save_model(self, full_state_dict: Callable[[], dict[str, torch.Tensor]],
                   save_directory: str | os.PathLike[str], max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Save the bare model's weights for inference: ``model.safetensors``, or shards plus an index file
        (``model-00001-of-00002.safetensors``, ``model.safetensors.index.json``) when larger than
        ``max_shard_size``. ``full_state_dict`` gives the bare model's weights (a collective under FSDP2: every
        rank calls it, after the arguments are checked).
        """
        from engine.checkpoint.io import parse_size
        from engine.checkpoint.model_saving import write_model

        limit = parse_size(max_shard_size)
        if os.path.isfile(save_directory):
            raise ValueError(f"save_model(save_directory={os.fspath(save_directory)!r}) is a file: give a "
                             "directory.")
        state_dict = full_state_dict()  # every rank: gathering a sharded model is collective
        if self._is_checkpoint_writer:
            write_model(state_dict, os.fspath(save_directory), limit, safe_serialization)
