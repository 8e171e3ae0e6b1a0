"""``Trainer(logger=obj)`` with any object that has Lightning's logger methods (a ``Mock``, another library's logger).

``LIGHTNING_CALLS`` is what Lightning 2.6.6 called on a ``Mock`` logger, between the hooks, recorded by
tests/parity_scripts/record_logger_calls.py; the tests run the same schedule on Ember (its fit: two epochs of two
batches, one validation batch, a checkpoint per epoch). Ember makes the same calls with the same arguments (and
steps), with the documented differences ``ember_calls`` applies: the run's ``log_hyperparams`` / ``log_graph`` /
``save`` before ``on_fit_start`` (Lightning: after it), and none of the three in ``predict`` (which runs no trackers; its ``finalize`` is made).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.loggers import CSVLogger, Logger
from trainer.loggers.adapter import LoggerTracker

LIGHTNING_CALLS: dict[str, Any] = {'log_dir': True,
 'checkpoint_dir': '{save_dir}/mock/0/checkpoints',
 'fit': ['setup',
         'on_fit_start',
         'log_hyperparams',
         'log_graph',
         'save',
         'on_train_start',
         ('log_metrics', 0, ['epoch', 'train_loss']),
         'save',
         ('log_metrics', 1, ['epoch', 'train_loss']),
         'save',
         'on_validation_start',
         ('log_metrics', 1, ['epoch', 'val_loss']),
         'save',
         'on_save_checkpoint',
         'after_save_checkpoint',
         ('log_metrics', 2, ['epoch', 'train_loss']),
         'save',
         ('log_metrics', 3, ['epoch', 'train_loss']),
         'save',
         'on_validation_start',
         ('log_metrics', 3, ['epoch', 'val_loss']),
         'save',
         'on_save_checkpoint',
         'after_save_checkpoint',
         'on_train_end',
         'on_fit_end',
         'teardown',
         ('finalize', 'success')],
 'validate': ['setup',
              'log_hyperparams',
              'log_graph',
              'save',
              'on_validation_start',
              ('log_metrics', 4, ['epoch', 'val_loss']),
              'save',
              'teardown',
              ('finalize', 'success')],
 'test': ['setup',
          'log_hyperparams',
          'log_graph',
          'save',
          'on_test_start',
          ('log_metrics', 4, ['epoch', 'test_loss']),
          'save',
          'teardown',
          ('finalize', 'success')],
 'predict': ['setup',
             'log_hyperparams',
             'log_graph',
             'save',
             'on_predict_start',
             'teardown',
             ('finalize', 'success')],
 'failed_fit': ['log_hyperparams', 'log_graph', 'save', ('finalize', 'failed')]}


QUIET_LOGGER = {k: v for k, v in QUIET.items() if k != "log_with"}  # logger= chooses the trackers
HOOKS = ("setup", "on_fit_start", "on_train_start", "on_validation_start", "on_test_start", "on_predict_start",
         "on_save_checkpoint", "on_train_end", "on_fit_end", "teardown")
RUN = ("log_hyperparams", "log_graph", "save")  # what a run's start sends


def ember_calls(stage: str) -> list[Any]:
    """``LIGHTNING_CALLS[stage]`` with Ember's documented differences (the module docstring)."""
    calls = list(LIGHTNING_CALLS[stage])
    if stage == "fit":
        start = calls.index("log_hyperparams")
        calls[1:1] = calls[start:start + 3]  # right after setup, before on_fit_start
        del calls[start + 3:start + 6]
    if stage == "predict":
        calls = [c for c in calls if c not in RUN]
    # Ember's module logs train/loss, val/loss, test/loss where Lightning's BoringModel logs train_loss...
    return [(c[0], c[1], [n.replace("_", "/") for n in c[2]]) if isinstance(c, tuple) and c[0] == "log_metrics"
            else c for c in calls]


def recorded(logger: mock.Mock) -> list[Any]:
    """The calls on ``logger`` (hooks included) in the form ``LIGHTNING_CALLS`` holds; then forgets them."""
    calls: list[Any] = []
    for name, args, kwargs in logger.method_calls:
        if name == "hook":
            calls.append(args[0])
        elif name == "log_metrics":
            assert not args, "Lightning passes metrics= and step= as keywords"
            calls.append(("log_metrics", kwargs["step"], sorted(kwargs["metrics"])))
        elif name == "finalize":
            calls.append(("finalize", *args))
        else:
            calls.append(name)
    logger.reset_mock()
    return calls


def hook_recorder(logger: mock.Mock) -> Callback:
    class Hooks(Callback):
        pass

    for hook in HOOKS:
        setattr(Hooks, hook, lambda self, *args, _hook=hook, **kwargs: logger.hook(_hook))
    return Hooks()


class Model(Regressor):
    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])


@pytest.fixture
def logger(tmp_path: Path) -> mock.Mock:
    logger = mock.Mock()
    logger.save_dir, logger.name, logger.version = str(tmp_path), "mock", "0"
    return logger


