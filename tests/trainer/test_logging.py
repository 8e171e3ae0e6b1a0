"""self.log: defaults, step / epoch values, batch-size weighting, reductions, and what reaches the trackers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from callbacks import Callback
from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data, fit
from trainer import Trainer, TrainModule


class LogsBatchIndex(Regressor):
    """Validation logs the batch index under several reductions (batch sizes 4, 4, 2 for 10 samples)."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        value = torch.tensor(float(batch_idx))
        self.log("mean", value)
        self.log("sum", value, reduce_fx="sum")
        self.log("max", value, reduce_fx=torch.max)
        self.log("min", value, reduce_fx="min")
        self.log("median", value, reduce_fx=lambda t: t.median())
        self.log("unweighted", value, batch_size=1)
        self.log("python", batch_idx)


def test_epoch_values_are_batch_size_weighted_with_an_uneven_last_batch() -> None:
    trainer = Trainer(**QUIET)
    [results] = trainer.validate(LogsBatchIndex(), data(n=10, batch_size=4), verbose=False)
    assert results["mean"] == pytest.approx((0 * 4 + 1 * 4 + 2 * 2) / 10)
    assert results["python"] == pytest.approx(0.8)
    assert results["unweighted"] == pytest.approx(1.0)
    assert (results["sum"], results["max"], results["min"], results["median"]) == (3.0, 2.0, 0.0, 1.0)
    assert isinstance(trainer.callback_metrics["mean"], torch.Tensor)


