"""EarlyStopping: when it stops, its checks on arguments and metrics, and its state across a resume."""

from __future__ import annotations

import math
from typing import Any

import pytest

from callbacks import EarlyStopping, EarlyStoppingReason
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer

SCORES = [1.0, 0.8, 0.79, 0.85, 0.9, 0.95, 0.5, 0.4]  # one validation value per epoch


class Scored(Regressor):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", SCORES[self.trainer.current_epoch])


def _fit(callback: EarlyStopping, max_epochs: int = len(SCORES), ckpt_path: str | None = None,
         **kwargs: Any) -> Trainer:
    trainer = Trainer(**QUIET, max_epochs=max_epochs, callbacks=[callback], **kwargs)
    trainer.fit(Scored(), data(n=8), data(n=4), ckpt_path=ckpt_path)
    return trainer


def test_stops_after_patience_checks_without_improvement() -> None:
    stop = EarlyStopping(monitor="val/loss", patience=3)
    trainer = _fit(stop)
    # 0.79 at epoch 2 is the best; epochs 3, 4, 5 do not improve: stop at the end of epoch 5.
    assert trainer.current_epoch == 6 and stop.stopped_epoch == 5 and stop.best_score == pytest.approx(0.79)
    assert stop.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert "did not improve in the last 3 records. Best score: 0.790" in (stop.stopping_reason_message or "")
    # min_delta: 0.79 is no real improvement on 0.8, so the patience runs out an epoch earlier.
    assert _fit(EarlyStopping(monitor="val/loss", patience=3, min_delta=0.05)).current_epoch == 5


def test_thresholds_and_non_finite_values() -> None:
    assert _fit(EarlyStopping(monitor="val/loss", stopping_threshold=0.85)).current_epoch == 2  # 0.8 < 0.85
    diverged = EarlyStopping(monitor="val/loss", divergence_threshold=0.92, patience=9)
    assert _fit(diverged).current_epoch == 1 and diverged.stopping_reason is EarlyStoppingReason.DIVERGENCE_THRESHOLD
    assert "Divergence threshold reached: val/loss = " in str(diverged.stopping_reason_message)
    stop = EarlyStopping(monitor="val/loss")
    assert stop._evaluate(math.nan) == (True, ("Monitored metric val/loss = nan is not finite. Previous best value was "
                                              "inf. Signaling Trainer to stop."))
    assert stop.stopping_reason is EarlyStoppingReason.NON_FINITE_METRIC
    assert EarlyStopping(monitor="val/loss", check_finite=False)._evaluate(math.nan)[0] is False


def test_state_survives_a_resume(tmp_path: Any) -> None:
    first = EarlyStopping(monitor="val/loss", patience=3)
    trainer = _fit(first, max_epochs=4)  # epochs 3 did not improve: wait_count 1
    path = str(tmp_path / "ckpt")
    trainer.save_checkpoint(path)
    resumed = EarlyStopping(monitor="val/loss", patience=3)
    assert _fit(resumed, ckpt_path=path).current_epoch == 6  # stops where the uninterrupted run stops
    assert resumed.best_score == pytest.approx(0.79) and resumed.stopped_epoch == 5


def test_a_missing_monitor_names_the_logged_metrics() -> None:
    with pytest.raises(RuntimeError, match=r"monitor='val/acc'\) found no such metric. Logged metrics: \['train/loss'"
                                           r", 'val/loss'\]"):
        _fit(EarlyStopping(monitor="val/acc"))
    with pytest.warns(UserWarning, match="skipping the check"):
        assert _fit(EarlyStopping(monitor="val/acc", strict=False), max_epochs=2).current_epoch == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"monitor": "m", "mode": "auto"}, r"mode='auto'\): `mode` can be min, max, got auto"),
    ({"monitor": ""}, r"monitor=...\) must be a logged metric name"),
    ({"monitor": "m", "patience": -1}, r"patience=...\) must be an int >= 0. Received: -1"),
    ({"monitor": "m", "min_delta": -0.1}, r"min_delta=...\) must be a number >= 0"),
])
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EarlyStopping(**kwargs)


class FlatLoss(Regressor):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("flat", 1.0)  # never improves: patience 1 stops after the second validation


def _fit_last(tmp_path: Any, patience: int = 1, early_stopping: bool = True) -> tuple[Trainer, Regressor]:
    from callbacks import ModelCheckpoint

    callbacks: list[Any] = [ModelCheckpoint(save_last=True)]
    if early_stopping:
        callbacks.insert(0, EarlyStopping(monitor="flat", patience=patience))
    trainer = Trainer(**{**QUIET, "enable_checkpointing": True}, project_dir=str(tmp_path), max_epochs=10,
                      callbacks=callbacks)
    module = FlatLoss()
    trainer.fit(module, data(), data(n=8), ckpt_path="last")
    return trainer, module


def test_a_run_early_stopping_ended_resumes_as_finished(tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    first, module = _fit_last(tmp_path)
    assert (first.current_epoch, first.global_step) == (2, 8)
    weights = [p.detach().clone() for p in module.parameters()]
    capsys.readouterr()
    again, resumed = _fit_last(tmp_path)
    # The uninterrupted run ended at step 8: the resumed one trains nothing (Lightning: one more epoch, step 12).
    assert (again.current_epoch, again.global_step) == (2, 8)
    assert all(bool((a == b).all()) for a, b in zip(weights, resumed.parameters()))
    out = capsys.readouterr().out
    assert "EarlyStopping stopped this run at epoch 1" in out and "resume without this EarlyStopping" in out
    # What the line says to do: without the callback, the run trains on to its own limits.
    more, _ = _fit_last(tmp_path, early_stopping=False)
    assert more.global_step == 40


def test_a_callback_reused_for_a_second_fit_without_a_resume_checks_again(tmp_path: Any) -> None:
    stop = EarlyStopping(monitor="flat", patience=1)
    trainer = Trainer(**QUIET, max_epochs=10, callbacks=[stop])
    trainer.fit(FlatLoss(), data(), data(n=8))
    assert trainer.global_step == 8
    trainer = Trainer(**QUIET, max_epochs=10, callbacks=[stop])  # its state says stopped, but nothing was restored
    trainer.fit(FlatLoss(), data(), data(n=8))
    assert trainer.global_step == 4  # one epoch: the carried-over wait count stops it at the first check, as Lightning
