"""Lightning's ``trainer.fit_loop`` / ``validate_loop`` / ``test_loop`` / ``predict_loop``, as read-only views.

Ember has no loop objects (``fit`` is one plain loop, DESIGN.md), but Lightning code reads a few of its loops'
public attributes: ``trainer.fit_loop.max_epochs``, ``fit_loop.epoch_progress.current.completed``,
``fit_loop.epoch_loop.val_loop.batch_progress.total.completed``, ``fit_loop.total_batch_idx`` ... Each view here
computes those values from their one owner when read (``TrainState`` for the training counters, the trainer's
limits for ``max_epochs`` & co., the evaluation loop's ``BatchCounts`` for evaluation batches), so nothing is
stored twice. Only ``max_epochs`` / ``max_steps`` may be assigned, as on the trainer (Lightning scripts raise
them before a second ``fit``), and the two counters Lightning code sets to move ``current_epoch`` and
``global_step`` (``OwnedCounts``: the assignment goes to ``TrainState``); every other attribute refuses assignment.

The progress counters follow what Lightning 2.6 reports at hook boundaries (recorded by
``tests/parity_scripts/record_loop_views.py``): ``ready`` / ``started`` count a batch (or epoch) once it has
begun, ``processed`` / ``completed`` once it has ended; ``total`` counts over the whole run, ``current`` since
the current epoch (batches) or this ``fit`` call (epochs) began.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.states import TrainerFn, TrainerStatus


@dataclass(frozen=True)
class ProgressCounts:
    """Lightning's ``ready`` / ``started`` / ``processed`` / ``completed`` counters, as a snapshot."""

    ready: int = 0
    started: int = 0
    processed: int = 0
    completed: int = 0


class OwnedCounts:
    """A counter read from its one owner (``TrainState``) whenever read; ``completed`` may be assigned and then
    sets that owner's counter. Lightning code moves ``trainer.current_epoch`` by setting
    ``fit_loop.epoch_progress.current.completed`` and ``trainer.global_step`` by setting
    ``fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total.completed``; the other three
    counters follow ``completed`` (nothing is half-done between two reads from outside the loop)."""

    def __init__(self, read: Callable[[], ProgressCounts], write: Callable[[int], None]) -> None:
        self._read, self._write = read, write

    @property
    def ready(self) -> int:
        return self._read().ready

    @property
    def started(self) -> int:
        return self._read().started

    @property
    def processed(self) -> int:
        return self._read().processed

    @property
    def completed(self) -> int:
        return self._read().completed

    @completed.setter
    def completed(self, value: int) -> None:
        self._write(value)

    def __eq__(self, other: object) -> bool:
        return self._read() == (other._read() if isinstance(other, OwnedCounts) else other)

    def __repr__(self) -> str:
        return repr(self._read())


@dataclass(frozen=True)
class Progress:
    """Lightning's ``Progress`` / ``BatchProgress``: the counters over the run (``total``) and now (``current``)."""

    total: ProgressCounts | OwnedCounts
    current: ProgressCounts | OwnedCounts
    is_last_batch: bool = False


class StepProgress:
    """Lightning's optimizer-step ``Progress``: ``total`` counts the steps over the run (``trainer.global_step``).
    Ember keeps no count of the steps within the current epoch, so there is no ``current``."""

    def __init__(self, total: OwnedCounts) -> None:
        self.total = total

    @property
    def current(self) -> ProgressCounts:
        raise AttributeError("Ember counts optimizer steps over the run only: read .total (trainer.global_step); "
                             "there is no per-epoch .current.")


@dataclass(frozen=True)
class OptimizerProgress:
    """Lightning's ``optim_progress.optimizer``: the optimizer steps (``step``)."""

    step: StepProgress


@dataclass(frozen=True)
class OptimizationProgress:
    """Lightning's ``automatic_optimization.optim_progress``."""

    optimizer: OptimizerProgress

    @property
    def optimizer_steps(self) -> int:
        return self.optimizer.step.total.completed


def _counts(done: int, open_: bool, ended: bool = False) -> ProgressCounts:
    """``done`` finished items, one more begun when ``open_``; ``ended``: that one has run, its end hooks not."""
    begun = done + int(open_)
    return ProgressCounts(ready=begun, started=begun, processed=done + int(open_ and ended), completed=done)


class _ReadOnly:
    """Refuses assignment of anything but the names in ``_settable`` (a view shows state; it owns none)."""

    _settable: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name in self._settable:
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"{type(self).__name__}.{name} is a read-only view of the trainer's state; it cannot "
                             f"be assigned (received {value!r}). Set the Trainer's keyword instead, e.g. "
                             "Trainer(max_epochs=...).")


