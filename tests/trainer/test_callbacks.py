"""The built-in callbacks: ProgressBar, LearningRateMonitor, ModelSummary, ThroughputMonitor, accumulation."""

from __future__ import annotations

import functools
import io
from typing import Any

import pytest
import torch

from callbacks import (
    BaseFinetuning,
    GradientAccumulationScheduler,
    LearningRateMonitor,
    ModelSummary,
    ProgressBar,
    ThroughputMonitor,
)
from callbacks.exceptions import MisconfigurationException
from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data, fit
from tests.trainer.test_hook_order import ManualModule
from trainer import Trainer


class Shown(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("shown", 1.5, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_shown", 0.25, prog_bar=True)


def test_progress_bar_prints_one_line_per_epoch_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Trainer(**{**QUIET, "enable_progress_bar": True}, max_epochs=2)
    module = Shown()
    trainer.fit(module, data(n=16), data(n=8))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == ["Epoch 0/1: 4 batches", "Epoch 1/1: 4 batches"]
    assert lines[1].startswith("Epoch 1/1: 4 batches, step 8, ") and lines[1].endswith("shown=1.5, val_shown=0.25")
    trainer.validate(module, data(n=8), verbose=False)
    trainer.test(module, data(n=4), verbose=False)
    trainer.predict(module, data(n=8))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Validation: 2 batches, ") and lines[0].endswith("val_shown=0.25")
    assert lines[1].startswith("Test: 1 batches, ")
    assert lines[2].startswith("Predict: 2 batches, ")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_tqdm_bars_on_a_terminal() -> None:
    stream = Terminal()
    trainer = Trainer(**{**QUIET, "enable_progress_bar": True}, max_epochs=1,
                      callbacks=[ProgressBar(stream=stream, metrics_interval_s=0.0)])
    trainer.fit(Shown(), data(n=16), data(n=8))
    text = stream.getvalue()
    assert "Epoch 0/0" in text and "\r" in text and "shown=1.5" in text and "4/4" in text


def test_learning_rate_monitor_logs_before_each_step() -> None:
    class Halving(Regressor):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0, momentum=0.9)
            return {"optimizer": opt, "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5), "interval": "step"}}

    tracker = MemoryTracker()
    monitor = LearningRateMonitor(log_momentum=True)
    fit(Halving(), data(n=16), max_epochs=1, log_every_n_steps=1, log_with=[tracker], callbacks=[monitor],
        accumulate_grad_batches=2)
    assert monitor.lrs == {"lr-SGD": [1.0, 0.5]}  # 4 batches, 2 optimizer steps: logged once per step
    assert tracker.logged("lr-SGD") == [(0, 1.0), (1, 0.5)] and tracker.logged("lr-SGD-momentum")[0] == (0, 0.9)

    epoch_monitor = LearningRateMonitor(logging_interval="epoch")
    fit(Halving(), data(n=8), max_epochs=3, log_with=[MemoryTracker()], callbacks=[epoch_monitor])
    assert epoch_monitor.lrs == {"lr-SGD": [1.0, 0.25, 0.0625]}
    with pytest.raises(MisconfigurationException, match="`Trainer` that has no logger"):
        fit(Regressor(), max_epochs=1, callbacks=[LearningRateMonitor()])
    with pytest.raises(MisconfigurationException, match="logging_interval='batch'"):
        LearningRateMonitor(logging_interval="batch")


def test_model_summary_prints_the_parameter_table(capsys: pytest.CaptureFixture[str]) -> None:
    fit(Regressor(), max_epochs=1, callbacks=[ModelSummary()])
    out = capsys.readouterr().out
    assert "0 | net  | Linear | 4" in out and "4         Total params" in out


def test_throughput_monitor_reports_samples_and_tokens() -> None:
    class Tokens(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            return {"loss": super().training_step(batch, batch_idx), "tokens": torch.tensor(10 * len(batch[0]))}

    tracker = MemoryTracker()
    monitor = ThroughputMonitor(window=2)
    fit(Tokens(), data(n=32), data(n=8), max_epochs=1, callbacks=[monitor], log_with=[tracker],
        val_check_interval=3)
    samples = tracker.logged("throughput/samples_per_sec")
    tokens = tracker.logged("throughput/tokens_per_sec")
    assert [step for step, _ in samples] == [2, 4, 6, 8] and all(value > 0 for _, value in samples)
    assert [t / s for (_, t), (_, s) in zip(tokens, samples)] == pytest.approx([10.0] * 4)
    assert set(monitor.last) == {"throughput/samples_per_sec", "throughput/tokens_per_sec"}


def test_gradient_accumulation_scheduler() -> None:
    trainer = fit(Regressor(), data(n=16), max_epochs=3,
                  callbacks=[GradientAccumulationScheduler({1: 2, 2: 4})])  # 4 batches per epoch
    assert trainer.global_step == 4 + 2 + 1
    # Lightning 2.6.6's exception types and texts (tests_pytorch/callbacks/test_gradient_accumulation_scheduler.py).
    with pytest.raises(MisconfigurationException, match=r"Accumulation factor should be an int greater than 0\. "
                                                        r"Got \[0\]"):
        GradientAccumulationScheduler({1: 0})
    with pytest.raises(MisconfigurationException, match=r"Epoch should be an int greater than or equal to 0\. "
                                                        r"Got \['1'\]"):
        GradientAccumulationScheduler({"1": 2})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="You have set `accumulate_grad_batches` and are using the "
                                         "`GradientAccumulationScheduler` callback"):
        fit(Regressor(), max_epochs=1, accumulate_grad_batches=3,
            callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(RuntimeError, match="Automatic gradient accumulation and the `GradientAccumulationScheduler` "
                                           "is not supported for manual optimization"):
        fit(ManualModule(), max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])


def test_gradient_accumulation_scheduler_warns_about_overridden_optimizer_hooks() -> None:
    # Lightning 2.6.6 warns when accumulating with an overridden optimizer_step / optimizer_zero_grad.
    class OwnStep(Regressor):
        def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            super().optimizer_step(*args, **kwargs)

    with pytest.warns(UserWarning, match=r"overriding `LightningModule.optimizer_\{step,zero_grad\}`, the hooks will "
                                         r"not be called on every batch"):
        fit(OwnStep(), data(n=16), max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])


def test_lambda_callback_runs_the_given_functions_as_hooks() -> None:
    # Lightning's LambdaCallback(**{hook: function}): each function runs as that hook, with the hook's arguments.
    from callbacks import LambdaCallback

    seen: list[tuple[str, int]] = []

    def record(name: str, trainer: Any, *args: Any) -> None:
        seen.append((name, len(args)))

    hooks = {name: functools.partial(record, name)
             for name in ("on_fit_start", "on_train_epoch_end", "on_train_batch_end", "on_validation_end")}
    fit(Regressor(), data(n=8), data(n=8), max_epochs=1, callbacks=[LambdaCallback(**hooks)])
    assert seen == [("on_fit_start", 1), ("on_train_batch_end", 4), ("on_train_batch_end", 4),
                    ("on_validation_end", 1), ("on_train_epoch_end", 1)]
    with pytest.raises(TypeError, match=r"LambdaCallback\(on_fit_begin=...\) is not a callback hook: .*on_fit_end"):
        LambdaCallback(on_fit_begin=print)


def test_a_subclass_saves_under_its_own_name_and_reads_the_base_name_of_older_checkpoints() -> None:
    from callbacks import EarlyStopping
    from trainer.checkpoint.entry import saved_key

    class Patient(EarlyStopping):
        pass

    callback = Patient(monitor="loss")
    # Lightning 2.6.6's key: the class's own qualified name, then the arguments.
    assert callback.state_key == f"{Patient.__qualname__}{{'monitor': 'loss', 'mode': 'min'}}"
    legacy = {"EarlyStopping{'monitor': 'loss', 'mode': 'min'}": {}}
    assert saved_key(callback, legacy) == "EarlyStopping{'monitor': 'loss', 'mode': 'min'}"
    assert saved_key(callback, {}) is None


class Unfreeze(BaseFinetuning):
    """Freezes ``net`` and adds it back to the optimizer as a group of its own at epoch 1."""

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(pl_module.net)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.net, optimizer, lr=0.01)


