"""ModelCheckpoint: top-k and last rotation, its state across a resume, fresh monitored values, bad arguments."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from callbacks.exceptions import MisconfigurationException
from tests.trainer.helpers import QUIET, SAVING, Regressor, data
from trainer import Trainer

NOISY = [0.30, 0.55, 0.41, 0.62, 0.18, 0.60, 0.35, 0.71, 0.05, 0.58]  # one value per epoch


class Noisy(Regressor):
    """Logs a noisy validation score that depends only on the epoch (so a resumed run logs the same)."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/score", NOISY[self.trainer.current_epoch])


def _fit(directory: str, max_epochs: int, ckpt_path: str | None = None, **checkpoint: Any) -> ModelCheckpoint:
    callback = ModelCheckpoint(dirpath=directory, **checkpoint)
    trainer = Trainer(**SAVING, max_epochs=max_epochs, callbacks=[callback], seed=0)
    trainer.fit(Noisy(), data(n=8), data(n=4), ckpt_path=ckpt_path)
    return callback


def _names(paths: Any) -> list[str]:
    return sorted(os.path.basename(p) for p in paths)


def test_top_k_and_last_keep_exactly_the_k_best_and_the_last(tmp_path: Any) -> None:
    options = {"filename": "epoch={epoch}-step={step}-{val/score:.2f}", "monitor": "val/score", "mode": "max",
               "save_top_k": 3, "save_last": True}
    callback = _fit(str(tmp_path), len(NOISY), **options)
    best = sorted(range(len(NOISY)), key=lambda e: -NOISY[e])[:3]  # epochs 7, 3, 5
    expected = {f"epoch={e}-step={2 * (e + 1)}-val_score={NOISY[e]:.2f}.ckpt" for e in best}
    last = "last.ckpt"  # a complete checkpoint of the newest position, as Lightning's save_last=True writes
    assert sorted(os.listdir(tmp_path)) == sorted(expected | {last})  # "/" became "_": one folder each
    assert _names(callback.best_k_models) == sorted(expected)
    assert os.path.basename(callback.best_model_path) == "epoch=7-step=16-val_score=0.71.ckpt"
    assert float(callback.best_model_score) == pytest.approx(0.71)  # type: ignore[arg-type]
    assert os.path.basename(callback.last_model_path) == last
    assert os.path.basename(callback.kth_best_model_path).startswith("epoch=5-")

    # Stopped after 6 epochs and resumed with ckpt_path="last": the same folders and bookkeeping at the end.
    resumed_dir = str(tmp_path / "resumed")
    _fit(resumed_dir, 6, **options)
    resumed = _fit(resumed_dir, len(NOISY), ckpt_path="last", **options)
    assert sorted(os.listdir(resumed_dir)) == sorted(expected | {last})
    assert _names(resumed.best_k_models) == _names(callback.best_k_models)
    assert os.path.basename(resumed.best_model_path) == os.path.basename(callback.best_model_path)
    assert os.path.basename(resumed.last_model_path) == last


def test_without_monitor_the_newest_is_kept(tmp_path: Any) -> None:
    callback = _fit(str(tmp_path), 3)
    assert os.listdir(tmp_path) == ["epoch=2-step=6.ckpt"] and callback.last_model_path == ""  # no save_last
    assert os.path.basename(callback.best_model_path) == "epoch=2-step=6.ckpt"
    keep_all = _fit(str(tmp_path / "all"), 3, save_top_k=-1)
    assert sorted(os.listdir(tmp_path / "all")) == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt",
                                                    "epoch=2-step=6.ckpt"]
    assert keep_all.best_model_score is None


