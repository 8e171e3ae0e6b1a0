"""`TQDMProgressBar`: Lightning's tqdm progress bar, its live bar objects and their factories; `Tqdm`, the bars'
class (looked up here when a bar is made, so a test may replace it: ``mock.patch("callbacks.tqdm_progress.Tqdm")``).
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

import torch

from callbacks.progress import ProgressBar, format_metrics
from callbacks.protocols import TrainerView
from callbacks.tqdm_format import tqdm_class

if TYPE_CHECKING:
    from tqdm import tqdm


def __getattr__(name: str) -> Any:
    # ``Tqdm`` is made on first use (it imports tqdm); a test may replace it here (mock.patch) for every bar.
    if name == "Tqdm":
        return tqdm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_refresh_rate(refresh_rate: int) -> int:
    """Lightning's environment overrides of a bar's refresh rate: on Google Colab (``COLAB_GPU`` set) the default
    1 becomes 20 (faster redraws crash its notebooks); ``TQDM_MINITERS`` raises the rate to at least its value.

    Example:
        >>> resolve_refresh_rate(5)
        5
    """
    if os.environ.get("COLAB_GPU") and refresh_rate == 1:
        return 20
    miniters = os.environ.get("TQDM_MINITERS")
    if miniters is not None:
        try:
            return max(int(miniters), refresh_rate)
        except ValueError:
            raise ValueError(f"TQDM_MINITERS must be an int (the fewest batches between two redraws). Received: "
                             f"{miniters!r}; unset it or set e.g. TQDM_MINITERS=10.") from None
    return refresh_rate


class _Discard(io.StringIO):
    """Where the bars draw when the stream is not a terminal: they keep their counts, descriptions and metrics
    (what Lightning's bars hold), and the progress lines are written instead of bar redraws."""

    def write(self, text: str) -> int:
        return len(text)


def _make_bar(**kwargs: Any) -> tqdm:
    # Through this module, so that a ``Tqdm`` replaced here (mock.patch) makes every bar.
    bar: tqdm = sys.modules[__name__].Tqdm(**kwargs)
    return bar


def convert_inf(count: float | None) -> int | float | None:
    """A count as tqdm takes it: ``None`` for an unknown or infinite one (tqdm cannot show ``inf``).

    Example:
        >>> convert_inf(float("inf")) is None, convert_inf(4)
        (True, 4)
    """
    return None if count is None or math.isinf(count) or math.isnan(count) else count


class TQDMProgressBar(ProgressBar):
    """Lightning's tqdm progress bar: live ``Tqdm`` bars for training (``train_progress_bar``), validation and
    the sanity check (``val_progress_bar``), testing and predicting, made by the ``init_*_tqdm()`` factories a
    subclass overrides to change them.

    Every ``refresh_rate`` batches, and at a loader's last batch, a bar's ``n`` becomes the batches done; each
    epoch and each evaluation loader resets it (``total``, and a description such as ``"Epoch 3"`` or
    ``"Validation DataLoader 0"``). On a terminal the bars are drawn; elsewhere (a log file, CI) they are drawn
    into nothing and one line per training epoch (and per standalone validate / test / predict run) is written
    instead, e.g. ``Epoch 3/9: 120 batches, step 360, 4.2s, train/loss=0.1234``. The ``prog_bar=True`` metrics
    (one device sync to read them) become the training bar's postfix at each validation end and epoch end, and
    at its updates on a terminal at most every ``metrics_interval_s`` seconds (never off a terminal, where no one
    sees them).

    Args:
        refresh_rate: update the bars every N batches (0: no bar); raised by ``COLAB_GPU`` / ``TQDM_MINITERS`` as
            in Lightning (``resolve_refresh_rate``).
        process_position: offset the bars by ``2 * process_position`` lines (for bars drawn elsewhere too).
        leave: a new training bar per epoch, each left on screen (default: one bar reused by every epoch).
        stream: where to write (Ember's addition; default ``sys.stdout``).

    Example:
        >>> bar = TQDMProgressBar(refresh_rate=5)
        >>> bar.refresh_rate, bar.process_position, bar.is_enabled
        (5, 0, True)
    """

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False,
                 stream: IO[str] | None = None) -> None:
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 0:
            raise ValueError(f"TQDMProgressBar(refresh_rate=...) must be an int >= 0. Received: {refresh_rate!r}.")
        super().__init__(refresh_rate=resolve_refresh_rate(refresh_rate), stream=stream)
        if not isinstance(process_position, int) or isinstance(process_position, bool) or process_position < 0:
            raise ValueError(f"TQDMProgressBar(process_position=...) must be an int >= 0. Received: "
                             f"{process_position!r}.")
        self.process_position = process_position
        self.leave = leave
        self._train_progress_bar: tqdm | None = None
        self._val_progress_bar: tqdm | None = None
        self._test_progress_bar: tqdm | None = None
        self._predict_progress_bar: tqdm | None = None
        self._epoch_open = False  # this epoch's training bar was reset (a resume mid-epoch sees no epoch start)
        self._started = 0.0  # when the epoch (or standalone run) began, for its progress line
        self._eval_seen = 0  # evaluation batches of a standalone run, for its progress line

    def __getstate__(self) -> dict[str, Any]:
        # tqdm objects hold a lock and a stream: a copy has no bars until its next run makes them.
        state = super().__getstate__()
        state.update(_train_progress_bar=None, _val_progress_bar=None, _test_progress_bar=None,
                     _predict_progress_bar=None)
        return state

    @property
    def skipped_hooks(self) -> frozenset[str]:
        return frozenset()  # the bars count every batch, on a terminal or not (as Lightning's)

    # -- the bars -----------------------------------------------------------------------------------------------
    @property
    def train_progress_bar(self) -> tqdm:
        return self._bar(self._train_progress_bar, "train_progress_bar")

    @train_progress_bar.setter
    def train_progress_bar(self, bar: tqdm) -> None:
        self._train_progress_bar = bar

    @property
    def val_progress_bar(self) -> tqdm:
        return self._bar(self._val_progress_bar, "val_progress_bar")

    @val_progress_bar.setter
    def val_progress_bar(self, bar: tqdm) -> None:
        self._val_progress_bar = bar

    @property
    def test_progress_bar(self) -> tqdm:
        return self._bar(self._test_progress_bar, "test_progress_bar")

    @test_progress_bar.setter
    def test_progress_bar(self, bar: tqdm) -> None:
        self._test_progress_bar = bar

    @property
    def predict_progress_bar(self) -> tqdm:
        return self._bar(self._predict_progress_bar, "predict_progress_bar")

    @predict_progress_bar.setter
    def predict_progress_bar(self, bar: tqdm) -> None:
        self._predict_progress_bar = bar

    def _bar(self, bar: tqdm | None, name: str) -> tqdm:
        if bar is None:  # Lightning's error type, so ported code catching it still does
            raise TypeError(f"{type(self).__name__}.{name} is made when its loop first runs (and kept after it, "
                            f"until the next run of that loop); this bar has none yet.")
        return bar

    def _file(self) -> IO[str]:
        return self._stream if self._terminal else _Discard()

    def init_sanity_tqdm(self) -> tqdm:
        """The sanity check's bar (override to change it)."""
        return _make_bar(desc=self.sanity_check_description, position=2 * self.process_position,
                         disable=self.is_disabled, leave=False, dynamic_ncols=True, file=self._file(),
                         bar_format=self.BAR_FORMAT)

    def init_train_tqdm(self) -> tqdm:
        """The training bar (override to change it): made as training starts, and each epoch with ``leave``."""
        return _make_bar(desc=self.train_description, position=2 * self.process_position,
                         disable=self.is_disabled, leave=True, dynamic_ncols=True, file=self._file(), smoothing=0,
                         bar_format=self.BAR_FORMAT)

    def init_predict_tqdm(self) -> tqdm:
        """The prediction bar (override to change it)."""
        return _make_bar(desc=self.predict_description, position=2 * self.process_position,
                         disable=self.is_disabled, leave=True, dynamic_ncols=True, file=self._file(), smoothing=0,
                         bar_format=self.BAR_FORMAT)

    def init_validation_tqdm(self) -> tqdm:
        """The validation bar (override to change it): inside ``fit`` it sits under the training bar and
        disappears when done; a ``validate`` run's stays."""
        in_fit = self._in_fit
        return _make_bar(desc=self.validation_description, position=2 * self.process_position + in_fit,
                         disable=self.is_disabled, leave=not in_fit, dynamic_ncols=True, file=self._file(),
                         bar_format=self.BAR_FORMAT)

    def init_test_tqdm(self) -> tqdm:
        """The test bar (override to change it)."""
        return _make_bar(desc=self.test_description, position=2 * self.process_position,
                         disable=self.is_disabled, leave=True, dynamic_ncols=True, file=self._file(),
                         bar_format=self.BAR_FORMAT)

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """``print`` through the first bar still open (``tqdm.write``, which does not break a drawn bar); a plain
        ``print`` when none is."""
        for bar in (self._train_progress_bar, self._val_progress_bar, self._test_progress_bar,
                    self._predict_progress_bar):
            if bar is not None and not bar.disable:  # tqdm disables a bar it closes
                bar.write(sep.join(map(str, args)), **kwargs)
                return
        print(*args, sep=sep, **kwargs)

    # -- runs -------------------------------------------------------------------------------------------------
    def on_exception(self, trainer: TrainerView, pl_module: torch.nn.Module, exception: BaseException) -> None:
        # A run that ends normally has closed its bars in its end hooks; the references stay (as Lightning's),
        # so a test reads the last run's counts.
        self._close_bars()

    def _close_bars(self) -> None:
        for bar in (self._train_progress_bar, self._val_progress_bar, self._test_progress_bar,
                    self._predict_progress_bar):
            if bar is not None:
                bar.close()

    # -- training ---------------------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.val_progress_bar = self.init_sanity_tqdm()
        self.train_progress_bar = _make_bar(disable=True)  # none yet: the sanity check runs before training

    def on_sanity_check_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.val_progress_bar.close()
        self.train_progress_bar.close()

    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self._begin_epoch(trainer)

    def _begin_epoch(self, trainer: TrainerView) -> None:
        if self.leave or self._train_progress_bar is None:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.reset()  # then total, as Lightning: an overridden reset(total) sees None
        bar.total = convert_inf(self.total_train_batches)
        bar.initial = 0
        bar.set_description(f"Epoch {trainer.current_epoch}")
        self._epoch_open = True
        self._started = time.monotonic()
        self._first_batch = trainer.state.batch_in_epoch  # batches of this epoch done before a resume

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._epoch_open:  # resumed mid-epoch: no epoch start was seen
            self._begin_epoch(trainer)
        bar = self.train_progress_bar
        if self._update(bar, batch_idx + 1) and self._terminal:
            now = time.monotonic()
            if now - self._last_metrics >= self.metrics_interval_s:
                self._last_metrics = now
                bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        bar = self.train_progress_bar
        metrics = self.get_metrics(trainer, pl_module) if not bar.disable or self._lines() else {}
        if not bar.disable:
            bar.set_postfix(metrics)
        if self.leave:
            bar.close()
        self._epoch_open = False
        if self._lines():
            limit = trainer.max_epochs  # from 0, as current_epoch, checkpoint names and resume messages
            name = f"Epoch {trainer.current_epoch}" + (f"/{limit - 1}" if limit is not None and limit >= 0 else "")
            done = trainer.state.batch_in_epoch - self._first_batch
            self._write_line(name, f"{done} batches, step {trainer.global_step}", time.monotonic() - self._started,
                             format_metrics(metrics))

    def on_train_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.train_progress_bar.close()

    # -- evaluation -------------------------------------------------------------------------------------------
    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if not trainer.sanity_checking:
            self.val_progress_bar = self.init_validation_tqdm()
        self._begin_eval()

    def on_validation_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            sanity = trainer.sanity_checking
            self._reset(self.val_progress_bar, self.total_val_batches_current_dataloader,
                        self.sanity_check_description if sanity else self.validation_description, dataloader_idx)

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_seen += 1
        self._update(self.val_progress_bar, batch_idx + 1)

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if self._in_fit:  # the training bar shows the validation metrics; inside fit, so does the epoch line
            if self._train_progress_bar is not None:
                self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        else:
            self._end_eval("Validation", trainer, pl_module, metrics=True)

    def on_test_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.test_progress_bar = self.init_test_tqdm()
        self._begin_eval()

    def on_test_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            self._reset(self.test_progress_bar, self.total_test_batches_current_dataloader, self.test_description,
                        dataloader_idx)

    def on_test_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_seen += 1
        self._update(self.test_progress_bar, batch_idx + 1)

    def on_test_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.test_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        self._end_eval("Test", trainer, pl_module, metrics=True)

    def on_predict_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.predict_progress_bar = self.init_predict_tqdm()
        self._begin_eval()

    def on_predict_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module, batch: Any,
                               batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            self._reset(self.predict_progress_bar, self.total_predict_batches_current_dataloader,
                        self.predict_description, dataloader_idx)

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_seen += 1
        self._update(self.predict_progress_bar, batch_idx + 1)

    def on_predict_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        self.predict_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        self._end_eval("Predict", trainer, pl_module, metrics=False)

    # -- updating ---------------------------------------------------------------------------------------------
    def _lines(self) -> bool:
        # Not a terminal: one line per epoch (or standalone run) instead of bar redraws.
        return self._active and not self._terminal

    def _should_update(self, current: int, total: float | None) -> bool:
        """Every ``refresh_rate`` batches, and at the last one, so a bar never stops short of its total."""
        return self.is_enabled and (current % self.refresh_rate == 0 or current == total)

    def _update(self, bar: tqdm, current: int) -> bool:
        if bar.disable or not self._should_update(current, bar.total):
            return False
        bar.n = current
        if self._terminal:
            bar.refresh()  # off a terminal the bar draws into nothing: not worth formatting
        return True

    def _reset(self, bar: tqdm, total: float, description: str, dataloader_idx: int) -> None:
        bar.reset()
        bar.total = convert_inf(total)
        bar.initial = 0
        bar.set_description(f"{description} DataLoader {dataloader_idx}")

    def _begin_eval(self) -> None:
        self._started = time.monotonic()
        self._eval_seen = 0

    def _end_eval(self, name: str, trainer: TrainerView, pl_module: torch.nn.Module, metrics: bool) -> None:
        if self._lines() and not self._in_fit and not trainer.sanity_checking:
            shown = format_metrics(self.get_metrics(trainer, pl_module)) if metrics else {}
            self._write_line(name, f"{self._eval_seen} batches", time.monotonic() - self._started, shown)
