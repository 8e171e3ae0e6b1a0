"""Warnings Lightning 2.6 gives, in its words (observed), where Ember shares the behaviour they describe."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class Silent(Regressor):
    def predict_step(self, batch: Any, batch_idx: int) -> None:
        return None


def test_a_predict_step_returning_none_warns_once_a_run() -> None:
    trainer = Trainer(**QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.predict(Silent(), data(n=12, batch_size=4))  # three batches, one warning
    said = [str(w.message) for w in caught if "predict returned None" in str(w.message)]
    assert said == ["predict returned None if it was on purpose, ignore this warning..."]


class Counter(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches = state_dict["batches"]


def test_a_resume_without_a_callback_whose_state_was_saved_names_it(tmp_path: Path) -> None:
    first = Trainer(max_epochs=1, callbacks=[Counter()], **QUIET)
    first.fit(Regressor(), data())
    first.save_checkpoint(tmp_path / "one.ckpt")
    resumed = Trainer(max_epochs=2, **QUIET)
    with pytest.warns(UserWarning, match=r"callbacks used to create the checkpoint need to be provided during "
                                         r"`Trainer` instantiation. Please add the following callbacks: \['Counter'\]"):
        resumed.fit(Regressor(), data(), ckpt_path=tmp_path / "one.ckpt")
    again = Trainer(max_epochs=2, callbacks=[counter := Counter()], **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # every saved state has its callback: nothing to say
        again.fit(Regressor(), data(), ckpt_path=tmp_path / "one.ckpt")
    assert counter.batches == 8  # 4 restored + 4 of the second epoch