class StepScore(Regressor):
    """Its validation metric is the global step at which the validation ran."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/step", float(self.trainer.global_step))


def test_a_step_checkpoint_is_taken_after_that_steps_validation(tmp_path: Any) -> None:
    callback = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/step", mode="max", save_top_k=-1,
                               every_n_train_steps=2)
    Trainer(**SAVING, max_epochs=1, val_check_interval=2, callbacks=[callback]).fit(StepScore(), data(n=32),
                                                                                    data(n=4))
    scores = {os.path.basename(p): float(s) for p, s in callback.best_k_models.items()}
    # Each value is from its own step's validation (8 steps, validated every 2): never the previous one.
    assert scores == {f"epoch=0-step={s}.ckpt": float(s) for s in (2, 4, 6, 8)}


def test_a_stale_validation_value_is_never_ranked(tmp_path: Any) -> None:
    callback = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/step", mode="max", save_top_k=-1,
                               every_n_train_steps=1, save_last=True)
    with pytest.warns(UserWarning, match="no validation ran at step 1, so its checkpoint is not ranked"):
        Trainer(**SAVING, max_epochs=1, val_check_interval=2, callbacks=[callback]).fit(StepScore(), data(n=16),
                                                                                        data(n=4))
    assert sorted(float(s) for s in callback.best_k_models.values()) == [2.0, 4.0]
    assert os.path.basename(callback.last_model_path) == "last.ckpt"  # the newest position, step 4
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]


def test_last_finds_the_newest_checkpoint_in_a_custom_dirpath(tmp_path: Any) -> None:
    first = Trainer(**SAVING, max_epochs=2, project_dir=str(tmp_path / "project"),
                    callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "elsewhere"), save_top_k=-1)])
    first.fit(Regressor(), data(n=8))
    again = Trainer(**SAVING, max_epochs=3, project_dir=str(tmp_path / "project"),
                    callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "elsewhere"), save_top_k=-1)])
    again.fit(Regressor(), data(n=8), ckpt_path="last")
    assert again.global_step == 6 and again.checkpoint_callback is not None
    assert os.path.basename(again.checkpoint_callback.best_model_path) == "epoch=2-step=6.ckpt"


def test_a_monitor_that_is_never_logged_names_the_logged_metrics(tmp_path: Any) -> None:
    callback = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/acc")
    with pytest.raises(MisconfigurationException, match=r"monitor='val/acc'\)` could not find the monitored key in "
                                                        r"the returned metrics: \['epoch', 'step', 'train/loss', "
                                                        r"'val/loss'\]"):
        Trainer(**SAVING, max_epochs=2, callbacks=[callback]).fit(Regressor(), data(n=8), data(n=4))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "maximum"}, r"mode='maximum'\): `mode` can be min, max but got maximum"),
    ({"save_top_k": -2}, r"Invalid value for save_top_k=-2. Must be >= -1"),
    ({"save_top_k": 3}, r"ModelCheckpoint\(save_top_k=3, monitor=None\) is not a valid configuration. No quantity"),
    ({"every_n_train_steps": 5, "every_n_epochs": 1}, (r"Combination of parameters every_n_train_steps=5, "
                                                      r"every_n_epochs=1 and train_time_interval=None should be")),
    ({"train_time_interval": -1}, r"train_time_interval=...\) must be a timedelta or number of seconds >= 0"),
    ({"every_n_epochs": 1.5}, r"Invalid value for every_n_epochs=1.5. Must be >= 0"),
])
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(MisconfigurationException, match=message):
        ModelCheckpoint(**kwargs)


def test_filename_templates() -> None:
    callback = ModelCheckpoint(dirpath="/ckpt", filename="{epoch:02d}-{val/acc:.3f}-loss={loss:.1f}")
    assert callback.format_checkpoint_name({"epoch": 3, "val/acc": torch.tensor(0.91234), "loss": 0.5}) == \
        "/ckpt/epoch=03-val_acc=0.912-loss=0.5.ckpt"
    assert callback.format_checkpoint_name({"epoch": 3, "val/acc": 0.5, "loss": 1.0}, ver=2) == \
        "/ckpt/epoch=03-val_acc=0.500-loss=1.0-v2.ckpt"
    # A name that was not logged is 0 (Lightning's rule), with a warning naming it.
    with pytest.warns(UserWarning, match=r"uses \{val/acc\}, which was not logged; it is written as 0"):
        assert callback.format_checkpoint_name({"epoch": 3, "loss": 1.0}) == "/ckpt/epoch=03-val_acc=0.000-loss=1.0.ckpt"
    plain = ModelCheckpoint(dirpath="/ckpt", filename="{epoch}-{step}", auto_insert_metric_name=False)
    assert plain.format_checkpoint_name({"epoch": 1, "step": 7}) == "/ckpt/1-7.ckpt"
    assert plain.format_checkpoint_name({"epoch": 1}, filename="last", prefix="exception") == "/ckpt/exception-last.ckpt"


def test_train_time_interval_saves_once_per_interval(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # As Lightning 2.6 (test_model_checkpoint_train_time_interval): each save starts the next interval. A clock
    # that advances 7 s per read (one read at train start, one per batch): 32 batches, a save every 63 s.
    import datetime
    import types

    import callbacks.checkpoint as checkpoint_module

    reads = iter(range(1000))
    monkeypatch.setattr(checkpoint_module, "time", types.SimpleNamespace(monotonic=lambda: 7.0 * next(reads)))
    callback = ModelCheckpoint(dirpath=str(tmp_path), filename="{epoch}-{step}",
                               train_time_interval=datetime.timedelta(minutes=1), save_top_k=-1)
    Trainer(**SAVING, max_epochs=2, callbacks=[callback]).fit(Regressor(), data(n=64, batch_size=4))
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=9.ckpt", "epoch=1-step=18.ckpt", "epoch=1-step=27.ckpt"]


def test_a_zero_train_time_interval_saves_at_every_step(tmp_path: Any) -> None:
    """As Lightning: timedelta(0) is accepted, and every training step is then due (no epoch-end schedule)."""
    import datetime

    callback = ModelCheckpoint(dirpath=str(tmp_path), filename="{step}", save_top_k=-1,
                               train_time_interval=datetime.timedelta(0))
    Trainer(**SAVING, max_epochs=1, callbacks=[callback]).fit(Regressor(), data(n=16, batch_size=4))
    assert sorted(os.listdir(tmp_path)) == [f"step={n}.ckpt" for n in (1, 2, 3, 4)]


def test_save_last_link_needs_a_local_dirpath() -> None:
    # Lightning 2.6 (test_model_checkpoint_save_last_as_link_not_local): a URL dirpath with save_last="link"
    # raises its ValueError at setup (a symbolic link needs a local folder).
    callback = ModelCheckpoint(dirpath="memory://not-a-filesystem-path", save_last="link")
    with pytest.raises(ValueError, match="save_last='link'.* is only supported for local file paths"):
        callback.setup(trainer=Trainer(**QUIET), pl_module=Regressor(), stage="fit")


def test_a_resume_into_another_dirpath_never_deletes_the_earlier_runs_checkpoints(tmp_path: Any) -> None:
    """As Lightning: the restored last_model_path names the earlier folder's last.ckpt; it stays."""
    old, new = tmp_path / "checkpoints", tmp_path / "new"
    options = {"save_last": True, "save_top_k": -1, "every_n_train_steps": 2, "filename": "{step}"}
    Trainer(**{**SAVING, "max_epochs": 1, "callbacks": [ModelCheckpoint(dirpath=old, **options)]}).fit(
        Regressor(), data())
    assert set(os.listdir(old)) == {"last.ckpt", "step=2.ckpt", "step=4.ckpt"}
    with pytest.warns(UserWarning, match="dirpath has changed"):
        Trainer(**{**SAVING, "max_epochs": 2, "callbacks": [ModelCheckpoint(dirpath=new, **options)]}).fit(
            Regressor(), data(), ckpt_path=str(old / "step=2.ckpt"))
    assert set(os.listdir(old)) == {"last.ckpt", "step=2.ckpt", "step=4.ckpt"}
    assert {"last.ckpt", "step=8.ckpt"} <= set(os.listdir(new))


def test_a_monitor_missing_before_any_validation_warns_and_ranks_nothing(tmp_path: Any) -> None:
    # Lightning 2.6.6: the error only once a validation ran (every metric was logged by then); before, a warning.
    callback = ModelCheckpoint(dirpath=str(tmp_path), monitor="global_step")
    with pytest.warns(UserWarning, match=r"monitor='global_step'\)` could not find the monitored key.*not ranked"):
        Trainer(**SAVING, max_steps=1, callbacks=[callback]).fit(Regressor(), data(n=8))
    assert callback.best_model_path == ""