def _step_counts(trainer: Any, automatic: bool) -> OwnedCounts:
    """``trainer.global_step`` as the step counter of automatic (or manual) optimisation; the other mode's reads 0
    and cannot be set, as Lightning's counts only the mode the module uses (automatic without a module)."""
    def active() -> bool:
        module = trainer.lightning_module
        return (module is None or bool(module.automatic_optimization)) == automatic

    def read() -> ProgressCounts:
        return _counts(trainer.state.global_step if active() else 0, False)

    def write(value: int) -> None:
        if not active():
            mode = "automatic" if automatic else "manual"
            raise AttributeError(f"The module does not use {mode} optimisation: set trainer.global_step through the "
                                 f"other mode's counter. Received: {value!r}.")
        trainer.state.global_step = int(value)

    return OwnedCounts(read, write)


class AutomaticOptimizationView(_ReadOnly):
    """``fit_loop.epoch_loop.automatic_optimization``: its ``optim_progress``."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def optim_progress(self) -> OptimizationProgress:
        return OptimizationProgress(OptimizerProgress(StepProgress(_step_counts(self._trainer, True))))


class ManualOptimizationView(_ReadOnly):
    """``fit_loop.epoch_loop.manual_optimization``: its ``optim_step_progress`` (the ``optimizer.step()`` calls)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def optim_step_progress(self) -> StepProgress:
        return StepProgress(_step_counts(self._trainer, False))


class EvaluationLoopView(_ReadOnly):
    """``trainer.validate_loop`` / ``test_loop`` / ``fit_loop.epoch_loop.val_loop`` / ``predict_loop``."""

    def __init__(self, trainer: Any, key: str) -> None:
        self._trainer = trainer
        self._key = key  # the BatchCounts key: "fit_validate", "validate", "test" or "predict"

    @property
    def batch_progress(self) -> Progress:
        counts = self._trainer.evaluation.batch_counts
        total, current, running, last = counts.read(self._key, fit_epoch(self._trainer))
        return Progress(_counts(total, running, ended=True), _counts(current, running, ended=True),
                        is_last_batch=last)

    @property
    def num_dataloaders(self) -> int:
        plan = self._trainer.plan
        loaders = {"fit_validate": plan.val_loaders, "validate": plan.val_loaders, "test": plan.test_loaders,
                   "predict": plan.predict_loaders}[self._key]
        return len(loaders)

    @property
    def inference_mode(self) -> bool:
        return bool(self._trainer.config.inference_mode)

    @property
    def predictions(self) -> list[Any]:
        """``predict_loop.predictions``: what the last ``predict`` returned (one list per loader when several)."""
        if self._key != "predict":
            raise AttributeError(f"trainer.{self._key}_loop has no predictions; only trainer.predict_loop has.")
        return self._trainer.evaluation.batch_counts.predictions


def fit_epoch(trainer: Any) -> int:
    """The training epoch a fit stands in: the one running, else the one the last fit ended in."""
    state = trainer.state
    running = state.fn == TrainerFn.FITTING and state.status == TrainerStatus.RUNNING and state.stage != "idle"
    if running and (state.batch_in_epoch > 0 or trainer.stop.reached(trainer.config) is None):
        return state.epoch
    if state.stopped_at is not None:
        return state.stopped_at[0]
    return max(state.epoch - 1, 0)


def in_epoch(trainer: Any) -> bool:
    """Whether a training epoch is in progress: fit is running, past ``on_train_start``, before its limit."""
    state = trainer.state
    if state.fn != TrainerFn.FITTING or state.status != TrainerStatus.RUNNING or state.stage not in ("train",
                                                                                                     "validate"):
        return False
    if trainer.metric_logger.in_epoch_hook and state.batch_in_epoch == 0:
        return False  # on_train_start / on_train_epoch_start: the epoch's first batch has not begun
    return trainer.stop.reached(trainer.config) is None or trainer.metric_logger.in_epoch_hook


def epoch_starting(trainer: Any) -> bool:
    """Whether a later epoch's ``on_train_epoch_start`` may run now: fit runs, between two epochs (at epoch 0 this
    cannot be told apart from ``on_train_start``, where Lightning counts no epoch yet)."""
    state = trainer.state
    return (state.fn == TrainerFn.FITTING and state.status == TrainerStatus.RUNNING and state.stage == "train"
            and trainer.metric_logger.in_epoch_hook and state.batch_in_epoch == 0 and state.epoch > 0
            and trainer.stop.reached(trainer.config) is None)