def test_a_mock_logger_gets_lightnings_calls_at_lightnings_points(logger: mock.Mock, tmp_path: Path) -> None:
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                      log_every_n_steps=1, logger=logger, callbacks=[hook_recorder(logger)],
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    assert trainer.logger is logger and trainer.loggers == [logger] and not logger.method_calls
    assert trainer.log_dir == str(tmp_path)  # a logger that is not a file logger: its save_dir, as Lightning
    trainer.fit(Model(), data(n=8), data(n=4))
    assert trainer.checkpoint_callback is not None
    assert trainer.checkpoint_callback.dirpath == LIGHTNING_CALLS["checkpoint_dir"].format(save_dir=tmp_path)
    notified = [args[0] for name, args, _ in logger.method_calls if name == "after_save_checkpoint"]
    assert [type(p) for p in notified] == [weakref.ProxyType] * 2  # Lightning's proxy(callback)
    assert all(p.dirpath == trainer.checkpoint_callback.dirpath for p in notified)
    assert logger.log_hyperparams.call_args == mock.call({"lr": 0.05, "features": 3})
    assert recorded(logger) == ember_calls("fit")
    trainer.validate(Model(), data(n=4), verbose=False)
    assert recorded(logger) == ember_calls("validate")
    trainer.test(Model(), data(n=4), verbose=False)
    assert recorded(logger) == ember_calls("test")
    trainer.predict(Model(), data(n=4))
    assert recorded(logger) == ember_calls("predict")


def test_a_failed_run_finalizes_the_logger_failed_once(logger: mock.Mock, tmp_path: Path) -> None:
    class Failing(Model):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("boom")

    trainer = Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, max_steps=1, log_every_n_steps=1,
                      logger=logger)
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Failing(), data())
    assert recorded(logger) == LIGHTNING_CALLS["failed_fit"]  # not a second finalize("success") as trackers end


def test_a_duck_logger_needs_only_log_metrics(tmp_path: Path) -> None:
    class Minimal:  # Lightning's Logger base gives every other method a default that does nothing
        def __init__(self) -> None:
            self.rows: list[tuple[int | None, dict[str, Any]]] = []

        def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
            self.rows.append((step, dict(metrics)))

    minimal = Minimal()
    trainer = Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, max_steps=2, log_every_n_steps=1,
                      logger=minimal)
    trainer.fit(Model(), data(n=8))
    assert [step for step, _ in minimal.rows] == [0, 1] and set(minimal.rows[0][1]) == {"train/loss", "epoch"}
    assert trainer.checkpoint_callback is None and trainer.log_dir is None  # no save_dir: Lightning reads it


def test_an_iterable_is_a_collection_of_loggers_as_in_lightning(tmp_path: Path) -> None:
    first, second = mock.Mock(save_dir=None), mock.Mock(save_dir=None)
    trainer = Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, logger=(x for x in (first, second)))
    assert trainer.loggers == [first, second]
    # A MagicMock iterates as empty: Lightning's trainer then has no logger (its tests delete __iter__ to avoid it).
    assert Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, logger=mock.MagicMock()).loggers == []


def test_fast_dev_run_calls_nothing_on_the_logger(logger: mock.Mock, tmp_path: Path) -> None:
    trainer = Trainer(default_root_dir=tmp_path, fast_dev_run=True, logger=logger, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(Model(), data(n=8), data(n=4))
    assert not logger.method_calls  # Lightning's loggers are a DummyLogger under fast_dev_run
    assert type(trainer.logger).__name__ == "DummyLogger"


@pytest.mark.parametrize(("value", "message"), [
    ("foo", r"Received: str \('foo'\)\.$"),
    ("csv", r"Received: str \('csv'\)\. For the 'csv' tracker pass Trainer\(log_with='csv'\)"),
    (1, r"Received: int \(1\)\.$"),
    (CSVLogger, r"Pass an instance: logger=CSVLogger\(\.\.\.\)\."),
    ([mock.Mock(), object()], r"Received: object"),
])
def test_what_is_no_logger_is_refused_when_the_trainer_is_built(value: Any, message: str) -> None:
    # Lightning accepts these and fails inside the run ("'str' object has no attribute 'finalize'").
    with pytest.raises(TypeError, match=r"any object with Lightning's logger methods \(log_metrics\(metrics, "
                                        r"step\)[\s\S]*" + message):
        Trainer(**QUIET_LOGGER, logger=value)


class BufferLogger(Logger):
    """Lightning's test_logger_after_fit_predict_test_calls: values flushed to ``logs`` by ``finalize``."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer: dict[str, Any] = {}
        self.logs: dict[str, Any] = {}
        self.statuses: list[str] = []

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        self.buffer.update(metrics)

    def finalize(self, status: str) -> None:
        self.statuses.append(status)
        self.logs.update(self.buffer)
        self.buffer = {}


def test_a_logger_subclass_is_finalized_after_every_run(tmp_path: Path) -> None:
    buffer = BufferLogger()
    trainer = Trainer(**QUIET_LOGGER, default_root_dir=tmp_path, max_steps=1, log_every_n_steps=1, logger=buffer)
    trainer.fit(Model(), data(n=4))
    assert "train/loss" in buffer.logs and buffer.statuses == ["success"]
    trainer.test(Model(), data(n=4), verbose=False)
    assert "test/loss" in buffer.logs and buffer.statuses == ["success", "success"]
    trainer.predict(Model(), data(n=4))
    assert buffer.statuses == ["success"] * 3


def test_the_adapter_finalizes_once_when_the_engine_ends_the_run() -> None:
    logger = mock.Mock()
    tracker = LoggerTracker(logger)
    tracker.log({"loss": 0.5}, step=1)
    tracker.finish()  # the engine's end (no Trainer run said it ended)
    tracker.run_ended("failed")
    tracker.finish()  # already finalized: nothing more
    assert [c for c in logger.method_calls if c[0] == "finalize"] == [mock.call.finalize("success"),
                                                                    mock.call.finalize("failed")]
    with pytest.raises(TypeError, match=r"Received: int \(3\)"):
        LoggerTracker(3)
