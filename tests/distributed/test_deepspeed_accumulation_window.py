"""DeepSpeed fixes the accumulation window when its engine is built, so GradientAccumulationScheduler is refused
under it (Lightning's words, observed in Lightning 2.6.6's source: `The `DeepSpeedStrategy` does not support
`accumulate_grad_batches` changing between epochs.`), before DeepSpeed initialises; other backends change the
window by epoch (tests/trainer/test_callbacks.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed tests need the deepspeed extra: pip install "
                                        "\"ember-train[deepspeed]\"")

from callbacks import GradientAccumulationScheduler
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.strategies import DeepSpeedStrategy


def _scheduled_deepspeed_fit() -> str:
    strategy = DeepSpeedStrategy(stage=2)
    strategy.config["zero_force_ds_cpu_optimizer"] = False
    trainer = Trainer(**QUIET, max_epochs=2, strategy=strategy,
                      callbacks=[GradientAccumulationScheduler({0: 1, 1: 2})])
    assert trainer.accelerator.backend.fixes_accumulation_at_setup
    try:
        trainer.fit(Regressor(), data())
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_a_changing_accumulation_window_is_refused_under_deepspeed(run_distributed: Any) -> None:
    for message in run_distributed(_scheduled_deepspeed_fit, 2):
        assert message.startswith("The `DeepSpeedStrategy` does not support `accumulate_grad_batches` changing "
                                  "between epochs."), message
        assert "Trainer(accumulate_grad_batches=N)" in message and "{0: 1, 1: 2}" in message
