"""`RichProgressBar`: Lightning's progress bar drawn with rich; `RichProgressBarTheme`, its styles.

rich is optional (``pip install rich``, or the ``rich`` extra): this module imports it only when a bar starts
drawing. The rich parts (``CustomProgress``, the columns, rich's ``Progress``) are names of this module, looked up
when used, so that a test may replace one here (``mock.patch("callbacks.rich_progress.CustomProgress")``), as
Lightning's tests do at Lightning's path.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from callbacks.progress import ProgressBar
from callbacks.protocols import TrainerView

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Task, TaskID

    from callbacks.rich_columns import CustomProgress, MetricsTextColumn

# The names this module lends from rich and from callbacks.rich_columns (imported on first use).
_RICH_NAMES = {"Progress": "rich.progress", "TextColumn": "rich.progress", "Console": "rich.console"}
_COLUMN_NAMES = ("CustomProgress", "CustomBarColumn", "BatchesProcessedColumn", "CustomTimeColumn",
                 "ProcessingSpeedColumn", "MetricsTextColumn")


def __getattr__(name: str) -> Any:
    if name == "_RICH_AVAILABLE":  # Lightning's flag; a test may set it False to see the missing-rich error
        return importlib.util.find_spec("rich") is not None
    if name in _RICH_NAMES:
        return getattr(importlib.import_module(_RICH_NAMES[name]), name)
    if name in _COLUMN_NAMES:
        return getattr(importlib.import_module("callbacks.rich_columns"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _part(name: str) -> Any:
    # Through the module, so that a name replaced here (mock.patch) is the one used.
    return getattr(sys.modules[__name__], name)


@dataclass
class RichProgressBarTheme:
    """The styles of ``RichProgressBar``'s parts (rich style strings or ``rich.style.Style``), Lightning's
    defaults; ``metrics_format`` formats the numbers shown, ``metrics_text_delimiter`` separates them.

    Example:
        >>> RichProgressBarTheme(metrics_format=".3e").metrics_format
        '.3e'
    """

    description: Any = ""
    progress_bar: Any = "#6206E0"
    progress_bar_finished: Any = "#6206E0"
    progress_bar_pulse: Any = "#6206E0"
    batch_progress: Any = ""
    time: Any = "dim"
    processing_speed: Any = "dim underline"
    metrics: Any = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(ProgressBar):
    """Lightning's rich progress bar: one rich ``Progress`` with a task per loop (sanity check, epoch,
    validation, test, predict) and the ``prog_bar=True`` metrics beside the training task.

    Args:
        refresh_rate: redraws per second at most (0: draw nothing), as Lightning's rich bar.
        leave: keep each finished epoch's bar on screen (a new display per epoch); by default one bar is reused.
        theme: the styles (``RichProgressBarTheme``).
        console_kwargs: keyword arguments of the ``rich.console.Console`` the bar draws on.

    Raises:
        ModuleNotFoundError: rich is not installed.

    Example:
        >>> bar = RichProgressBar(refresh_rate=10, leave=True)
        >>> bar.refresh_rate, bar.is_enabled, bar.progress is None
        (10, True, True)
    """

    def __init__(self, refresh_rate: int = 100, leave: bool = False, theme: RichProgressBarTheme | None = None,
                 console_kwargs: dict[str, Any] | None = None) -> None:
        if not _part("_RICH_AVAILABLE"):
            raise ModuleNotFoundError("`RichProgressBar` requires `rich` >= 10.2.2. Install it by running "
                                      "`pip install -U rich` (or `pip install ember-train[rich]`).")
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 0:
            raise ValueError(f"RichProgressBar(refresh_rate=...) must be an int >= 0 (redraws per second; 0 turns "
                             f"the bar off). Received: {refresh_rate!r}.")
        if theme is not None and not isinstance(theme, RichProgressBarTheme):
            raise TypeError(f"RichProgressBar(theme=...) takes a RichProgressBarTheme. Received: {theme!r}.")
        super().__init__(refresh_rate=refresh_rate)
        self._leave = leave
        self.theme = theme if theme is not None else RichProgressBarTheme()
        self._console_kwargs = dict(console_kwargs or {})
        self._console: Console | None = None
        self.progress: CustomProgress | None = None
        self._metric_component: MetricsTextColumn | None = None
        self._progress_stopped = False
        self.train_progress_bar_id: TaskID | None = None
        self.val_sanity_progress_bar_id: TaskID | None = None
        self.val_progress_bar_id: TaskID | None = None
        self.test_progress_bar_id: TaskID | None = None
        self.predict_progress_bar_id: TaskID | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The console and the live display hold locks and a thread: the next run draws on new ones.
        state = super().__getstate__()
        state.update(progress=None, _console=None, _metric_component=None)
        return state

    # -- the tasks ----------------------------------------------------------------------------------------------
    @property
    def train_progress_bar(self) -> Task:
        return self._task(self.train_progress_bar_id, "train_progress_bar")

    @property
    def val_sanity_check_bar(self) -> Task:
        return self._task(self.val_sanity_progress_bar_id, "val_sanity_check_bar")

    @property
    def val_progress_bar(self) -> Task:
        return self._task(self.val_progress_bar_id, "val_progress_bar")

    @property
    def test_progress_bar(self) -> Task:
        return self._task(self.test_progress_bar_id, "test_progress_bar")

    @property
    def predict_progress_bar(self) -> Task:
        return self._task(self.predict_progress_bar_id, "predict_progress_bar")

    def _task(self, task_id: TaskID | None, name: str) -> Task:
        if self.progress is None or task_id is None:
            raise RuntimeError(f"RichProgressBar.{name} exists while its loop runs (and after, until the next "
                               f"run starts); this bar has none now.")
        return self.progress.tasks[task_id]

    def configure_columns(self, trainer: TrainerView) -> list[Any]:
        """The columns left of the metrics; override to show others (the metrics column is always added)."""
        theme = self.theme
        return [_part("TextColumn")("[progress.description]{task.description}"),
                _part("CustomBarColumn")(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                                         pulse_style=theme.progress_bar_pulse),
                _part("BatchesProcessedColumn")(style=theme.batch_progress),
                _part("CustomTimeColumn")(style=theme.time),
                _part("ProcessingSpeedColumn")(style=theme.processing_speed)]

    def refresh(self, hard: bool = False) -> None:
        """Redraw now (``hard``) or at the refresh thread's next tick."""
        if self.progress is not None:
            if hard:
                self.progress.refresh()
            else:
                self.progress.soft_refresh()

    def get_metrics(self, trainer: TrainerView, pl_module: torch.nn.Module | None) -> dict[str, Any]:
        # Numbers, not tensors: the metrics are formatted in rich's drawing thread.
        return {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v
                for k, v in super().get_metrics(trainer, pl_module).items()}

    # -- runs -------------------------------------------------------------------------------------------------
    @property
    def skipped_hooks(self) -> frozenset[str]:
        return frozenset()  # rich draws in a file too: every batch moves the bar

    def _init_progress(self, trainer: TrainerView) -> None:
        """Start a display (with no tasks) unless one is running: the first hook of a run starts it."""
        if self.is_disabled or (self.progress is not None and not self._progress_stopped):
            return
        self.train_progress_bar_id = self.val_sanity_progress_bar_id = self.val_progress_bar_id = None
        self.test_progress_bar_id = self.predict_progress_bar_id = None
        theme = self.theme
        self._console = _part("Console")(**self._console_kwargs)
        self._metric_component = _part("MetricsTextColumn")(theme.metrics, theme.metrics_text_delimiter,
                                                            theme.metrics_format)
        self.progress = _part("CustomProgress")(*self.configure_columns(trainer), self._metric_component,
                                                auto_refresh=True, refresh_per_second=self.refresh_rate,
                                                console=self._console)
        self.progress.start()
        self._progress_stopped = False

    def _stop_progress(self) -> None:
        if self.progress is not None and not self._progress_stopped:
            self.progress.stop()
            self._progress_stopped = True  # the next run's first hook starts a new display

    def teardown(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        self._stop_progress()

    def on_exception(self, trainer: TrainerView, pl_module: torch.nn.Module, exception: BaseException) -> None:
        self._stop_progress()

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._init_progress(trainer)

    def on_sanity_check_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._init_progress(trainer)

    def on_sanity_check_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._hide(self.val_sanity_progress_bar_id)

    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._init_progress(trainer)

    def on_test_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._init_progress(trainer)

    def on_predict_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._init_progress(trainer)

    # -- training ---------------------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self.is_disabled:
            return
        if self.train_progress_bar_id is not None and self._leave:
            self._stop_progress()  # the finished epoch's bar stays on screen; this epoch gets a new display
            self._init_progress(trainer)
        description = self._get_train_description(trainer.current_epoch)
        if self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.reset(self.train_progress_bar_id, total=_rich_total(self.total_train_batches),
                                description=self._styled(description), visible=True)
        else:
            self._add_train_task(description)
        self.refresh()

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.is_enabled and self.train_progress_bar_id is None:  # resumed mid-epoch: no epoch start was seen
            self._add_train_task(self._get_train_description(trainer.current_epoch))
        self._update(self.train_progress_bar_id, batch_idx + 1)
        self._update_metrics(trainer, pl_module)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def _get_train_description(self, current_epoch: int) -> str:
        # Epochs from 0, as current_epoch; padded to the validation description's width so the bars line up.
        limit = self.trainer.max_epochs
        description = f"Epoch {current_epoch}" + (f"/{limit - 1}" if limit is not None and limit >= 0 else "")
        return description.ljust(len(self.validation_description))

    def _add_train_task(self, description: str) -> None:
        self.train_progress_bar_id = self._add_task(self.total_train_batches, description)
        if self._metric_component is not None:
            self._metric_component.train_task_id = self.train_progress_bar_id

    # -- evaluation -------------------------------------------------------------------------------------------
    def on_validation_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_val_batches_current_dataloader
        if trainer.sanity_checking:  # a task per loader; the previous loader's is hidden
            self._hide(self.val_sanity_progress_bar_id)
            self.val_sanity_progress_bar_id = self._add_task(total, self.sanity_check_description, visible=False)
        else:
            self._hide(self.val_progress_bar_id)
            self.val_progress_bar_id = self._add_task(total, self.validation_description, visible=False)

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        task = self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
        self._update(task, batch_idx + 1)

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._in_fit:  # inside fit the validation bar disappears when done; a validate run's stays
            self._hide(self.val_progress_bar_id)

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._in_fit:
            self._update_metrics(trainer, pl_module)
        self.reset_dataloader_idx_tracker()

    def on_test_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        self._hide(self.test_progress_bar_id)
        self.test_progress_bar_id = self._add_task(self.total_test_batches_current_dataloader,
                                                   self.test_description)

    def on_test_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._update(self.test_progress_bar_id, batch_idx + 1)

    def on_test_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.reset_dataloader_idx_tracker()

    def on_predict_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any,
                               batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        self._hide(self.predict_progress_bar_id)
        self.predict_progress_bar_id = self._add_task(self.total_predict_batches_current_dataloader,
                                                      self.predict_description)

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        self._update(self.predict_progress_bar_id, batch_idx + 1)

    def on_predict_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.reset_dataloader_idx_tracker()

    # -- drawing ----------------------------------------------------------------------------------------------
    def _styled(self, description: str) -> str:
        style = self.theme.description
        return f"[{style}]{description}" if style else description

    def _add_task(self, total: float, description: str, visible: bool = True) -> TaskID:
        if self.progress is None:
            raise RuntimeError("RichProgressBar has no display to add a task to: a run's first hook "
                               "(on_train_start, on_validation_start, ...) starts it.")
        return self.progress.add_task(self._styled(description), total=_rich_total(total), visible=visible)

    def _update(self, task_id: TaskID | None, current: int, visible: bool = True) -> None:
        if self.progress is not None and self.is_enabled and task_id is not None:
            self.progress.update(task_id, completed=current, visible=visible)
            self.refresh()

    def _hide(self, task_id: TaskID | None) -> None:
        if self.progress is not None and self.is_enabled and task_id is not None:
            self.progress.update(task_id, advance=0, visible=False)
            self.refresh()

    def _update_metrics(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self.is_enabled and self._metric_component is not None:
            self._metric_component.update(self.get_metrics(trainer, pl_module))


def _rich_total(total: float) -> float | None:
    # rich's "length unknown" is None (a pulsing bar, no time left); a loader without a length counts as inf here.
    return None if total == float("inf") else float(total)