class StepLogger(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.losses.append(float(loss.detach()))
        self.log("both", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log("epoch_hook", 7.0)


def test_step_values_reach_trackers_every_n_steps_and_epoch_values_at_epoch_end() -> None:
    tracker = MemoryTracker()
    module = StepLogger()
    trainer = Trainer(**{**QUIET, "log_with": [tracker]}, max_epochs=1, log_every_n_steps=2)
    trainer.fit(module, data(n=20, batch_size=4))  # 5 batches = 5 steps
    assert tracker.logged("train/loss") == [(2, pytest.approx(module.losses[1])),
                                            (4, pytest.approx(module.losses[3]))]
    assert tracker.logged("both_step") == [(2, 1.0), (4, 3.0)]
    assert tracker.logged("both_epoch") == [(5, pytest.approx(2.0))]
    assert tracker.logged("epoch_hook") == [(5, 7.0)]  # on_train_epoch_end logs per epoch by default
    assert all(values["epoch"] == 0 for _, values in tracker.rows)
    assert tracker.config == {"lr": 0.05, "features": 3}  # save_hyperparameters() is the run configuration
    metrics = trainer.callback_metrics
    assert float(metrics["both"]) == pytest.approx(2.0) and float(metrics["both_step"]) == 4.0
    assert set(trainer.progress_bar_metrics) == {"both_step", "both_epoch"}
    assert isinstance(trainer.progress_bar_metrics["both_epoch"], float)
    assert isinstance(trainer.logged_metrics["both_epoch"], torch.Tensor)


def test_logging_keeps_tensors_until_the_interval_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_item, real_tolist = torch.Tensor.item, torch.Tensor.tolist

    def item(self: torch.Tensor) -> Any:
        events.append("item")
        return real_item(self)

    def tolist(self: torch.Tensor) -> Any:
        events.append("tolist")
        return real_tolist(self)

    class Marker(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            events.append("batch")

    monkeypatch.setattr(torch.Tensor, "item", item)
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    fit(Regressor(), data(n=32, batch_size=4), log_with=[MemoryTracker()], max_epochs=1, log_every_n_steps=4,
        callbacks=[Marker()])
    first, last = events.index("batch"), len(events) - 1 - events[::-1].index("batch")
    # 8 steps logged every 4: after step 4 the non-finite loss check (one item) and one host conversion (stack +
    # tolist), nothing per step.
    assert events[first:last + 1] == ["batch"] * 4 + ["item", "tolist"] + ["batch"] * 4


def test_sanity_check_metrics_are_dropped() -> None:
    tracker = MemoryTracker()
    trainer = fit(Regressor(), data(n=8), data(n=8), log_with=[tracker], max_epochs=1, num_sanity_val_steps=2,
                  check_val_every_n_epoch=2)
    assert "val/loss" not in trainer.callback_metrics
    assert tracker.logged("val/loss") == []


def test_several_validation_loaders_get_suffixed_names() -> None:
    trainer = Trainer(**QUIET)
    results = trainer.validate(LogsBatchIndex(), [data(n=8, batch_size=4), data(n=4, batch_size=4)],
                               verbose=False)
    assert results[0]["mean/dataloader_idx_0"] == pytest.approx(0.5)
    assert results[1]["mean/dataloader_idx_1"] == pytest.approx(0.0)
    assert "mean/dataloader_idx_1" not in results[0]


class Misuse(Regressor):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def on_fit_start(self) -> None:
        if self.how == "fit_start":
            self.log("x", 1.0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.how == "vector":
            self.log("v", torch.ones(3))
        elif self.how == "string":
            self.log("s", "high")
        elif self.how == "options":
            self.log("train/loss", loss, prog_bar=True)
        elif self.how == "reduce":
            self.log("r", loss, reduce_fx="median")
        elif self.how == "nothing":
            self.log("n", loss, on_step=False, on_epoch=False)
        return loss

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("p", 1.0)


@pytest.mark.parametrize("how, error, message", [
    ("fit_start", RuntimeError, r"self.log\('x', ...\) is not supported in this hook"),
    ("vector", ValueError, r"needs a scalar; got a tensor of shape \(3,\)"),
    ("string", TypeError, r"`self.log\(s, high\)` was called, but `str` values cannot be logged"),
    ("string", ValueError, r"takes a number or a one-element tensor"),  # Lightning raises ValueError
    ("options", ValueError, "'train/loss' was already logged in this stage with"),
    ("reduce", ValueError, r"reduce_fx='median'\): use one of"),
    ("nothing", ValueError, r"`self.log\(on_step=False, on_epoch=False\)` is not useful"),  # Lightning's text
])
def test_bad_log_calls(how: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        fit(Misuse(how), max_epochs=1)


def test_logging_in_predict_or_without_a_trainer_raises() -> None:
    with pytest.raises(RuntimeError, match="not supported in predict"):
        Trainer(**QUIET).predict(Misuse("none"), data(n=4))
    with pytest.raises(RuntimeError, match="not attached to a Trainer"):
        TrainModule().log("x", 1.0)


class LogsNumbers(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("n_step", 3)
        self.log("n_epoch", 2, on_epoch=True, on_step=False)
        self.log("f", 1.5, prog_bar=True)
        return super().training_step(batch, batch_idx)


def test_logged_numbers_become_float_tensors_as_in_lightning() -> None:
    # Lightning 2.6.6: callback_metrics holds float32 tensors for numbers logged as int or float (so .item()
    # works on every entry), the progress bar Python floats.
    trainer = fit(LogsNumbers(), data(n=8), max_epochs=1)
    for name, expected in (("n_step", 3.0), ("n_epoch", 2.0), ("f", 1.5)):
        value = trainer.callback_metrics[name]
        assert isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.item() == expected
    assert trainer.progress_bar_metrics["f"] == 1.5 and isinstance(trainer.progress_bar_metrics["f"], float)


class LogsInValidation(Regressor):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("b", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True)
        self.log("s", float(batch_idx), on_step=True, on_epoch=False, prog_bar=True)


def test_evaluation_step_values_stay_out_of_callback_metrics() -> None:
    # Lightning 2.6.6 (recorded on the same logging calls): during validation callback_metrics stays empty and the
    # bar shows b_step and s; afterwards callback_metrics holds b and b_epoch (0.5, the mean of 0 and 1) only.
    seen: list[tuple[list[str], list[str]]] = []

    class Peek(Callback):
        def on_validation_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            mine = [name for name in trainer.callback_metrics if not name.startswith("train/")]
            seen.append((sorted(mine), sorted(trainer.progress_bar_metrics)))

    trainer = fit(LogsInValidation(), data(n=8), data(n=8), max_epochs=1, limit_train_batches=2,
                  limit_val_batches=2, callbacks=[Peek()])
    assert seen == [([], ["b_step", "s"])] * 2
    mine = {k: float(v) for k, v in trainer.callback_metrics.items() if not k.startswith("train/")}
    assert mine == {"b": 0.5, "b_epoch": 0.5}
    assert sorted(trainer.progress_bar_metrics) == ["b_epoch", "b_step", "s"]


def test_fast_dev_run_logs_every_step() -> None:
    # As Lightning 2.6 (test_different_batch_types_for_sizing): a fast_dev_run logs each step's metrics, whatever
    # log_every_n_steps says, so trainer.logged_metrics holds the `_step` values too.
    class Logs(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("a", 2.0, on_step=True, on_epoch=True)
            return super().training_step(batch, batch_idx)

    trainer = Trainer(**QUIET, fast_dev_run=True)
    trainer.fit(Logs(), data())
    assert {"a_step", "a_epoch"} <= set(trainer.logged_metrics)


def test_every_run_starts_without_the_last_runs_metrics() -> None:
    """As Lightning: callback / logged / progress-bar metrics are empty when fit, validate, test and predict start."""
    seen: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = []

    class Reader(Callback):
        def _read(self, trainer: Any, hook: str) -> None:
            seen.append((hook, dict(trainer.callback_metrics), dict(trainer.logged_metrics),
                         dict(trainer.progress_bar_metrics)))

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self._read(trainer, "train")

        def on_test_start(self, trainer: Any, module: Any) -> None:
            self._read(trainer, "test")

        def on_predict_start(self, trainer: Any, module: Any) -> None:
            self._read(trainer, "predict")

    class Logs(Regressor):
        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_metric", 1.0, prog_bar=True)

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return batch[0]

    module = Logs()
    trainer = Trainer(**QUIET, max_epochs=1, callbacks=[Reader()])
    trainer.fit(module, data())
    trainer.test(module, data(), verbose=False)
    assert "test_metric" in trainer.callback_metrics
    trainer.predict(module, data())
    trainer.fit(module, data())  # a second fit too
    assert [s[0] for s in seen] == ["train", "test", "predict", "train"]
    assert all(s[1:] == ({}, {}, {}) for s in seen)


def test_several_eval_loaders_name_forked_values_as_lightning_and_each_result_gets_its_own() -> None:
    # Lightning 2.6.6 (tests_pytorch/trainer/logging_/test_eval_loop_logging.py): "loss_epoch/dataloader_idx_0",
    # the loader suffix after _step / _epoch; trainer.test returns one dict per loader with its own names.
    class TwoLoaders(Regressor):
        def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]), on_step=True, on_epoch=True)
            # A name without the suffix belongs to the results of the loader it was logged in.
            self.log(f"plain_{dataloader_idx}", 1.0, add_dataloader_idx=False)

        def on_test_epoch_end(self) -> None:
            self.log("everywhere", 2.0)  # outside the loaders: in every loader's results

    trainer = Trainer(**{**QUIET, "limit_test_batches": 2})
    results = trainer.test(TwoLoaders(), [data(8, 4), data(8, 4, seed=1)], verbose=False)
    assert [set(r) for r in results] == [{"loss_epoch/dataloader_idx_0", "plain_0", "everywhere"},
                                         {"loss_epoch/dataloader_idx_1", "plain_1", "everywhere"}]
    assert {k for k in trainer.logged_metrics if k.startswith("loss")} == {
        f"loss_{kind}/dataloader_idx_{i}" for kind in ("step", "epoch") for i in (0, 1)}
