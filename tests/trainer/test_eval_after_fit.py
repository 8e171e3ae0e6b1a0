"""Which weights validate / test / predict use after fit when given no module and no ckpt_path: Lightning's rule
(trainer/checkpoint/eval_choice.py), with the cases, warnings and errors recorded from Lightning 2.6.6 by
tests/parity_scripts/record_eval_after_fit.py (the same module, data and callbacks)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Trainer, TrainModule

METHODS = ("validate", "test", "predict")


def implied_best_warning(fn: str) -> str:  # Lightning 2.6.6's words, recorded
    return (f"`.{fn}(ckpt_path=None)` was called without a model. The best model of the previous `fit` call will be "
            f"used. You can pass `.{fn}(ckpt_path='best')` to use the best model or `.{fn}(ckpt_path='last')` to use "
            "the last model. If you pass a value, this warning will be silenced.")


def several_callbacks_warning(fn: str) -> str:
    return (f'`.{fn}(ckpt_path="best")` is called with Trainer configured with multiple `ModelCheckpoint` callbacks. '
            "It will use the best checkpoint path from first checkpoint callback.")


class Overshoot(TrainModule):
    """Linear regression whose learning rate grows 3x per epoch: the validation loss is lowest before the last
    epoch, so the best checkpoint's weights differ from the final ones."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(2, 1)
        self.used: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def _evaluate(self, batch: Any, name: str) -> None:
        self.used.append(float(self.net.weight.detach().sum()))
        x, y = batch
        self.log(name, torch.nn.functional.mse_loss(self.net(x), y))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val_loss")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test_loss")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.used.append(float(self.net.weight.detach().sum()))
        return self.net(batch[0])

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        return [optimizer], [torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=3.0)]


def data() -> DataLoader:
    x = torch.linspace(-1, 1, 16).reshape(8, 2)
    return DataLoader(TensorDataset(x, x @ torch.tensor([[1.5], [-0.5]])), batch_size=4)


def fitted(tmp_path: Any, callbacks: list[Any], **kwargs: Any) -> tuple[Trainer, Overshoot]:
    trainer = Trainer(max_epochs=4, project_dir=str(tmp_path), callbacks=callbacks, log_with=None,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)
    module = Overshoot()
    trainer.fit(module, data(), data())
    return trainer, module


def call(trainer: Trainer, fn: str, module: Overshoot | None = None) -> list[str]:
    """Run ``fn`` and return the messages of the warnings it gave about checkpoints."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = (module,) if module is not None else ()
        getattr(trainer, fn)(*args, dataloaders=data())
    return [str(w.message) for w in caught if "ckpt_path" in str(w.message)]


def best_weights(path: str) -> float:
    return float(Overshoot.load_from_checkpoint(path).net.weight.detach().sum())


@pytest.mark.parametrize("fn", METHODS)
def test_without_a_module_the_best_checkpoint_is_evaluated_with_lightnings_warning(tmp_path: Any, fn: str) -> None:
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, save_last=True)
    trainer, module = fitted(tmp_path, [checkpoint])
    final, best = float(module.net.weight.detach().sum()), best_weights(checkpoint.best_model_path)
    assert best != final  # as in the recording: the case tells the two apart
    module.used.clear()
    assert call(trainer, fn) == [implied_best_warning(fn)]
    assert module.used[0] == best  # Lightning 2.6.6: "best"
    assert float(module.net.weight.detach().sum()) == best  # and the module keeps the loaded weights


@pytest.mark.parametrize("fn", METHODS)
def test_a_module_passed_to_the_call_is_evaluated_as_it_is_without_a_warning(tmp_path: Any, fn: str) -> None:
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1)
    trainer, module = fitted(tmp_path, [checkpoint])
    final = float(module.net.weight.detach().sum())
    module.used.clear()
    assert call(trainer, fn, module) == []
    assert module.used[0] == final  # Lightning 2.6.6: "current"


def test_the_default_checkpoint_callback_gives_the_last_epochs_weights(tmp_path: Any) -> None:
    trainer, module = fitted(tmp_path, [])
    final = float(module.net.weight.detach().sum())
    module.used.clear()
    assert call(trainer, "test") == [implied_best_warning("test")]
    assert module.used[0] == final  # the default ModelCheckpoint's best is the newest: Lightning's "current, best"


def test_several_checkpoint_callbacks_the_first_decides_with_a_warning(tmp_path: Any) -> None:
    first = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, filename="a-{epoch}")
    second = ModelCheckpoint(monitor="val_loss", mode="max", save_top_k=1, filename="b-{epoch}")
    trainer, module = fitted(tmp_path, [first, second])
    best = best_weights(first.best_model_path)
    module.used.clear()
    assert call(trainer, "validate") == [implied_best_warning("validate"), several_callbacks_warning("validate")]
    assert module.used[0] == best


@pytest.mark.parametrize(("case", "head"), [
    ("none", '`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured.'),
    ("never", '`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save the best model.'),
    ("fast", ('You cannot execute `.{fn}(ckpt_path="best")` with `fast_dev_run=True`. Please pass an exact '
              "checkpoint path to `.{fn}(ckpt_path=...)`")),
])
def test_where_there_is_no_best_checkpoint_the_call_is_refused_with_lightnings_words_and_the_fix(
        tmp_path: Any, case: str, head: str) -> None:
    callbacks = [ModelCheckpoint(monitor="val_loss", save_top_k=0)] if case == "never" else []
    trainer, module = fitted(tmp_path, callbacks, enable_checkpointing=case != "none", fast_dev_run=case == "fast")
    for fn in METHODS:
        with pytest.raises(ValueError) as raised, pytest.warns(UserWarning, match="was called without a model"):
            getattr(trainer, fn)(dataloaders=data())
        message = str(raised.value)
        assert message.startswith(head.format(fn=fn)), message
        assert f"trainer.{fn}(model, ...)" in message and "ckpt_path='last'" in message  # Ember's fix line
        call(trainer, fn, module)  # the module passed: its current weights, no error
