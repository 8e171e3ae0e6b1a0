"""A run folder is self-contained (promise 7): a copied, moved or elsewhere-started run writes only into itself."""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from callbacks import ModelCheckpoint
from tests.trainer.helpers import Regressor, data
from trainer import Trainer

SCORES = [0.30, 0.55, 0.41, 0.62, 0.18, 0.60]  # val/score by epoch: the best of epochs 0-1 is epoch 1


class Scored(Regressor):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/score", SCORES[self.trainer.current_epoch])


def _fit(project_dir: str | Path, max_epochs: int) -> tuple[Trainer, ModelCheckpoint]:
    checkpoint = ModelCheckpoint(monitor="val/score", mode="max", save_top_k=1, save_last=True,
                                 filename="epoch={epoch}-{val/score:.2f}")
    trainer = Trainer(max_epochs=max_epochs, seed=0, log_with=["csv", "tensorboard"], project_dir=str(project_dir),
                      project_name="logs", enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, log_every_n_steps=1, callbacks=[checkpoint])
    trainer.fit(Scored(), data(n=8), data(n=4), ckpt_path="last")
    trainer.accelerator.end_training()
    return trainer, checkpoint


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _steps(metrics_csv: Path) -> list[int]:
    rows = metrics_csv.read_text().splitlines()[1:]
    return [int(row.split(",")[0]) for row in rows if row.split(",")[0]]


def test_a_copied_run_resumed_from_another_directory_writes_only_into_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    _fit("runs/v0", max_epochs=2)  # a relative project_dir, as scripts pass it
    original = tmp_path / "a" / "runs" / "v0"
    before = _snapshot(original)
    assert any(name.startswith("logs/version_0/metrics.csv") for name in before)

    shutil.copytree(original, tmp_path / "copy")
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")  # a stray relative "runs/..." folder here would be a bug
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "dirpath differs; top-k bookkeeping not restored"
        trainer, checkpoint = _fit(tmp_path / "copy", max_epochs=4)

    assert _snapshot(original) == before  # the original run is byte for byte unchanged
    assert os.listdir(tmp_path / "b") == []
    copy_csv = tmp_path / "copy" / "logs" / "version_0" / "metrics.csv"
    steps = _steps(copy_csv)
    assert steps == sorted(steps) and steps[-1] == trainer.global_step == 8  # the copy's log continues
    assert _steps(original / "logs" / "version_0" / "metrics.csv")[-1] == 4
    assert len(list((tmp_path / "copy" / "logs").glob("events.out.tfevents.*"))) == 2  # the resumed writer's too
    # The top-k record survived the move: the best of all 4 epochs (epoch 3), in the copy, and only it is kept.
    assert checkpoint.best_model_path == str(tmp_path / "copy" / "checkpoints" / "epoch=3-val_score=0.62.ckpt")
    # The copy's own epoch-1 checkpoint was rotated out (the restored record knew it); the original's stays.
    assert sorted(os.listdir(tmp_path / "copy" / "checkpoints")) == ["epoch=3-val_score=0.62.ckpt", "last.ckpt"]
    assert sorted(os.listdir(original / "checkpoints")) == ["epoch=1-val_score=0.55.ckpt", "last.ckpt"]


def test_two_runs_in_one_project_never_share_a_log_file(tmp_path: Path) -> None:
    first, _ = _fit(tmp_path / "p", max_epochs=1)
    csv_first = first.accelerator.get_tracker("csv").metrics_path
    content = Path(csv_first).read_bytes()
    # A second, fresh run in the same project folder (no checkpoint to resume: the first one's were removed).
    shutil.rmtree(tmp_path / "p" / "checkpoints")
    second, _ = _fit(tmp_path / "p", max_epochs=1)
    csv_second = second.accelerator.get_tracker("csv").metrics_path
    assert csv_second != csv_first and Path(csv_first).read_bytes() == content
