"""The built-in callbacks name the close match of a mistyped keyword (the Trainer's: tests/trainer/test_facade.py)."""

from __future__ import annotations

import pytest
from torch.optim.swa_utils import get_ema_avg_fn

from callbacks import (
    EarlyStopping,
    EMAWeightAveraging,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    StochasticWeightAveraging,
    WeightAveraging,
)


@pytest.mark.parametrize(("make", "typo", "meant"), [
    (lambda **kw: ModelCheckpoint(**kw), "save_top", "save_top_k"),
    (lambda **kw: ModelCheckpoint(**kw), "montior", "monitor"),
    (lambda **kw: ModelCheckpoint(**kw), "every_n_train_step", "every_n_train_steps"),
    (lambda **kw: EarlyStopping("val/loss", **kw), "patiance", "patience"),
    (lambda **kw: EarlyStopping("val/loss", **kw), "min_delt", "min_delta"),
    (lambda **kw: LearningRateMonitor(**kw), "logging_intervall", "logging_interval"),
    (lambda **kw: ProgressBar(**kw), "refresh_rat", "refresh_rate"),
    (lambda **kw: StochasticWeightAveraging(0.1, **kw), "swa_epoch_star", "swa_epoch_start"),
    (lambda **kw: EMAWeightAveraging(**kw), "decy", "decay"),
    # Keywords passed on to AveragedModel are checked when the callback is built, not when fit starts.
    (lambda **kw: WeightAveraging(**kw), "avg_func", "avg_fn"),
    (lambda **kw: EMAWeightAveraging(**kw), "update_every_n_step", "update_every_n_steps"),
])
def test_callbacks_name_the_close_match(make: object, typo: str, meant: str) -> None:
    with pytest.raises(TypeError) as caught:
        make(**{typo: 1})  # type: ignore[operator]
    name = str(caught.value).split("(", 1)[0]
    assert str(caught.value) == f"{name}() got an unexpected keyword argument {typo!r}. Did you mean {meant!r}?"


def test_weight_averaging_still_passes_averaged_model_keywords() -> None:
    assert WeightAveraging(avg_fn=get_ema_avg_fn(0.9))._kwargs.keys() == {"avg_fn"}
