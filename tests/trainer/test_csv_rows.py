"""The csv rows a Trainer writes: every row labelled with the epoch its values belong to, and the results of a
``test`` / ``validate`` call after ``fit`` in a row of their own (the digits demo's last training row once took
the test's epoch and values)."""

from __future__ import annotations

import csv
from pathlib import Path

from callbacks import LearningRateMonitor
from tests.trainer.helpers import Regressor, data
from trainer import Trainer


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_test_results_get_their_own_row_and_no_row_changes_its_epoch(tmp_path: Path) -> None:
    trainer = Trainer(max_epochs=2, log_with="csv", project_dir=str(tmp_path), log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      num_sanity_val_steps=0, callbacks=[LearningRateMonitor(logging_interval="step")])
    module = Regressor()
    trainer.fit(module, data(n=16, batch_size=4), data(n=8))  # 4 steps per epoch
    path = trainer.accelerator.get_tracker("csv").metrics_path
    after_fit = _rows(path)
    trainer.test(module, data(n=8), verbose=False)
    trainer.validate(module, data(n=8), verbose=False)
    rows = _rows(path)

    # The training rows are untouched by test/validate, which each add one row at the last step, epoch 2.
    assert [{k: r[k] for k in after_fit[0]} for r in rows[:len(after_fit)]] == after_fit  # (the file is wider)
    extra = rows[len(after_fit):]
    assert [(r["step"], r["epoch"], bool(r["test/loss"]), bool(r["val/loss"])) for r in extra] == [
        ("8", "2", True, False), ("8", "2", False, True)]
    assert not any(r["test/loss"] for r in rows[:len(after_fit)])
    # Each training value sits in a row of its own epoch: steps 1-4 are epoch 0, 5-8 epoch 1 (the learning rate
    # logged at step 4 before epoch 1's first batch is epoch 1's, in a row of its own).
    for row in after_fit:
        if row["train/loss"]:
            assert int(row["epoch"]) == (int(row["step"]) - 1) // 4, row
    at_4 = [(r["epoch"], bool(r["train/loss"]), bool(r["val/loss"]), bool(r["lr-SGD"])) for r in after_fit
            if r["step"] == "4"]
    assert at_4 == [("0", True, True, False), ("1", False, False, True)]
