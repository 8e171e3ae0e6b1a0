"""The exact order of callback and module hooks, as the Callback docstring's timeline states it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.trainer.helpers import QUIET, Recorder, Regressor, data, module_recording
from trainer import Trainer, TrainModule

# A window's first batch zeroes the gradients after training_step (Lightning 2.6); its last one steps.
STEP = ["on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
        "on_before_optimizer_step", "on_train_batch_end"]
FIRST = ["on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
         "on_train_batch_end"]


def _val(batches: int) -> list[str]:
    return (["on_validation_start", "on_validation_epoch_start"]
            + ["on_validation_batch_start", "on_validation_batch_end"] * batches
            + ["on_validation_epoch_end", "on_validation_end"])


def test_fit_with_validation_and_sanity_check() -> None:
    recorder = Recorder()
    trainer = Trainer(**{**QUIET, "num_sanity_val_steps": 1}, max_epochs=2, callbacks=[recorder])
    trainer.fit(Regressor(), data(n=8, batch_size=4), data(n=8, batch_size=4))
    epoch = ["on_train_epoch_start", *STEP, *STEP, *_val(2), "on_train_epoch_end"]
    assert recorder.events == ["setup", "on_fit_start", "on_sanity_check_start", *_val(1), "on_sanity_check_end",
                               "on_train_start", *epoch, *epoch, "on_train_end", "on_fit_end", "teardown"]


def test_module_hooks_interleave_with_callbacks() -> None:
    events: list[str] = []
    hooks = ("setup", "on_fit_start", "on_train_batch_start", "on_train_batch_end", "on_train_epoch_end",
             "on_validation_epoch_end", "on_before_optimizer_step", "on_fit_end")
    module = module_recording(Regressor, events, hooks)
    recorder = Recorder(events)
    Trainer(**QUIET, max_epochs=1, limit_train_batches=1, callbacks=[recorder]).fit(module, data(), data(n=4))
    relevant = [e for e in events if e.removeprefix("module:") in hooks]
    # Callbacks first, then the module, as in Lightning 2.6 (epoch ends included).
    assert relevant == ["setup", "module:setup", "on_fit_start", "module:on_fit_start",
                        "on_train_batch_start", "module:on_train_batch_start",
                        "on_before_optimizer_step", "module:on_before_optimizer_step",
                        "on_train_batch_end", "module:on_train_batch_end",
                        "on_validation_epoch_end", "module:on_validation_epoch_end",
                        "on_train_epoch_end", "module:on_train_epoch_end", "on_fit_end", "module:on_fit_end"]


def test_gradient_accumulation_steps_on_window_ends_and_the_last_batch() -> None:
    recorder = Recorder()
    trainer = Trainer(**QUIET, max_epochs=1, accumulate_grad_batches=2, callbacks=[recorder])
    trainer.fit(Regressor(), data(n=12, batch_size=4))  # 3 batches: a window of 2, then the last one alone
    train = [e for e in recorder.events if e in STEP]
    last_alone = STEP  # the epoch's last batch starts and closes its own window
    assert train == [*FIRST, *[e for e in STEP if e != "on_before_zero_grad"], *last_alone]
    assert trainer.global_step == 2


def test_validate_test_predict_sequences() -> None:
    recorder = Recorder()
    trainer = Trainer(**QUIET, callbacks=[recorder], max_epochs=1)
    module = Regressor()
    trainer.validate(module, data(n=8, batch_size=4), verbose=False)
    assert recorder.events == ["setup", *_val(2), "teardown"]
    recorder.events.clear()
    trainer.test(module, data(n=4, batch_size=4), verbose=False)
    assert recorder.events == ["setup", "on_test_start", "on_test_epoch_start", "on_test_batch_start",
                               "on_test_batch_end", "on_test_epoch_end", "on_test_end", "teardown"]
    recorder.events.clear()
    trainer.predict(module, data(n=8, batch_size=4))
    assert recorder.events == ["setup", "on_predict_start", "on_predict_epoch_start"]\
        + ["on_predict_batch_start", "on_predict_batch_end"] * 2 + ["on_predict_epoch_end", "on_predict_end",
                                                                   "teardown"]


class ManualModule(TrainModule):
    """Two optimizers stepped by hand, the second one every other batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.a = torch.nn.Linear(3, 1)
        self.b = torch.nn.Linear(3, 1)
        self.seen_types: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        opt_a, opt_b = self.optimizers()
        self.seen_types.append(isinstance(opt_a, torch.optim.Optimizer))
        loss = torch.nn.functional.mse_loss(self.a(x) + self.b(x), y)
        opt_a.zero_grad()
        opt_b.zero_grad()
        self.manual_backward(loss)
        opt_a.step()
        if batch_idx % 2 == 1:
            opt_b.step()
            self.lr_schedulers().step()

    def configure_optimizers(self) -> Any:
        opt_a = torch.optim.SGD(self.a.parameters(), lr=0.1)
        opt_b = torch.optim.SGD(self.b.parameters(), lr=0.1)
        return [opt_a, opt_b], [torch.optim.lr_scheduler.StepLR(opt_b, step_size=1, gamma=0.5)]


def test_manual_optimization_sequence_and_counts() -> None:
    recorder = Recorder()
    module = ManualModule()
    trainer = Trainer(**QUIET, max_epochs=1, callbacks=[recorder])
    trainer.fit(module, data(n=8, batch_size=4))
    train = [e for e in recorder.events if e in STEP]
    one_opt = ["on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
               "on_train_batch_end"]
    two_opts = [*one_opt[:-1], "on_before_optimizer_step", "on_train_batch_end"]
    assert train == [*one_opt, *two_opts]
    assert trainer.global_step == 3  # one per optimizer.step() call
    assert module.seen_types == [True, True]
    assert trainer.optimizers[1].param_groups[0]["lr"] == pytest.approx(0.05)  # its scheduler stepped once


def test_on_exception_runs_and_the_error_propagates() -> None:
    class Broken(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise RuntimeError("boom")

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(**QUIET, max_epochs=1, callbacks=[recorder]).fit(Broken(), data())
    assert recorder.events[-2:] == ["on_train_batch_start", "on_exception"]
    assert "teardown" not in recorder.events


def test_only_overridden_hooks_are_dispatched() -> None:
    from callbacks import Callback
    from trainer.loop.hooks import HookTable

    class OneHook(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            pass

    table = HookTable("trainer", Regressor(), [Callback(), OneHook()], module_base=TrainModule)
    assert table.has("on_train_batch_end") and not table.has("on_train_batch_start")
    assert len(table._callbacks["on_train_batch_end"]) == 1  # the base Callback is not called at all
    assert table.call("on_fit_start") is None  # nothing overrides it: an empty loop, no call into any object