class EpochLoopView(_ReadOnly):
    """``trainer.fit_loop.epoch_loop``: the training batches of the current epoch and the optimizer steps."""

    _settable = ("max_steps",)

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def val_loop(self) -> EvaluationLoopView:
        """Fit's validation loop (``trainer.validate_loop`` is ``validate()``'s)."""
        return EvaluationLoopView(self._trainer, "fit_validate")

    @property
    def batch_progress(self) -> Progress:
        state, plan = self._trainer.state, self._trainer.plan
        open_ = state.batch_open
        done = self.batch_idx + 1 - int(open_)  # batches of this (or, between epochs, the last) epoch done
        last = plan.num_training_batches is not None and done == plan.num_training_batches and done > 0
        return Progress(_counts(state.micro_step, open_), _counts(done, open_), is_last_batch=last)

    @property
    def automatic_optimization(self) -> AutomaticOptimizationView:
        return AutomaticOptimizationView(self._trainer)

    @property
    def manual_optimization(self) -> ManualOptimizationView:
        return ManualOptimizationView(self._trainer)

    @property
    def global_step(self) -> int:
        return int(self._trainer.state.global_step)

    @property
    def total_batch_idx(self) -> int:
        """The index of the batch running now (or that last ran) over all epochs; -1 before the first."""
        state = self._trainer.state
        return state.micro_step - 1 + int(state.batch_open)

    @property
    def batch_idx(self) -> int:
        """The index of the batch running now (or that last ran) in its epoch; -1 before the first."""
        state, batches = self._trainer.state, self._trainer.plan.num_training_batches
        done = state.batch_in_epoch if state.stopped_at is None else state.stopped_at[1]
        if done == 0 and not state.batch_open and state.epoch > 0 and state.stopped_at is None and batches:
            return batches - 1  # between epochs: the last epoch's last batch
        return done - 1 + int(state.batch_open)

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps

    @max_steps.setter
    def max_steps(self, value: int) -> None:
        self._trainer.max_steps = value

    @property
    def min_steps(self) -> int | None:
        return self._trainer.min_steps

    @property
    def done(self) -> bool:
        return FitLoopView(self._trainer).done

    @property
    def restarting(self) -> bool:
        """Whether the fit resumed from the middle of an epoch and has not moved since (Lightning 2.6.6)."""
        return self._trainer.checkpointer.restarting(whole_epoch=False)


class FitLoopView(_ReadOnly):
    """``trainer.fit_loop``: the epoch limits, the epoch counters and ``epoch_loop``."""

    _settable = ("max_epochs", "max_steps")

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def epoch_loop(self) -> EpochLoopView:
        return EpochLoopView(self._trainer)

    @property
    def max_epochs(self) -> int | None:
        return self._trainer.max_epochs

    @max_epochs.setter
    def max_epochs(self, value: int) -> None:
        self._trainer.max_epochs = value

    @property
    def min_epochs(self) -> int:
        return self._trainer.min_epochs or 0  # Lightning's loop shows 0 where none was given

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps

    @max_steps.setter
    def max_steps(self, value: int) -> None:
        self._trainer.max_steps = value

    @property
    def min_steps(self) -> int | None:
        return self._trainer.min_steps

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch

    @property
    def total_batch_idx(self) -> int:
        return self.epoch_loop.total_batch_idx

    @property
    def batch_idx(self) -> int:
        return self.epoch_loop.batch_idx

    @property
    def epoch_progress(self) -> Progress:
        """The epochs; ``current.completed`` is ``trainer.current_epoch`` and setting it sets that (Lightning's
        ``current_epoch`` reads it), ``total`` is a snapshot."""
        trainer = self._trainer

        def write(value: int) -> None:
            trainer.state.epoch = int(value)

        return Progress(self._epoch_counts(), OwnedCounts(self._epoch_counts, write))

    def _epoch_counts(self) -> ProgressCounts:
        trainer = self._trainer
        running = in_epoch(trainer)
        ended = running and trainer.metric_logger.in_epoch_hook  # the epoch-end hooks are running
        counts = _counts(trainer.state.epoch, running, ended)
        if not running and epoch_starting(trainer):  # on_train_epoch_start: ready, not yet started
            counts = ProgressCounts(counts.ready + 1, counts.started, counts.processed, counts.completed)
        return counts

    @property
    def done(self) -> bool:
        """Whether training has reached a limit (``max_epochs``, ``max_steps``) or was asked to stop."""
        trainer = self._trainer
        no_batches = trainer.plan.train_source is not None and trainer.plan.num_training_batches == 0
        return no_batches or trainer.stop.reached(trainer.config) is not None or bool(trainer.should_stop)

    @property
    def restarting(self) -> bool:
        """Whether the fit resumed from the middle of an epoch and is still in it (Lightning 2.6.6)."""
        return self._trainer.checkpointer.restarting(whole_epoch=True)

    def state_dict(self) -> dict[str, Any]:
        """Lightning's ``fit_loop.state_dict()``: the ``loops["fit_loop"]`` entry Ember writes into its ``.ckpt``
        files, built from ``TrainState`` now (a snapshot: loading one is ``fit(ckpt_path=...)``'s job)."""
        from trainer.checkpoint.lightning_format import loops_of  # the checkpoint format: only when asked

        return loops_of(self._trainer.state.state_dict())["fit_loop"]
