"""`ModelCheckpoint`: complete, atomic checkpoints through the engine, keeping the top k and the last one.

Every checkpoint is a folder written by ``trainer.save_checkpoint`` (``Accelerator.save_state``): complete or
absent, safe to load, enough to resume exactly. Which folders exist is decided by this callback's own state
alone (the ranked ones, the unranked ones, the last one), which is saved inside each checkpoint it writes,
already including that checkpoint, so a resumed run continues the same rotation. A folder is deleted only after
the checkpoint that replaces it is committed.
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings
from datetime import timedelta
from typing import Any

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView
from engine import broadcast_object_list
from engine import checkpointing as folders
from engine.keywords import suggest_keywords

_GROUP = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")  # "{name}" or "{name:spec}"; names may hold "/" and "."


def _count(name: str, value: Any) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ModelCheckpoint({name}=...) must be an int >= 0 or None. Received: {value!r}.")
    return value


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"ModelCheckpoint(train_time_interval=...) must be a positive timedelta or number of "
                         f"seconds. Received: {value!r}.")
    return float(seconds)


def _weights_only_folder(path: str) -> bool:
    """Whether ``path`` holds only what ``save_model`` writes (``save_weights_only=True`` checkpoints)."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return bool(names) and all(n.startswith("model") and n.endswith((".safetensors", ".bin", ".index.json"))
                               for n in names)


def _number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


