"""``RichProgressBar`` and ``RichModelSummary``: the tasks, counts, metrics text and defaults that Lightning 2.6.6's
rich bar and summary show (observed with the real package), and the missing-rich errors."""

from __future__ import annotations

import io
import pickle
from typing import Any
from unittest import mock

import pytest
import torch

pytest.importorskip("rich")

from rich.console import Console

from callbacks import ModelSummary, RichModelSummary, RichProgressBar, RichProgressBarTheme
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class Shown(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, prog_bar=True)
        return loss


def _fit(bar: RichProgressBar, train: int, val: int, **kwargs: Any) -> Trainer:
    module = kwargs.pop("module", Shown())
    options = {**QUIET, "enable_progress_bar": True, "max_epochs": 1, "limit_train_batches": train,
               "limit_val_batches": val, "callbacks": [bar], **kwargs}
    trainer = Trainer(**options)
    trainer.fit(module, data(32), data(32))
    return trainer


def test_defaults_are_lightnings() -> None:
    bar = RichProgressBar()
    assert (bar.refresh_rate, bar.is_enabled, bar.progress) == (100, True, None)
    assert bar.theme == RichProgressBarTheme(description="", progress_bar="#6206E0", progress_bar_finished="#6206E0",
                                             progress_bar_pulse="#6206E0", batch_progress="", time="dim",
                                             processing_speed="dim underline", metrics="italic",
                                             metrics_text_delimiter=" ", metrics_format=".3f")
    assert RichProgressBar(refresh_rate=0).is_disabled


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_refresh_rate_is_named(bad: Any) -> None:
    with pytest.raises(ValueError, match=rf"refresh_rate=\.\.\.\) must be an int >= 0.*Received: {bad!r}"):
        RichProgressBar(refresh_rate=bad)


def test_without_rich_the_errors_name_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import callbacks.rich_model_summary
    import callbacks.rich_progress

    monkeypatch.setattr(callbacks.rich_progress, "_RICH_AVAILABLE", False, raising=False)
    monkeypatch.setattr(callbacks.rich_model_summary, "_RICH_AVAILABLE", False, raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"`RichProgressBar` requires `rich` >= 10.2.2.*pip install -U rich"):
        RichProgressBar()
    with pytest.raises(ModuleNotFoundError, match=r"`RichModelSummary` requires `rich`.*pip install -U rich"):
        RichModelSummary()


@pytest.mark.parametrize(("train", "val", "updates"), [(6, 6, 13), (2, 3, 6), (1, 0, 1), (5, 2, 8)])
def test_one_update_per_batch_and_one_to_hide_validation(train: int, val: int, updates: int) -> None:
    # Lightning's counts: one per batch, and one more that hides the validation task at its end.
    bar = RichProgressBar()
    with mock.patch("rich.progress.Progress.update", autospec=True, side_effect=None) as update:
        _fit(bar, train, val)
    assert update.call_count == updates


def test_tasks_of_a_fit_hold_their_counts() -> None:
    bar = RichProgressBar()
    _fit(bar, 7, 4, val_check_interval=2)
    assert bar.progress is not None
    train, first_val = bar.progress.tasks[0], bar.progress.tasks[1]
    assert (train.completed, train.total, train.visible) == (7, 7, True)
    assert (first_val.completed, first_val.total, first_val.visible) == (4, 4, False)
    assert len(bar.progress.tasks) == 4  # a validation task per validation run (at batches 2, 4 and 6)
    assert bar.train_progress_bar is train


def test_the_sanity_check_has_the_first_task() -> None:
    bar = RichProgressBar()
    _fit(bar, 1, 5, num_sanity_val_steps=3)
    assert bar.progress is not None
    sanity = bar.progress.tasks[0]
    assert (sanity.completed, sanity.total, sanity.visible) == (3, 3, False)
    assert sanity.description == "Sanity Checking"
    assert bar.progress.tasks[1].description == "Epoch 0/0 "  # padded to "Validation"'s width


