"""ModelCheckpoint's Lightning-visible state and configuration rules: the saved current_score, and a
ModelCheckpoint given with checkpointing turned off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from callbacks.exceptions import MisconfigurationException
from tests.trainer.helpers import QUIET, SAVING, Regressor, data
from trainer import Trainer


class EpochScore(Regressor):
    """Logs (epoch + 1) / 10, a number float32 cannot hold exactly."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("foo", (self.current_epoch + 1) / 10)
        return super().training_step(batch, batch_idx)


def test_saved_current_score_compares_equal_to_the_logged_number(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="foo", save_top_k=3)
    Trainer(**SAVING, max_epochs=3, limit_train_batches=1, callbacks=[checkpoint]).fit(EpochScore(), data())
    scores = []
    for path in sorted(tmp_path.iterdir()):
        state = torch.load(path, weights_only=True)["callbacks"][checkpoint.state_key]
        assert isinstance(state["current_score"], torch.Tensor)  # a float of the float32 value is 0.10000000149
        scores.append(state["current_score"])
    assert sorted(scores) == [0.1, 0.2, 0.3]
    restored = ModelCheckpoint(dirpath=tmp_path, monitor="foo", save_top_k=3)
    first = min(tmp_path.iterdir())
    restored.load_state_dict(torch.load(first, weights_only=True)["callbacks"][checkpoint.state_key])
    assert restored.current_score == 0.1


def test_model_checkpoint_with_checkpointing_off_is_refused() -> None:
    with pytest.raises(MisconfigurationException, match="`enable_checkpointing=False` but found `ModelCheckpoint`"):
        Trainer(**QUIET, callbacks=[ModelCheckpoint(monitor="foo")])  # QUIET turns checkpointing off
    with pytest.raises(MisconfigurationException, match="barebones=True"):
        Trainer(barebones=True, callbacks=[ModelCheckpoint()])
    assert Trainer(**QUIET).checkpoint_callback is None