class Headed(Regressor):
    """A regressor with a head: only the head trains until ``Unfreeze`` adds ``net``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1, momentum=0.9)


def test_base_finetuning_records_every_param_group_as_lightning() -> None:
    callback = Unfreeze()
    fit(Headed(), data(8, 4), callbacks=[callback], max_epochs=2)
    groups = callback.state_dict()["internal_optimizer_metadata"][0]
    # Lightning 2.6.6's record: every group's settings with its parameters by name, the added one after.
    assert [(g["lr"], g["params"]) for g in groups] == [(0.1, ["head.weight", "head.bias"]),
                                                         (0.01, ["net.weight", "net.bias"])]
    assert {"momentum", "weight_decay", "nesterov"} <= set(groups[0])


def test_a_resume_after_base_finetuning_added_a_group_continues_exactly(tmp_path: Any) -> None:
    # The saved optimizer state has the group the callback added; the callback adds it back before that state
    # is loaded (Lightning's order), so the resumed run matches an uninterrupted one.
    from callbacks import ModelCheckpoint

    torch.manual_seed(0)
    straight = Headed()
    fit(straight, data(8, 4), callbacks=[Unfreeze()], max_epochs=3)
    torch.manual_seed(0)
    first = Headed()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    fit(first, data(8, 4), callbacks=[Unfreeze(), checkpoint], max_epochs=2, enable_checkpointing=True)
    resumed = Headed()
    trainer = Trainer(**{**QUIET, "max_epochs": 3, "callbacks": [Unfreeze()]})
    trainer.fit(resumed, data(8, 4), ckpt_path=str(tmp_path / "last.ckpt"))
    assert len(trainer.optimizers[0].param_groups) == 2
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