@pytest.mark.parametrize("metrics_format", [".3f", ".3e"])
def test_the_training_task_shows_the_metrics_in_the_themes_format(metrics_format: str) -> None:
    bar = RichProgressBar(theme=RichProgressBarTheme(metrics_format=metrics_format))
    trainer = _fit(bar, 2, 1)
    assert bar.progress is not None and bar.train_progress_bar_id is not None
    rendered = bar.progress.columns[-1]._renderable_cache  # rich's cache of what the column drew last
    value = trainer.progress_bar_metrics["train_loss"]
    assert str(rendered[bar.train_progress_bar_id][1]) == f"train_loss: {value:{metrics_format}}"
    assert bar.val_progress_bar_id not in rendered  # hidden: not drawn


def test_leave_starts_a_display_per_epoch_and_otherwise_resets_the_task() -> None:
    with mock.patch("rich.progress.Progress.reset", autospec=True) as reset:
        _fit(RichProgressBar(leave=False), 1, 0, max_epochs=4)
    assert reset.call_count == 3
    with mock.patch("rich.progress.Progress.reset", autospec=True) as reset:
        _fit(RichProgressBar(leave=True), 1, 0, max_epochs=4)
    assert reset.call_count == 0


def test_a_disabled_bar_starts_no_display() -> None:
    bar = RichProgressBar()
    bar.disable()
    with mock.patch("callbacks.rich_progress.CustomProgress") as progress:
        _fit(bar, 2, 2)
    progress.assert_not_called()
    assert bar.train_progress_bar_id is None


def test_a_bar_pickles_before_and_after_each_run() -> None:
    bar = RichProgressBar()
    pickle.dumps(bar)
    trainer = _fit(bar, 1, 1)
    copy = pickle.loads(pickle.dumps(bar))
    assert copy.progress is None and copy.theme == bar.theme
    trainer.test(Shown(), data(8))
    pickle.dumps(bar)


def test_an_exception_stops_the_display_once() -> None:
    class Failing(Shown):
        def on_train_start(self) -> None:
            raise RuntimeError("boom")

    with mock.patch("callbacks.rich_columns.CustomProgress.stop", autospec=True) as stop, \
            pytest.raises(RuntimeError, match="boom"):
        _fit(RichProgressBar(), 1, 0, module=Failing())
    assert stop.call_count == 1


def test_a_rich_bar_brings_the_rich_summary() -> None:
    trainer = Trainer(callbacks=RichProgressBar(), log_with=None)
    summaries = [c for c in trainer.callbacks if isinstance(c, ModelSummary)]
    assert len(summaries) == 1 and isinstance(summaries[0], RichModelSummary)
    assert isinstance(trainer.progress_bar_callback, RichProgressBar)
    plain = Trainer(log_with=None)
    assert not any(isinstance(c, RichModelSummary) for c in plain.callbacks)


def test_the_rich_summary_prints_lightnings_table_and_totals() -> None:
    out = io.StringIO()
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    module[1].eval()
    with mock.patch("rich.get_console", return_value=Console(file=out, width=100)):
        RichModelSummary(max_depth=1).on_fit_start(mock.Mock(is_global_zero=True), module)
    text = out.getvalue()
    assert "┃ Name ┃ Type   ┃ Params ┃ Mode  ┃" in text
    assert "│ 0 │ 0    │ Linear │     15 │ train │" in text
    for line in ("Trainable params: 15", "Non-trainable params: 0", "Total params: 15",
                 "Total estimated model params size (MB): 0.000", "Modules in train mode: 1",
                 "Modules in eval mode: 1"):
        assert line in text


def test_the_rich_summary_formats_the_size_with_separators() -> None:
    out = io.StringIO()
    with mock.patch("rich.get_console", return_value=Console(file=out, width=100)):
        RichModelSummary.summarize([(" ", ["0"]), ("Name", ["layer"])], 1, 1, 5500.0, {"train": 1}, 0)
    assert "Total estimated model params size (MB): 5,500.000" in out.getvalue()
    assert "Total FLOPs: 0" in out.getvalue()


def test_a_trainer_set_through_lightnings_attribute_is_the_bars_trainer() -> None:
    # Lightning's ProgressBar keeps its trainer in `_trainer`; a subclass (or a test) may set it before any run.
    bar = RichProgressBar()
    trainer = mock.Mock(max_epochs=1)
    bar._trainer = trainer
    assert bar.trainer is trainer
    description = bar._get_train_description(current_epoch=0)
    assert "Epoch 0/0" in description and len(description) == len(bar.validation_description)
    bar._trainer = None
    with pytest.raises(RuntimeError, match="not attached to a Trainer"):
        _ = bar.trainer