@suggest_keywords
class ModelCheckpoint(Callback):
    """Save complete checkpoints during ``fit``; keep the best ``save_top_k`` by ``monitor`` and the last one.

    Args:
        dirpath: where the checkpoint folders go (default ``{project_dir}/checkpoints``).
        filename: a folder name template over ``epoch``, ``step`` and logged metrics, e.g.
            ``"epoch={epoch}-step={step}-{val/acc:.3f}"``; a ``{name}`` not preceded by ``name=`` gets it
            (``auto_insert_metric_name``), and ``/`` becomes ``_`` so each checkpoint is one folder. A name
            already taken gets ``-v1``, ``-v2``... Default ``"{epoch}-{step}"`` (``epoch=3-step=120``).
        monitor / mode: the metric that ranks checkpoints and whether lower (``"min"``) or higher (``"max"``)
            is better; ``None``: checkpoints are not ranked, the newest are kept.
        save_top_k: how many ranked checkpoints to keep (``-1``: all, ``0``: none); without ``monitor``
            only ``-1``, ``0`` or ``1`` (the newest).
        save_last: also keep the newest checkpoint as ``last_model_path``, ranked or not.
        every_n_train_steps / every_n_epochs / train_time_interval: when to save (at most one; default every
            epoch). A step checkpoint is taken after that step's validation, if any; one whose ``monitor`` is a
            validation metric that did not run at that step is not ranked (its value would be stale).
        save_on_train_epoch_end: save epoch checkpoints at the training epoch's end (``True``) or after
            validation (``False``); ``None`` decides as Lightning does.
        save_weights_only: save only the module's weights (``model.safetensors``, loadable with
            ``Module.load_from_checkpoint``); such folders cannot resume a run.
        enable_version_counter: a name already taken gets ``-v1``, ``-v2``... (``False``: replace it).
        async_save: return to training as soon as the state is snapshotted and write the checkpoint in the
            background (``Accelerator.save_state(async_save=True)``: still committed atomically, holding the
            state at the save). Replaced checkpoints are deleted only once the new one is committed; a failed
            write is raised at the next save or at the end of ``fit``; saves on preemption and ``max_time`` are
            synchronous.

    Example:
        >>> checkpoint = ModelCheckpoint(dirpath="ckpt", filename="epoch={epoch}-step={step}-{val/acc:.3f}",
        ...                              monitor="val/acc", mode="max", save_top_k=2, save_last=True)
        >>> os.path.basename(checkpoint.format_checkpoint_name({"epoch": 3, "step": 120, "val/acc": 0.91234}))
        'epoch=3-step=120-val_acc=0.912'
    """

    epoch_end_after_module = True  # it ranks / compares what the module logged at the epoch end

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 monitor: str | None = None, mode: str = "min", save_top_k: int = 1, save_last: bool | None = None,
                 every_n_train_steps: int | None = None, every_n_epochs: int | None = None,
                 train_time_interval: timedelta | float | None = None, save_on_train_epoch_end: bool | None = None,
                 auto_insert_metric_name: bool = True, verbose: bool = False, save_weights_only: bool = False,
                 enable_version_counter: bool = True, async_save: bool = False) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint(mode=...) must be 'min' or 'max'. Received: {mode!r}.")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(f"ModelCheckpoint(save_top_k=...) must be -1 (keep all), 0 (keep none) or a positive "
                             f"int. Received: {save_top_k!r}.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None): without a monitored metric "
                             "there is nothing to rank. Set monitor='val/loss' (for example) or save_top_k to -1, 0 "
                             "or 1.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise ValueError(f"ModelCheckpoint(monitor=...) must be a metric name or None. Received: {monitor!r}.")
        if filename is not None and (not isinstance(filename, str) or not filename.strip()):
            raise ValueError(f"ModelCheckpoint(filename=...) must be a non-empty template. Received: {filename!r}.")
        steps, epochs = _count("every_n_train_steps", every_n_train_steps), _count("every_n_epochs", every_n_epochs)
        interval = _seconds(train_time_interval)
        if sum(bool(x) for x in (steps, epochs, interval)) > 1:
            raise ValueError(f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs="
                             f"{every_n_epochs}, train_time_interval={train_time_interval}): these are alternatives; "
                             "set only one of them (add a second ModelCheckpoint for a second schedule).")
        if not isinstance(async_save, bool):
            raise TypeError(f"ModelCheckpoint(async_save=...) must be True or False. Received: {async_save!r}.")
        self.dirpath = os.path.abspath(os.fspath(dirpath)) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.verbose = verbose
        self.save_weights_only = bool(save_weights_only)
        self.enable_version_counter = bool(enable_version_counter)
        self.async_save = async_save
        self._every_n_train_steps = steps
        self._every_n_epochs = epochs if (steps or epochs or interval) else 1
        self._train_time_interval = interval
        # The bookkeeping, saved in every checkpoint (state_dict): nothing else decides which folders stay.
        self._scores: dict[str, float] = {}  # ranked checkpoints: path -> monitored value
        self._unranked: list[str] = []  # without `monitor`: the kept checkpoints, oldest first
        self.best_model_path = ""
        self.last_model_path = ""
        self._last_kept = False  # whether last_model_path is kept as the last one
        self.current_score: float | None = None
        self._last_global_step_saved = 0  # no checkpoint before the first step
        self._pending_removal: list[str] = []
        # Within a run only.
        self._run_dir: str | None = None  # the trainer's project_dir: saved paths are relative to it
        self._fitting = False
        self._requested = False
        self._validated = False  # a validation ran during the current training batch
        self._seen_everything = False  # a validation or an epoch end happened: every metric was logged once
        self._monitor_from_validation = False
        self._before_validation: Any = None
        self._last_time = 0.0
        self._warned_stale = False
        self._removal_waits_for_commit = False  # _pending_removal goes once the async save in flight commits

    @property
    def state_key(self) -> str:
        return (f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}, 'every_n_train_steps': "
                f"{self._every_n_train_steps}, 'every_n_epochs': {self._every_n_epochs}, 'train_time_interval': "
                f"{self._train_time_interval}}}")

    # -- what Lightning users read ----------------------------------------------------------------------------
    @property
    def best_model_score(self) -> torch.Tensor | None:
        """The monitored value of ``best_model_path`` (``None`` without ``monitor`` or before a save)."""
        score = self._scores.get(self.best_model_path)
        return None if score is None else torch.tensor(score)

    @property
    def best_k_models(self) -> dict[str, torch.Tensor]:
        """Every kept ranked checkpoint's path and monitored value."""
        return {path: torch.tensor(score) for path, score in self._scores.items()}

    @property
    def kth_best_model_path(self) -> str:
        """The worst of the kept ranked checkpoints (the next one to go)."""
        return self._worst() or ""

    @property
    def kth_value(self) -> torch.Tensor | None:
        worst = self._worst()
        return None if worst is None else torch.tensor(self._scores[worst])

    def format_checkpoint_name(self, metrics: dict[str, Any], ver: int | None = None) -> str:
        """The folder path ``filename`` gives for ``metrics`` (which hold ``epoch`` and ``step`` too)."""
        template = self.filename or "{epoch}-{step}"

        def render(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2)
            if name not in metrics:
                raise ValueError(f"ModelCheckpoint(filename={template!r}) uses {{{name}}}, which was not logged. "
                                 f"Available: {sorted(metrics)}. Log it with self.log({name!r}, ...) or change the "
                                 "template.")
            value = _number(metrics[name])
            text = format(value, spec[1:]) if spec else str(value)
            labelled = not self.auto_insert_metric_name or template[:match.start()].endswith(f"{name}=")
            return text if labelled else f"{name}={text}"

        name = _GROUP.sub(render, template) + (f"-v{ver}" if ver else "")
        name = name.replace("/", "_").replace("\\", "_")  # one folder per checkpoint, whatever the metric names
        return os.path.join(self.dirpath or "", name)

    # -- hooks ------------------------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView, module: torch.nn.Module, stage: str) -> None:
        self._fitting = stage == "fit" and not trainer.fast_dev_run
        self._seen_everything = False
        self._run_dir = os.path.abspath(trainer.accelerator.project_dir or os.getcwd())
        if self.dirpath is None:
            self.dirpath = trainer.default_checkpoint_dir

    def on_train_start(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        self._last_time, self._requested = time.monotonic(), False

    def on_train_batch_start(self, trainer: TrainerView, module: torch.nn.Module, batch: Any, batch_idx: int) -> None:
        self._validated = False

    def on_train_batch_end(self, trainer: TrainerView, module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if not self._fitting or step == self._last_global_step_saved:
            return  # also every micro-batch of an accumulation window but its last
        due = bool(self._every_n_train_steps) and step % self._every_n_train_steps == 0
        if self._train_time_interval is not None:
            due = self._time_is_up(trainer) or due
        if due:
            self._request(trainer, "step")

    def on_validation_start(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        if self.monitor is not None:
            self._before_validation = trainer.callback_metrics.get(self.monitor)

    def on_validation_end(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        if not self._fitting or trainer.sanity_checking:
            return
        self._validated = self._seen_everything = True
        if self.monitor is not None:
            after = trainer.callback_metrics.get(self.monitor)
            self._monitor_from_validation |= after is not None and after is not self._before_validation
        if self._epoch_due(trainer) and not self._saves_on_train_epoch_end(trainer):
            self._request(trainer, "validation")

    def on_train_epoch_end(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        self._seen_everything = True
        if self._fitting and self._epoch_due(trainer) and self._saves_on_train_epoch_end(trainer):
            self._request(trainer, "epoch")

    def save_now(self, trainer: TrainerView, reason: str = "interrupt") -> None:
        """Save the current position as the last checkpoint (kept until the next save), unranked.

        The trainer calls it at a boundary on preemption and at ``max_time``, so ``ckpt_path="last"`` resumes
        exactly there.
        """
        # Synchronous, also with async_save: the process is about to stop, the checkpoint must be on disk.
        self._save(trainer, None, trainer.current_epoch, trainer.global_step, keep_as_last=True, sync=True)

    # -- deciding -----------------------------------------------------------------------------------------------
    def _epoch_due(self, trainer: TrainerView) -> bool:
        return self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0

    def _saves_on_train_epoch_end(self, trainer: TrainerView) -> bool:
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        if not trainer.val_dataloaders or not any(n is None or n > 0 for n in trainer.num_val_batches):
            return True  # nothing validates: the epoch's end is the only point
        # Validation once per epoch runs just before the epoch's end; several times per epoch: after each.
        return isinstance(trainer.val_check_interval, float) and trainer.val_check_interval == 1.0

    def _time_is_up(self, trainer: TrainerView) -> bool:
        up = [time.monotonic() - self._last_time >= (self._train_time_interval or 0.0)]
        if trainer.world_size > 1:
            broadcast_object_list(up)  # process 0's clock decides: every process must save together
        return bool(up[0])

    def _request(self, trainer: TrainerView, kind: str) -> None:
        """Ask for a save at the next boundary (once), with the epoch and step of now for the name."""
        if self._requested:
            return
        self._requested = True
        epoch, step = trainer.current_epoch, trainer.global_step
        trainer.run_at_boundary(lambda: self._save_at_boundary(trainer, kind, epoch, step))

    def _save_at_boundary(self, trainer: TrainerView, kind: str, epoch: int, step: int) -> None:
        self._requested = False
        if trainer.global_step == self._last_global_step_saved:
            return  # these weights are saved already
        stale = kind == "step" and self._monitor_from_validation and not self._validated
        self._save(trainer, self._score(trainer, stale), epoch, step, keep_as_last=bool(self.save_last))

    def _score(self, trainer: TrainerView, stale: bool) -> float | None:
        """The monitored value, process 0's on every process (they must rank alike), or None if stale."""
        if self.monitor is None:
            return None
        metrics = trainer.callback_metrics
        value = metrics.get(self.monitor)
        shared = [None if value is None else float(_number(value))]
        if trainer.world_size > 1:
            broadcast_object_list(shared)
        if shared[0] is None and not self._seen_everything:
            stale = True  # before the first validation and epoch end, a metric may just not be logged yet
        elif shared[0] is None:
            raise ValueError(f"ModelCheckpoint(monitor={self.monitor!r}) found no logged metric {self.monitor!r}. "
                             f"Logged metrics: {sorted(metrics)}. Log it with self.log({self.monitor!r}, ...) or "
                             "change monitor.")
        if stale:
            if not self._warned_stale and trainer.is_global_zero:
                self._warned_stale = True
                warnings.warn(f"ModelCheckpoint(monitor={self.monitor!r}, every_n_train_steps="
                              f"{self._every_n_train_steps}): no validation ran at step {trainer.global_step}, so "
                              "its checkpoint is not ranked (only kept as last with save_last=True). Make "
                              "every_n_train_steps a multiple of the validation interval.", UserWarning, stacklevel=2)
            return None
        assert shared[0] is not None
        score = float(shared[0])
        return (math.inf if self.mode == "min" else -math.inf) if math.isnan(score) else score

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def _worst(self) -> str | None:
        if not self._scores:
            return None
        pick = max if self.mode == "min" else min
        return pick(self._scores, key=self._scores.__getitem__)

    def _kept(self) -> set[str]:
        kept = set(self._scores) | set(self._unranked)
        if self._last_kept and self.last_model_path:
            kept.add(self.last_model_path)
        return kept

    # -- saving and rotating ------------------------------------------------------------------------------------
    def _save(self, trainer: TrainerView, score: float | None, epoch: int, step: int, keep_as_last: bool,
              sync: bool = False) -> None:
        self.finish_pending(trainer)
        k = self.save_top_k
        if self.monitor is None:
            ranked, enters = False, k != 0  # unranked: the newest are kept
        else:
            ranked = score is not None and k != 0 and (
                k == -1 or len(self._scores) < k or self._better(score, self._scores[self._worst() or ""]))
            enters = ranked
        if not (enters or keep_as_last):
            return
        before = self.state_dict()
        kept_before = self._kept()
        scores, unranked = dict(self._scores), list(self._unranked)
        if ranked and k != -1 and len(scores) >= k:
            del scores[self._worst() or ""]  # the new one replaces the worst
        if self.monitor is None and enters and k == 1:
            unranked = []
        remaining = set(scores) | set(unranked)
        evicted = (kept_before - remaining) | set(self._pending_removal)

        metrics = {name: _number(v) for name, v in trainer.callback_metrics.items()}
        base = self.format_checkpoint_name({**metrics, "epoch": epoch, "step": step})
        path, version = base, 0
        while self.enable_version_counter and (path in remaining or os.path.lexists(path)) and path not in evicted:
            version += 1
            path = f"{base}-v{version}"
        if trainer.world_size > 1:
            shared = [path]
            broadcast_object_list(shared)  # process 0 saw the disk; every process records the same name
            path = shared[0]

        if ranked:
            scores[path] = score  # type: ignore[assignment]
        elif self.monitor is None and enters:
            unranked.append(path)
        self._scores, self._unranked = scores, unranked
        self.last_model_path, self._last_kept = path, keep_as_last
        self.current_score = score
        if self.monitor is None:
            self.best_model_path = unranked[-1] if unranked else self.best_model_path
        elif scores:
            best = min if self.mode == "min" else max
            self.best_model_path = best(scores, key=scores.__getitem__)
        self._pending_removal = sorted(evicted - self._kept())
        self._last_global_step_saved, self._last_time = trainer.global_step, time.monotonic()
        asynchronous = self.async_save and not sync
        try:  # the checkpoint holds this bookkeeping, itself included
            trainer.save_checkpoint(path, weights_only=self.save_weights_only, async_save=asynchronous)
        except BaseException:
            self.load_state_dict(before)
            raise
        if asynchronous:  # not committed yet: the replaced ones stay until it is (the next save, or fit's end)
            self._removal_waits_for_commit = True
        else:
            self._remove(trainer, self._pending_removal)
            self._pending_removal = []
        if self.verbose and trainer.is_global_zero:
            what = f"{self.monitor}={score:.6g}, " if score is not None else ""
            print(f"ModelCheckpoint: saved {path} ({what}epoch {epoch}, step {step}"
                  f"{', written in the background' if asynchronous else ''}).")

    def finish_pending(self, trainer: TrainerView) -> None:
        """Wait for this callback's asynchronous save in flight, then delete the checkpoints it replaced.

        Called by the next save, at the end of ``fit`` and by the trainer before a preempted process stops.
        """
        if not self._removal_waits_for_commit:
            return
        trainer.accelerator.wait_for_checkpoint()  # raises, naming the checkpoint, if its write failed
        self._removal_waits_for_commit = False
        self._remove(trainer, self._pending_removal)
        self._pending_removal = []

    def on_fit_end(self, trainer: TrainerView, module: torch.nn.Module) -> None:
        self.finish_pending(trainer)

    @staticmethod
    def _remove(trainer: TrainerView, paths: list[str]) -> None:
        """Delete replaced checkpoints, on the process that writes them, only once the new one is committed."""
        config = trainer.accelerator.project_configuration
        writer = trainer.accelerator.is_local_main_process if config.save_on_each_node else trainer.is_global_zero
        if not writer:
            return
        for path in paths:
            # Never anything this callback did not write: a committed checkpoint, or a weights-only folder.
            if folders.is_committed(path) or _weights_only_folder(path):
                folders.remove_folder(path)

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The bookkeeping, with paths relative to the run folder (``dirpath``) and to ``dirpath`` (checkpoints).

        A run folder that is copied or moved keeps its top-k record: the paths are resolved against where the
        resumed run's folders are, so the copy ranks, keeps and deletes its own checkpoints, never the original's.
        """
        directory = self.dirpath or ""
        return {"monitor": self.monitor, "mode": self.mode, "relative": True,
                "dirpath": _relative(directory, self._run_dir or os.getcwd()),
                "best_k_models": {_relative(p, directory): s for p, s in self._scores.items()},
                "unranked": [_relative(p, directory) for p in self._unranked],
                "best_model_path": _relative(self.best_model_path, directory),
                "last_model_path": _relative(self.last_model_path, directory),
                "last_kept": self._last_kept, "current_score": self.current_score,
                "last_global_step_saved": self._last_global_step_saved,
                "pending_removal": [_relative(p, directory) for p in self._pending_removal]}

    @staticmethod
    def best_path_in(state_dict: dict[str, Any], run_dir: str) -> str:
        """``best_model_path`` of a saved ``state_dict``, resolved for the run folder ``run_dir``.

        >>> ModelCheckpoint.best_path_in({"relative": True, "dirpath": "checkpoints",
        ...                               "best_model_path": "epoch=1-step=8"}, "/runs/x")
        '/runs/x/checkpoints/epoch=1-step=8'
        """
        if not state_dict.get("relative"):  # older checkpoints hold absolute paths
            return str(state_dict["best_model_path"])
        return _resolve(state_dict["best_model_path"], _resolve(state_dict["dirpath"], os.path.abspath(run_dir)))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        relative = bool(state_dict.get("relative"))  # older checkpoints hold absolute paths
        saved_dir = _resolve(state_dict["dirpath"], self._run_dir or os.getcwd()) if relative else state_dict["dirpath"]
        where = saved_dir if relative else ""

        def path(p: str) -> str:
            return _resolve(p, where) if relative else p

        if self.dirpath is not None and os.path.normpath(saved_dir) != os.path.normpath(self.dirpath):
            warnings.warn(f"ModelCheckpoint: the checkpoint's dirpath {saved_dir} differs from "
                          f"{self.dirpath}; its top-k and last bookkeeping are not restored (only best_model_path).",
                          UserWarning, stacklevel=2)
            self.best_model_path = path(state_dict["best_model_path"])
            return
        self._scores = {path(str(p)): float(s) for p, s in state_dict["best_k_models"].items()}
        self._unranked = [path(p) for p in state_dict["unranked"]]
        self.best_model_path = path(state_dict["best_model_path"])
        self.last_model_path = path(state_dict["last_model_path"])
        self._last_kept = bool(state_dict["last_kept"])
        self.current_score = state_dict["current_score"]
        self._last_global_step_saved = int(state_dict["last_global_step_saved"])
        # Folders a crash left behind before they were deleted go with the next save.
        self._pending_removal = [path(p) for p in state_dict["pending_removal"]]


def _relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` (``/``-separated) when it lies inside it; otherwise unchanged (absolute)."""
    if not path or not base:
        return path
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(base))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return os.path.abspath(path)  # a dirpath outside the run folder stays where it is when the run moves
    return relative.replace(os.sep, "/")


def _resolve(path: str, base: str) -> str:
    """The inverse of ``_relative``: a relative path joined to ``base``; an absolute one unchanged."""
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base, *path.split("/")))
