"""The progress bar's Lightning surface: ``Tqdm`` and its padded numbers, the refresh rate's environment
overrides, pickling, ``v_num``, one bar per trainer, printing through the bar (values as Lightning 2.6.6's)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from callbacks import ProgressBar, TQDMProgressBar
from callbacks.exceptions import MisconfigurationException
from callbacks.tqdm_progress import Tqdm
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.loggers import CSVLogger


@pytest.mark.parametrize(("number", "shown"), [(1, "1"), (1.0, "1.000"), (0.1, "0.100"), (1e-3, "0.001"),
                                               (1e-5, "1e-5"), ("1.0", "1.000"), ("10000", "10000"),
                                               ("abc", "abc")])
def test_tqdm_pads_floats_and_strings_to_five_characters(number: Any, shown: str) -> None:
    assert Tqdm.format_num(number) == shown


@pytest.mark.parametrize(("rate", "miniters", "expected"), [(0, 1, 1), (1, 0, 1), (2, 1, 2), (1, 2, 2)])
def test_tqdm_miniters_raises_the_refresh_rate(monkeypatch: pytest.MonkeyPatch, rate: int, miniters: int,
                                               expected: int) -> None:
    monkeypatch.setenv("TQDM_MINITERS", str(miniters))
    assert TQDMProgressBar(refresh_rate=rate).refresh_rate == expected


def test_colab_raises_the_default_refresh_rate_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLAB_GPU", "1")
    assert TQDMProgressBar().refresh_rate == 20
    assert TQDMProgressBar(refresh_rate=19).refresh_rate == 19


def test_a_bar_pickles_before_and_after_a_run() -> None:
    bar = TQDMProgressBar()
    pickle.dumps(bar)
    Trainer(**{**QUIET, "enable_progress_bar": True, "max_epochs": 1, "callbacks": [bar]}).fit(Regressor(), data(), data())
    copy = pickle.loads(pickle.dumps(bar))
    assert copy.refresh_rate == bar.refresh_rate and copy.is_enabled


def test_bar_metrics_start_with_the_logger_version(tmp_path: Any) -> None:
    quiet = {k: v for k, v in QUIET.items() if k != "log_with"}
    trainer = Trainer(**{**quiet, "max_epochs": 1, "logger": CSVLogger(str(tmp_path))})
    module = Regressor()
    trainer.fit(module, data())
    bar = TQDMProgressBar()
    shown = bar.get_metrics(trainer, module)
    assert next(iter(shown)) == "v_num" and shown["v_num"] == trainer.logger.version == 0


def test_one_progress_bar_per_trainer() -> None:
    with pytest.raises(MisconfigurationException, match="^You added multiple progress bar callbacks"):
        Trainer(callbacks=[TQDMProgressBar(), ProgressBar()])
    with pytest.raises(MisconfigurationException, match="enable_progress_bar=False` but found `TQDMProgressBar"):
        Trainer(callbacks=[TQDMProgressBar()], enable_progress_bar=False)


def test_module_print_goes_through_an_enabled_bar(capsys: pytest.CaptureFixture[str]) -> None:
    printed: list[tuple[Any, ...]] = []

    class Bar(TQDMProgressBar):
        def print(self, *args: Any, **kwargs: Any) -> None:
            printed.append(args)
            super().print(*args, **kwargs)

    class Printing(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.print("step", batch_idx)
            return super().training_step(batch, batch_idx)

    bar = Bar()
    Trainer(**{**QUIET, "enable_progress_bar": True, "max_steps": 2, "callbacks": [bar]}).fit(Printing(), data())
    assert printed == [("step", 0), ("step", 1)]
    assert "step 0\nstep 1\n" in capsys.readouterr().out  # no bar drawn off a terminal: a plain print


def test_a_bar_on_another_process_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    bar = TQDMProgressBar()
    Trainer(**{**QUIET, "enable_progress_bar": True, "max_steps": 1, "callbacks": [bar]}).fit(Regressor(), data())
    assert bar.is_disabled
