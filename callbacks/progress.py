"""`ProgressBar`: tqdm bars in a terminal; one readable line per epoch anywhere else (log files, CI)."""

from __future__ import annotations

import sys
import time
import weakref
from typing import IO, Any

import torch

from callbacks.base import Callback
from callbacks.protocols import TrainerView
from callbacks.tqdm_format import tqdm_class
from engine.keywords import suggest_keywords


class _Progress:
    """One loop's progress: a tqdm bar on a terminal, just a batch counter and a clock elsewhere."""

    def __init__(self, name: str, total: int | None, stream: IO[str] | None, leave: bool, position: int) -> None:
        self.name = name
        self.count = 0
        self.started = time.monotonic()
        self.bar: Any = None
        if stream is not None:
            self.bar = tqdm_class()(total=total, desc=name, file=stream, leave=leave, dynamic_ncols=True,
                                    position=position)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@suggest_keywords
class ProgressBar(Callback):
    """Shows progress and the ``prog_bar=True`` metrics, on the main process only.

    On a terminal it draws tqdm bars; the metrics (one device sync to read them) are refreshed at most every
    ``metrics_interval_s`` seconds. When the stream is not a terminal it prints one line per training epoch (and
    one per standalone validate / test / predict run) instead of redrawing, e.g.
    ``Epoch 3/9: 120 batches, step 360, 4.2s, train/loss=0.1234, val/acc=0.91``. Epochs are numbered from 0,
    as ``trainer.current_epoch``, checkpoint names (``epoch=3``) and resume messages number them, so the line
    reads "epoch 3 of 0..9" (Lightning's rich bar shows the same).

    Args:
        refresh_rate: redraw the bar every N batches (0 turns the bar and the lines off).
        stream: where to write (default: ``sys.stdout`` as it is at the start of each run).
        metrics_interval_s: the shortest time between two metric refreshes of a bar.

    Example:
        >>> ProgressBar(refresh_rate=10).refresh_rate
        10
    """

    def __init__(self, refresh_rate: int = 1, stream: IO[str] | None = None, metrics_interval_s: float = 0.5) -> None:
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 0:
            raise ValueError(f"ProgressBar(refresh_rate=...) must be an int >= 0. Received: {refresh_rate!r}.")
        self.refresh_rate = refresh_rate
        self.metrics_interval_s = metrics_interval_s
        self._given_stream = stream
        self._stream: IO[str] = stream or sys.stdout
        self._active = False
        self._terminal = False
        self._in_fit = False
        self._train: _Progress | None = None
        self._first_batch = 0
        self._eval: _Progress | None = None
        self._last_metrics = 0.0
        self._enabled = True
        self._trainer_ref: weakref.ReferenceType[Any] | None = None
        self._module_ref: weakref.ReferenceType[torch.nn.Module] | None = None
        self._eval_dataloader_idx: int | None = None  # the evaluation loader being shown (a bar per loader)

    def __getstate__(self) -> dict[str, Any]:
        """A bar pickles (Lightning's do, e.g. with the trainer's callbacks): without its run's live parts (the
        trainer and module references, the drawn bars, the stream), which the next run's ``setup`` sets again."""
        state = dict(vars(self))
        state.update(_trainer_ref=None, _module_ref=None, _train=None, _eval=None, _active=False, _terminal=False)
        state["_stream"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._stream = self._given_stream or sys.stdout

    # -- runs -------------------------------------------------------------------------------------------------
    @property
    def skipped_hooks(self) -> frozenset[str]:
        # Not a terminal: nothing is drawn per training batch (the epoch line counts batches from the trainer's
        # state), so the trainer need not call this callback on every batch.
        isatty = getattr(self._given_stream or sys.stdout, "isatty", None)
        return frozenset() if callable(isatty) and isatty() else frozenset({"on_train_batch_end"})

    # -- Lightning's ProgressBar API -----------------------------------------------------------------------------
    @property
    def trainer(self) -> TrainerView:
        """The trainer of the current (or last) run."""
        trainer = self._trainer
        if trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer: its trainer is known from "
                               "the first run's setup on.")
        return trainer

    @property
    def _trainer(self) -> TrainerView | None:
        """Lightning's attribute behind ``trainer`` (a subclass may read or set it); held weakly, so a bar kept
        after its run does not keep the trainer alive."""
        return self._trainer_ref() if self._trainer_ref is not None else None

    @_trainer.setter
    def _trainer(self, trainer: TrainerView | None) -> None:
        self._trainer_ref = None if trainer is None else weakref.ref(trainer)

    @property
    def total_train_batches(self) -> int | float:
        """Training batches per epoch (``inf`` for a loader without a length)."""
        total = self.trainer.num_training_batches
        return float("inf") if total is None else total

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of this epoch, over every loader (0 when the epoch does not validate)."""
        trainer = self.trainer
        every = trainer.check_val_every_n_epoch
        if not trainer.num_val_batches or (every is not None and (trainer.current_epoch + 1) % every != 0):
            return 0
        counts = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        return float("inf") if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def total_test_batches(self) -> int | float:
        counts = self.trainer.num_test_batches
        return float("inf") if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def total_predict_batches(self) -> int | float:
        counts = self.trainer.num_predict_batches
        return float("inf") if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    # Lightning's names of the loops, as the bars show them (a subclass may override them).
    @property
    def train_description(self) -> str:
        return "Training"

    @property
    def sanity_check_description(self) -> str:
        return "Sanity Checking"

    @property
    def validation_description(self) -> str:
        return "Validation"

    @property
    def test_description(self) -> str:
        return "Testing"

    @property
    def predict_description(self) -> str:
        return "Predicting"

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Whether ``dataloader_idx`` differs from the evaluation loader of the previous batch (then remembered):
        a bar starts a new task per loader."""
        changed = self._eval_dataloader_idx != dataloader_idx
        self._eval_dataloader_idx = dataloader_idx
        return changed

    def reset_dataloader_idx_tracker(self) -> None:
        """Forget the evaluation loader, so the next evaluation's first batch starts a new task."""
        self._eval_dataloader_idx = None

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """Batches of the validation (or sanity check) loader being run (``inf`` for one without a length)."""
        trainer = self.trainer
        counts = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        return _count_of(counts, self._eval_dataloader_idx)

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        return _count_of(self.trainer.num_test_batches, self._eval_dataloader_idx)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        return _count_of(self.trainer.num_predict_batches, self._eval_dataloader_idx)

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def enable(self) -> None:
        """Draw again after ``disable()`` (from the next run on)."""
        self._enabled = True

    def disable(self) -> None:
        """Draw nothing (from the next run on); the Trainer's ``enable_progress_bar=False`` leaves the bar out."""
        self._enabled = False

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """``print`` that does not break a bar being drawn (``tqdm.write`` above it); a plain ``print`` when no bar
        is drawn. ``TrainModule.print`` goes through here while this bar is enabled, as in Lightning."""
        drawn = next((p.bar for p in (self._train, self._eval) if p is not None and p.bar is not None), None)
        if drawn is None:
            print(*args, sep=sep, **kwargs)
            return
        drawn.write(sep.join(map(str, args)), **kwargs)

    def get_metrics(self, trainer: TrainerView, pl_module: torch.nn.Module | None) -> dict[str, Any]:
        """What the bar shows: the first logger's version as ``v_num`` (its last 4 characters when a string), as
        Lightning, then the ``prog_bar=True`` metrics as numbers (a metric named ``v_num`` wins); override to
        change it."""
        shown: dict[str, Any] = {}
        loggers = trainer.loggers
        version = getattr(loggers[0], "version", None) if loggers else None
        if version not in ("", None):
            shown["v_num"] = version[-4:] if isinstance(version, str) else version
        shown.update(trainer.progress_bar_metrics)
        return shown

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        if not trainer.is_global_zero:
            self.disable()  # only the main process draws (Lightning turns the others' bars off for good)
        self._trainer_ref = weakref.ref(trainer)
        self._module_ref = weakref.ref(pl_module)
        self._stream = self._given_stream or sys.stdout
        self._active = trainer.is_global_zero and self.refresh_rate > 0 and self._enabled
        isatty = getattr(self._stream, "isatty", None)
        self._terminal = self._active and callable(isatty) and bool(isatty())
        self._in_fit = stage == "fit"

    def teardown(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        self._close_all()

    def on_exception(self, trainer: TrainerView, pl_module: torch.nn.Module,
                     exception: BaseException) -> None:
        self._close_all()

    # -- training ---------------------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        # From 0, as current_epoch, checkpoint names and resume messages: one numbering everywhere.
        limit = trainer.max_epochs
        epochs = f"/{limit - 1}" if limit is not None and limit >= 0 else ""
        self._train = self._start(f"Epoch {trainer.current_epoch}{epochs}", trainer.num_training_batches,
                                  leave=True, position=0)
        self._first_batch = trainer.state.batch_in_epoch  # batches of this epoch done before a resume

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        progress = self._train
        if progress is not None and progress.bar is None:
            progress.count += 1  # no bar to draw (not a terminal): just count, this runs on every batch
        else:
            self._advance(progress, trainer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        progress, self._train = self._train, None
        if progress is not None:
            if progress.bar is None:
                progress.count = trainer.state.batch_in_epoch - self._first_batch
            self._finish(progress, trainer, f"{progress.count} batches, step {trainer.global_step}", metrics=True)

    # -- evaluation -------------------------------------------------------------------------------------------
    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        sanity = trainer.sanity_checking
        self._start_eval("Sanity check" if sanity else "Validation",
                         trainer.num_sanity_val_batches if sanity else trainer.num_val_batches)

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module,
                                outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._advance(self._eval, trainer)

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._finish_eval(trainer, metrics=True)

    def on_test_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._start_eval("Test", trainer.num_test_batches)

    def on_test_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module,
                          outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._advance(self._eval, trainer)

    def on_test_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._finish_eval(trainer, metrics=True)

    def on_predict_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._start_eval("Predict", trainer.num_predict_batches)

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module,
                             outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        self._advance(self._eval, trainer)

    def on_predict_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._finish_eval(trainer, metrics=False)

    # -- drawing ----------------------------------------------------------------------------------------------
    def _start(self, name: str, total: int | None, leave: bool, position: int) -> _Progress | None:
        if not self._active:
            return None
        return _Progress(name, total, self._stream if self._terminal else None, leave, position)

    def _start_eval(self, name: str, counts: list[int | None]) -> None:
        total = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
        # Inside fit the evaluation bar sits under the epoch bar and disappears when done.
        self._eval = self._start(name, total, leave=not self._in_fit, position=1 if self._in_fit else 0)

    def _finish_eval(self, trainer: TrainerView, metrics: bool) -> None:
        progress, self._eval = self._eval, None
        if progress is None:
            return
        if self._in_fit and not self._terminal:
            return  # inside fit, the epoch line carries the validation metrics
        self._finish(progress, trainer, f"{progress.count} batches", metrics)

    def _advance(self, progress: _Progress | None, trainer: TrainerView) -> None:
        if progress is None:
            return
        progress.count += 1
        if progress.bar is None or progress.count % self.refresh_rate:
            return
        progress.bar.update(self.refresh_rate)
        now = time.monotonic()
        if now - self._last_metrics >= self.metrics_interval_s:
            self._last_metrics = now
            progress.bar.set_postfix(self._shown(trainer), refresh=False)

    def _shown(self, trainer: TrainerView) -> dict[str, str]:
        module = self._module_ref() if self._module_ref is not None else None
        return format_metrics(self.get_metrics(trainer, module))

    def _finish(self, progress: _Progress, trainer: TrainerView, summary: str, metrics: bool) -> None:
        shown = self._shown(trainer) if metrics else {}
        if progress.bar is not None:
            progress.bar.set_postfix(shown, refresh=True)
            progress.close()
            return
        self._write_line(progress.name, summary, time.monotonic() - progress.started, shown)

    def _write_line(self, name: str, summary: str, seconds: float, shown: dict[str, str]) -> None:
        """The one line a finished epoch (or standalone run) writes when the stream is not a terminal."""
        parts = [f"{name}: {summary}, {seconds:.1f}s", *(f"{k}={v}" for k, v in shown.items())]
        print(", ".join(parts), file=self._stream, flush=True)

    def _close_all(self) -> None:
        for progress in (self._eval, self._train):
            if progress is not None:
                progress.close()
        self._train = self._eval = None


def format_metrics(metrics: dict[str, Any]) -> dict[str, str]:
    """The metrics as one progress line shows them (floats to 4 significant digits)."""
    return {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in metrics.items()}


def _count_of(counts: list[int | None], index: int | None) -> int | float:
    count = counts[index or 0] if counts else 0
    return float("inf") if count is None else count
