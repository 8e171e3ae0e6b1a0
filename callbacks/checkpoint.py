"""`ModelCheckpoint`: complete, atomic checkpoints through the engine, with Lightning's names and rotation.

Every checkpoint is written by ``trainer.save_checkpoint``: one ``.ckpt`` file with Lightning's keys where one
process holds the whole state, a folder of shards on sharded backends; complete or absent, safe to load, enough
to resume exactly, under Lightning's names (``epoch=3-step=120.ckpt``, ``last.ckpt``). Which folders exist is decided by this
callback's own state alone (the top k, the unranked ones, the last one), which is saved inside each checkpoint it
writes, already including that checkpoint, so a resumed run continues the same rotation. A folder is deleted only
after the checkpoint that replaces it is committed.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import time
import warnings
from datetime import timedelta
from typing import Any, Literal

import torch

from callbacks.base import Callback
from callbacks.checkpoint_files import link_checkpoint, relative, remove_checkpoints, resolve, tell_loggers
from callbacks.checkpoint_names import number, render
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView
from engine import broadcast_object_list
from engine.keywords import suggest_keywords

log = logging.getLogger(__name__)


def _count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MisconfigurationException(f"Invalid value for {name}={value!r}. Must be >= 0 (or None).")
    return value


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    # 0 is allowed, as in Lightning: every training batch is then due (tests and short jobs use it).
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise MisconfigurationException(f"ModelCheckpoint(train_time_interval=...) must be a timedelta or number "
                                        f"of seconds >= 0. Received: {value!r}.")
    return float(seconds)


@suggest_keywords
class ModelCheckpoint(Callback):
    """Save complete checkpoints during ``fit``: the best ``save_top_k`` by ``monitor``, and ``last.ckpt``.

    Args:
        dirpath: where the checkpoints go (default ``{logger.log_dir}/checkpoints`` or
            ``{default_root_dir}/checkpoints``); ``~`` is expanded.
        filename: a name template over ``epoch``, ``step`` and logged metrics, e.g.
            ``"{epoch}-{val/acc:.3f}"`` (a ``{name}`` not preceded by ``name=`` gets it, unless
            ``auto_insert_metric_name=False``; a name not logged is 0; ``/`` becomes ``_``). A taken name gets
            ``-v1``, ``-v2``... (``enable_version_counter``). Default ``"epoch={epoch}-step={step}"``; the
            name ends with ``FILE_EXTENSION`` (``.ckpt``).
        monitor / mode: the metric that ranks checkpoints (``"epoch"`` and ``"step"`` are always available) and
            whether lower (``"min"``) or higher (``"max"``) is better; ``None``: the newest are kept.
        save_top_k: ranked checkpoints to keep (``-1``: all, ``0``: none); without ``monitor`` only -1, 0 or 1.
        save_last: also save ``last.ckpt`` (``CHECKPOINT_NAME_LAST``, a template too) at every save point;
            ``"link"``: a relative symbolic link to the top-k checkpoint just saved (a full save when none was).
        save_on_exception: when fit fails, save the module's weights (``save_weights_only``-style) under the next
            name: a complete checkpoint would not resume exactly (the failing batch was already drawn), so a run
            resumes from the last regular checkpoint. One process only (a failing rank cannot wait for the others).
        every_n_train_steps / every_n_epochs / train_time_interval: when to save (at most one of them non-zero;
            default every epoch).
        save_on_train_epoch_end: save epoch checkpoints at the training epoch's end (``True``) or after
            validation (``False``); ``None`` decides as Lightning does.
        save_weights_only: save only the module's weights (loadable with ``Module.load_from_checkpoint``); such
            checkpoints cannot resume a run.
        async_save: write in the background (``Accelerator.save_state(async_save=True)``: a checkpoint folder,
            still committed atomically, holding the state at the save); replaced checkpoints go once the new one
            is committed.

    Example:
        >>> checkpoint = ModelCheckpoint(dirpath="ckpt", filename="{epoch}-{step}-{val/acc:.3f}",
        ...                              monitor="val/acc", mode="max", save_top_k=2, save_last=True)
        >>> os.path.basename(checkpoint.format_checkpoint_name({"epoch": 3, "step": 120, "val/acc": 0.91234}))
        'epoch=3-step=120-val_acc=0.912.ckpt'
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1
    epoch_end_after_module = True  # it ranks / compares what the module logged at the epoch end

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 monitor: str | None = None, verbose: bool = False,
                 save_last: bool | Literal["link"] | None = None, save_top_k: int = 1,
                 save_on_exception: bool = False, save_weights_only: bool = False, mode: str = "min",
                 auto_insert_metric_name: bool = True, every_n_train_steps: int | None = None,
                 train_time_interval: timedelta | float | None = None, every_n_epochs: int | None = None,
                 save_on_train_epoch_end: bool | None = None, enable_version_counter: bool = True,
                 async_save: bool = False) -> None:
        if mode not in ("min", "max"):
            raise MisconfigurationException(f"ModelCheckpoint(mode={mode!r}): `mode` can be min, max but got {mode}. "
                                            "Pass mode='min' (lower is better) or mode='max'.")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
            raise MisconfigurationException(f"Invalid value for save_top_k={save_top_k!r}. Must be >= -1 (-1 keeps "
                                            "all, 0 none).")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise MisconfigurationException(f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid "
                                            "configuration. No quantity for top_k to track: set monitor='val_loss' "
                                            "(for example) or save_top_k to -1, 0 or 1.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise MisconfigurationException(f"ModelCheckpoint(monitor=...) must be a metric name or None. "
                                            f"Received: {monitor!r}.")
        if save_last not in (None, True, False, "link"):
            raise MisconfigurationException(f"ModelCheckpoint(save_last=...) takes True, False, None or 'link'. "
                                            f"Received: {save_last!r}.")
        if filename is not None and (not isinstance(filename, str) or not filename.strip()):
            raise MisconfigurationException(f"ModelCheckpoint(filename=...) must be a non-empty template. "
                                            f"Received: {filename!r}.")
        steps, epochs = _count("every_n_train_steps", every_n_train_steps), _count("every_n_epochs", every_n_epochs)
        interval = _seconds(train_time_interval)
        if sum(bool(x) for x in (steps, epochs, interval is not None)) > 1:
            raise MisconfigurationException(
                f"Combination of parameters every_n_train_steps={every_n_train_steps}, every_n_epochs="
                f"{every_n_epochs} and train_time_interval={train_time_interval} should be mutually exclusive: set "
                "one of them (add a second ModelCheckpoint for a second schedule).")
        if not isinstance(async_save, bool):
            raise TypeError(f"ModelCheckpoint(async_save=...) must be True or False. Received: {async_save!r}.")
        self.dirpath = (os.path.abspath(os.path.expanduser(os.fspath(dirpath))) if dirpath is not None else None)
        self._dirpath_given = dirpath is not None
        given = os.fspath(dirpath) if dirpath is not None else ""
        self._dirpath_url = given if "://" in str(given) and not str(given).startswith("file://") else ""
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = bool(save_weights_only)
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = bool(enable_version_counter)
        self.async_save = async_save
        self._every_n_train_steps = steps or 0
        self._train_time_interval = interval
        # Lightning's default: every epoch, unless another schedule was asked for.
        self._every_n_epochs = epochs if epochs is not None else (0 if steps or interval is not None else 1)
        # The bookkeeping, saved in every checkpoint (state_dict): nothing else decides which folders stay.
        self._scores: dict[str, float] = {}  # ranked checkpoints: path -> monitored value
        self._unranked: list[str] = []  # without `monitor`: the kept checkpoints, oldest first
        self.best_model_path = ""
        self.last_model_path = ""
        self.current_score: torch.Tensor | None = None
        self._last_global_step_saved = 0  # no checkpoint before the first step
        self._last_checkpoint_saved = ""  # the newest checkpoint written (what save_last="link" points to)
        self._pending_removal: list[str] = []
        # Within a run only.
        self._run_dir: str | None = None  # the trainer's project_dir: saved paths are relative to it
        self._requested = False
        self._validated = False  # a validation ran during the current training batch
        self._seen_everything = False  # a validation or an epoch end happened: every metric was logged once
        self._validation_ran = False  # a validation ran in this fit
        self._monitor_from_validation = False
        self._before_validation: Any = None
        self._last_time = 0.0
        self._warned: set[str] = set()
        self._removal_waits_for_commit = False  # _pending_removal goes once the async save in flight commits

    @property
    def state_key(self) -> str:
        return (f"{type(self).__qualname__}{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}, 'every_n_train_steps': "
                f"{self._every_n_train_steps}, 'every_n_epochs': {self._every_n_epochs}, 'train_time_interval': "
                f"{self._train_time_interval}}}")

    # -- what Lightning users read ----------------------------------------------------------------------------
    @property
    def every_n_epochs(self) -> int:
        return self._every_n_epochs

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

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None,
                               prefix: str | None = None) -> str:
        """The checkpoint path ``filename`` (default: this callback's template) gives for ``metrics``.

        Example:
            >>> ModelCheckpoint(dirpath="/c", filename="{epoch}").format_checkpoint_name({"epoch": 2}, ver=1)
            '/c/epoch=2-v1.ckpt'
        """
        template = filename or self.filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        name, missing = render(template, metrics, self.auto_insert_metric_name, self.CHECKPOINT_JOIN_CHAR,
                               self.CHECKPOINT_EQUALS_CHAR, prefix or "")
        for key in missing:
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(f"ModelCheckpoint: the name template {template!r} uses {{{key}}}, which was not "
                              f"logged; it is written as 0. Logged: {sorted(metrics)}.", UserWarning, stacklevel=2)
        if ver is not None:
            name = f"{name}{self.CHECKPOINT_JOIN_CHAR}v{ver}"
        return os.path.join(self.dirpath or "", name + self.FILE_EXTENSION)

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write ``best_k_models`` (path -> monitored value) to ``filepath`` (default
        ``{dirpath}/best_k_models.yaml``)."""
        import yaml

        path = os.fspath(filepath) if filepath is not None else os.path.join(self.dirpath or "", "best_k_models.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(dict(self._scores), f)

    def file_exists(self, filepath: str, trainer: TrainerView) -> bool:
        """Whether ``filepath`` exists, as process 0 sees it (every process must pick the same names)."""
        exists = [os.path.lexists(filepath)]
        if trainer.world_size > 1:
            broadcast_object_list(exists)
        return bool(exists[0])

    # -- hooks ------------------------------------------------------------------------------------------------
    @staticmethod
    def _fitting(trainer: TrainerView) -> bool:
        """Whether checkpoints may be saved now: only while the trainer fits (``trainer.state.fn``, as Lightning
        decides; code that drives the hooks itself sets it), never under ``fast_dev_run``."""
        return trainer.state.fn == "fit" and not trainer.fast_dev_run

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        if self.save_last == "link" and self._dirpath_url:
            # A symbolic link needs a local folder; Lightning refuses a URL (memory://, s3://) here too (its message).
            raise ValueError(f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                             f"`dirpath={self._dirpath_url}`: pass a local dirpath, or save_last=True for full copies.")
        self._seen_everything = self._validation_ran = False
        self._run_dir = os.path.abspath(trainer.accelerator.project_dir or os.getcwd())
        if self.dirpath is None:
            self.dirpath = trainer.default_checkpoint_dir
        self._last_checkpoint_saved = ""

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._last_time, self._requested = time.monotonic(), False

    def on_train_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module,
                             batch: Any, batch_idx: int) -> None:
        self._validated = False

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if not self._fitting(trainer) or step == self._last_global_step_saved:
            return  # also every micro-batch of an accumulation window but its last
        due = bool(self._every_n_train_steps) and step % self._every_n_train_steps == 0
        if self._train_time_interval is not None:
            due = self._time_is_up(trainer) or due
        if due:
            self._request(trainer, "step")

    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self.monitor is not None:
            self._before_validation = trainer.callback_metrics.get(self.monitor)

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if not self._fitting(trainer) or trainer.sanity_checking:
            return
        self._validated = self._seen_everything = self._validation_ran = True
        if self.monitor is not None:
            after = trainer.callback_metrics.get(self.monitor)
            self._monitor_from_validation |= after is not None and after is not self._before_validation
        if self._epoch_due(trainer) and not self._saves_on_train_epoch_end(trainer):
            self._request(trainer, "validation")

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._seen_everything = True
        if self._fitting(trainer) and self._epoch_due(trainer) and self._saves_on_train_epoch_end(trainer):
            self._request(trainer, "epoch")

    def on_train_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        # save_last promises a last checkpoint: one at the end when no save point came (e.g. every_n_epochs=0).
        if self._fitting(trainer) and self.save_last and not self._last_checkpoint_saved:
            self._save_point(trainer, None, trainer.current_epoch, trainer.global_step, top_k=False)

    def on_exception(self, trainer: TrainerView, pl_module: torch.nn.Module,
                     exception: BaseException) -> None:
        if not (self.save_on_exception and self._fitting(trainer) and not trainer.sanity_checking and trainer.world_size == 1
                and trainer.global_step != self._last_global_step_saved):
            return
        path = self._free_name(trainer, self._candidates(trainer, trainer.current_epoch, trainer.global_step))
        trainer.save_checkpoint(path, weights_only=True)
        self._last_global_step_saved = trainer.global_step
        log.info(f"An {type(exception).__name__} was raised with message: {exception}; saved the module's weights "
                 f"to {path}")

    def on_fit_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.finish_pending(trainer)

    def save_now(self, trainer: TrainerView, reason: str = "interrupt") -> None:
        """Save the current position as the last checkpoint (``last.ckpt``), at once and synchronously.

        The trainer calls it at a boundary on preemption and at ``max_time``, so ``ckpt_path="last"`` resumes
        exactly there. Without ``save_last`` it is kept only until the next save.
        """
        self._save_point(trainer, None, trainer.current_epoch, trainer.global_step, top_k=False, last=True, sync=True)

    # -- deciding -----------------------------------------------------------------------------------------------
    def _epoch_due(self, trainer: TrainerView) -> bool:
        return self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0

    def _saves_on_train_epoch_end(self, trainer: TrainerView) -> bool:
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        if not any(n is None or n > 0 for n in trainer.num_val_batches):
            return True  # nothing validates: the epoch's end is the only point
        # Validation once per epoch runs just before the epoch's end; several times per epoch: after each.
        return isinstance(trainer.val_check_interval, float) and trainer.val_check_interval == 1.0

    def _time_is_up(self, trainer: TrainerView) -> bool:
        now = time.monotonic()
        up = [now - self._last_time >= (self._train_time_interval or 0.0)]
        if trainer.world_size > 1:
            broadcast_object_list(up)  # process 0's clock decides: every process must save together
        if up[0]:
            self._last_time = now  # the next interval starts here (as Lightning: one save per interval)
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
        self._save_point(trainer, self._score(trainer, stale, epoch, step), epoch, step)

    def _candidates(self, trainer: TrainerView, epoch: int, step: int) -> dict[str, Any]:
        """What names and the monitor can use: the logged metrics, ``epoch`` and ``step``."""
        return {**{name: number(v) for name, v in trainer.callback_metrics.items()}, "epoch": epoch, "step": step}

    def _score(self, trainer: TrainerView, stale: bool, epoch: int, step: int) -> float | None:
        """The monitored value (``epoch`` / ``step``: where the save was asked for), process 0's on every process
        (they must rank alike), or None if stale."""
        if self.monitor is None:
            return None
        metrics = self._candidates(trainer, epoch, step)
        value = metrics.get(self.monitor)
        shared = [None if value is None else float(value)]
        if trainer.world_size > 1:
            broadcast_object_list(shared)
        if shared[0] is None and not self._seen_everything:
            stale = True  # before the first validation and epoch end, a metric may just not be logged yet
        elif shared[0] is None:
            missing = (f"`ModelCheckpoint(monitor={self.monitor!r})` could not find the monitored key in the "
                       f"returned metrics: {sorted(metrics)}. HINT: Did you call `log({self.monitor!r}, value)` in "
                       "the `LightningModule`? Or change monitor.")
            if self._validation_ran:  # every metric was logged by now: the name is wrong (Lightning's rule)
                raise MisconfigurationException(missing)
            if "missing" not in self._warned and trainer.is_global_zero:  # no validation yet: Lightning warns
                self._warned.add("missing")
                warnings.warn(f"{missing} This checkpoint is not ranked.", UserWarning, stacklevel=2)
            return None
        if stale:
            if "stale" not in self._warned and trainer.is_global_zero:
                self._warned.add("stale")
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
        return set(self._scores) | set(self._unranked) | ({self.last_model_path} if self.last_model_path else set())

    def _free_name(self, trainer: TrainerView, candidates: dict[str, Any], template: str | None = None,
                   reuse: str = "", taken: frozenset[str] = frozenset()) -> str:
        """The name ``template`` gives, with ``-vN`` while it is taken (on disk or by a kept checkpoint), unless it
        is ``reuse`` (the checkpoint this save replaces, written over atomically)."""
        path, version = self.format_checkpoint_name(candidates, template), self.STARTING_VERSION
        while self.enable_version_counter and path != reuse and (path in taken or self.file_exists(path, trainer)):
            path = self.format_checkpoint_name(candidates, template, ver=version)
            version += 1
        if trainer.world_size > 1:
            shared = [path]
            broadcast_object_list(shared)  # process 0 saw the disk; every process records the same name
            path = shared[0]
        return path

    # -- saving and rotating ------------------------------------------------------------------------------------
    def _save_point(self, trainer: TrainerView, score: float | None, epoch: int, step: int, top_k: bool = True,
                    last: bool | None = None, sync: bool = False) -> None:
        """One save point: the top-k checkpoint (if it enters) and ``last.ckpt`` (with ``save_last``)."""
        self.finish_pending(trainer)
        candidates = self._candidates(trainer, epoch, step)
        before, kept_before = self.state_dict(), self._kept()
        k, ranked_path = self.save_top_k, ""
        if top_k and k != 0 and self.monitor is None:
            previous = self.best_model_path
            ranked_path = self._free_name(trainer, candidates, reuse=previous if k == 1 else "",
                                          taken=frozenset(self._kept() - {previous}))
            self._unranked = [ranked_path] if k == 1 else [*self._unranked, ranked_path]
            self.best_model_path = ranked_path
        elif top_k and k != 0 and score is not None:
            self.current_score = torch.tensor(score)
            worst = self._worst()
            full = k != -1 and len(self._scores) >= k
            if not full or self._better(score, self._scores[worst or ""]):
                evicted = worst if full else ""
                ranked_path = self._free_name(trainer, candidates, reuse=evicted or "",
                                              taken=frozenset(self._kept() - {evicted}))
                if evicted:
                    del self._scores[evicted]
                self._scores[ranked_path] = score
                best = min if self.mode == "min" else max
                self.best_model_path = best(self._scores, key=self._scores.__getitem__)
            elif self.verbose and trainer.is_global_zero:
                log.info(f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} was not in top {k}")
        last = bool(self.save_last) if last is None else last
        last_path = ""
        if last:
            last_path = self._free_name(trainer, candidates, self.CHECKPOINT_NAME_LAST, reuse=self.last_model_path,
                                        taken=frozenset(self._kept() - {self.last_model_path}))
            self.last_model_path = last_path
        elif ranked_path and not self.save_last:
            self.last_model_path = ""  # an interrupt's last checkpoint is kept only until the next save
        if not (ranked_path or last_path):
            return
        self._last_global_step_saved = trainer.global_step
        # save_last="link": last.ckpt links to the newest top-k checkpoint written (this point's, or an earlier one
        # still kept, as Lightning does); a complete copy only while there is none.
        link_to = ranked_path or (self._last_checkpoint_saved if self._last_checkpoint_saved in self._kept()
                                  and self._last_checkpoint_saved != last_path else "")
        self._last_checkpoint_saved = ranked_path or (link_to if self.save_last == "link" else "") or last_path
        removable = sorted((kept_before - self._kept()) | set(self._pending_removal))
        # Never a checkpoint outside this callback's folder (as Lightning): after a resume with another dirpath the
        # restored last_model_path names the earlier run's file, which that run still owns.
        self._pending_removal = [p for p in removable if p not in (ranked_path, last_path) and self._owns(p)]
        asynchronous = self.async_save and not sync
        try:  # each checkpoint holds this bookkeeping, itself included
            for path in (ranked_path, last_path):
                if not path:
                    continue
                if path == last_path and self.save_last == "link" and link_to:
                    link_checkpoint(trainer, link_to, last_path)
                    continue
                if os.path.islink(path) and trainer.is_global_zero:
                    os.unlink(path)  # a link of an earlier run (save_last="link"): the copy takes its place
                # Lightning's call, (filepath, weights_only): a Trainer subclass overriding save_checkpoint with
                # Lightning's signature works; async_save only when asked for.
                if asynchronous:
                    trainer.save_checkpoint(path, self.save_weights_only, async_save=True)
                else:
                    trainer.save_checkpoint(path, self.save_weights_only)
                self._report(trainer, path, score, epoch, step, asynchronous)
                tell_loggers(trainer, self)
        except BaseException:
            self.load_state_dict(before)
            raise
        if asynchronous:  # not committed yet: the replaced ones stay until it is (the next save, or fit's end)
            self._removal_waits_for_commit = True
        else:
            remove_checkpoints(trainer, self._pending_removal)
            self._pending_removal = []

    def _report(self, trainer: TrainerView, path: str, score: float | None, epoch: int, step: int,
                asynchronous: bool) -> None:
        if self.verbose and trainer.is_global_zero:
            what = f"{self.monitor!r} reached {score:.5f}, " if score is not None else ""
            log.info(f"Epoch {epoch:d}, global step {step:d}: {what}saving model to {path!r}"
                     f"{' (written in the background)' if asynchronous else ''}")

    def _owns(self, path: str) -> bool:
        """Whether ``path`` lies inside this callback's ``dirpath`` (only such checkpoints are ever deleted)."""
        if not self.dirpath:
            return True
        folder = os.path.abspath(self.dirpath)
        return os.path.commonpath([folder, os.path.abspath(path)]) == folder

    def finish_pending(self, trainer: TrainerView) -> None:
        """Wait for this callback's asynchronous save in flight, then delete the checkpoints it replaced.

        Called by the next save, at the end of ``fit`` and by the trainer before a preempted process stops.
        """
        if not self._removal_waits_for_commit:
            return
        trainer.accelerator.wait_for_checkpoint()  # raises, naming the checkpoint, if its write failed
        self._removal_waits_for_commit = False
        remove_checkpoints(trainer, self._pending_removal)
        self._pending_removal = []

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The bookkeeping, with paths relative to the run folder (``dirpath``) and to ``dirpath`` (checkpoints).

        A run folder that is copied or moved keeps its top-k record: the paths are resolved against where the
        resumed run's folders are, so the copy ranks, keeps and deletes its own checkpoints, never the original's.
        """
        directory = self.dirpath or ""
        return {"monitor": self.monitor, "mode": self.mode, "relative": True,
                "dirpath": relative(directory, self._run_dir or os.getcwd()),
                "best_k_models": {relative(p, directory): s for p, s in self._scores.items()},
                "unranked": [relative(p, directory) for p in self._unranked],
                "best_model_path": relative(self.best_model_path, directory),
                "last_model_path": relative(self.last_model_path, directory),
                # A tensor, as Lightning stores it: its value compares equal to the logged number (a float of the
                # float32 value would not: 0.10000000149 != 0.1); torch.load(weights_only=True) reads it.
                "current_score": None if self.current_score is None else self.current_score.clone(),
                "last_global_step_saved": self._last_global_step_saved,
                "pending_removal": [relative(p, directory) for p in self._pending_removal],
                # Lightning's own keys, so Lightning's ModelCheckpoint reads this state from a .ckpt file.
                "best_model_score": self.best_model_score, "kth_value": self.kth_value,
                "kth_best_model_path": relative(self.kth_best_model_path, directory)}

    @staticmethod
    def best_path_in(state_dict: dict[str, Any], run_dir: str) -> str:
        """``best_model_path`` of a saved ``state_dict``, resolved for the run folder ``run_dir``.

        >>> ModelCheckpoint.best_path_in({"relative": True, "dirpath": "checkpoints",
        ...                               "best_model_path": "epoch=1-step=8.ckpt"}, "/runs/x")
        '/runs/x/checkpoints/epoch=1-step=8.ckpt'
        """
        if not state_dict.get("relative"):  # older checkpoints hold absolute paths
            return str(state_dict["best_model_path"])
        return resolve(state_dict["best_model_path"], resolve(state_dict["dirpath"], os.path.abspath(run_dir)))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        is_relative = bool(state_dict.get("relative"))  # older checkpoints hold absolute paths
        run_dir = self._run_dir or os.getcwd()
        saved_dir = resolve(state_dict["dirpath"], run_dir) if is_relative else state_dict["dirpath"]
        where = saved_dir if is_relative else ""

        def path(p: str) -> str:
            return resolve(p, where) if is_relative else p

        if self.dirpath is not None and not self._dirpath_given:
            self.dirpath = saved_dir  # a default folder follows the run it resumes (its logger's version folder)
        if self.dirpath is not None and os.path.normpath(saved_dir) != os.path.normpath(self.dirpath):
            warnings.warn(f"ModelCheckpoint: The dirpath has changed from {saved_dir} to {self.dirpath}; its top-k and "
                          "last bookkeeping are not restored (only best_model_path and last_model_path).",
                          UserWarning, stacklevel=2)
            self.best_model_path = path(state_dict["best_model_path"])
            self.last_model_path = path(state_dict["last_model_path"])
            return
        self._scores = {path(str(p)): float(s) for p, s in state_dict["best_k_models"].items()}
        self._unranked = [path(p) for p in state_dict["unranked"]]
        self.best_model_path = path(state_dict["best_model_path"])
        self.last_model_path = path(state_dict["last_model_path"])
        if state_dict.get("last_kept") is False:  # an older checkpoint: its newest folder was not kept as last
            self.last_model_path = ""
        score = state_dict["current_score"]
        self.current_score = None if score is None else torch.as_tensor(score).clone()
        self._last_global_step_saved = int(state_dict["last_global_step_saved"])
        # Folders a crash left behind before they were deleted go with the next save.
        self._pending_removal = [path(p) for p in state_dict["pending_removal"]]


# The signature with its annotations evaluated (this module postpones them): tools that read the signature to
# build a parser (jsonargparse, LightningCLI) get real types, e.g. ``save_last: bool | Literal["link"] | None``.
ModelCheckpoint.__init__.__signature__ = inspect.signature(  # type: ignore[attr-defined]  # a function attribute
    ModelCheckpoint.__init__, eval_str=True)
