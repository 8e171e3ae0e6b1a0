"""Bad input fails early, naming the received value and the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from callbacks import ProgressBar
from callbacks.exceptions import MisconfigurationException
from callbacks.warnings import PossibleUserWarning
from engine import Accelerator
from tests.trainer.helpers import QUIET, Recorder, Regressor, data, fit
from trainer import Trainer, TrainModule


@pytest.mark.parametrize("returned, error, message", [
    ("loss", TypeError, "training_step returned str; return the loss tensor, a dict with a 'loss' key, or None"),
    ({"los": 1}, TypeError, r"returned dict with keys \['los'\]"),
    (torch.ones(2, requires_grad=True), ValueError, "must be a scalar tensor that requires grad"),
    (torch.tensor(1.0), ValueError, r"requires grad. Received: tensor\(1.\).*\.detach\(\)"),
])
def test_training_step_must_return_a_loss(returned: Any, error: type[Exception], message: str) -> None:
    class Bad(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return returned

    with pytest.raises(error, match=message):
        fit(Bad(), max_epochs=1)


def test_max_epochs_and_max_steps() -> None:
    # Lightning 2.6's category and text.
    with pytest.warns(PossibleUserWarning, match=r"`max_epochs` was not set. Setting it to 1000 epochs. To train "
                                                 r"without an epoch limit, set `max_epochs=-1`."):
        Trainer(**QUIET).fit(StopAtOnce(), data(n=4))
    assert Trainer(**QUIET).config.max_epochs == 1000
    assert Trainer(**QUIET, max_time={"hours": 1}).config.max_epochs is None  # a time limit replaces the default
    assert Trainer(**QUIET, max_epochs=-1).config.max_epochs is None  # Lightning's "no limit"
    # trainer.max_epochs shows Lightning's values (tests/trainer/test_lightning_conformance_loop.py: loop_limits)
    assert Trainer(**QUIET).max_epochs is None and Trainer(**QUIET, max_epochs=-1).max_epochs == -1
    for kwargs in ({"max_epochs": -2}, {"max_steps": -5}, {"max_epochs": 1.5}):
        name, value = next(iter(kwargs.items()))
        with pytest.raises(ValueError, match=rf"Trainer\({name}=...\) must be an int >= 0.*Received: {value}"):
            Trainer(**QUIET, **kwargs)


class StopAtOnce(Regressor):
    def on_train_start(self) -> None:
        self.trainer.should_stop = True


def test_val_check_interval_larger_than_the_epoch() -> None:
    with pytest.raises(ValueError, match=r"val_check_interval=7\) is larger than the 6 training batches.*"
                                         r"check_val_every_n_epoch=None"):
        fit(Regressor(), data(n=24), data(n=8), max_epochs=1, val_check_interval=7)
    with pytest.raises(ValueError, match=r"must be an int >= 1 .*, a float in \(0.0, 1.0\].*Received: 1.5"):
        Trainer(**QUIET, val_check_interval=1.5)
    with pytest.raises(MisconfigurationException, match=r"val_check_interval=0.5\): `val_check_interval` should be an "
                                                        r"integer or a time-based duration \(str 'DD:HH:MM:SS', "
                                                        r"datetime.timedelta, or dict kwargs for timedelta\) when "
                                                        r"`check_val_every_n_epoch=None`\."):  # Lightning's sentence
        Trainer(**QUIET, check_val_every_n_epoch=None, val_check_interval=0.5)


def test_module_without_configure_optimizers_fails_before_any_hook() -> None:
    class NoOptimizers(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).sum()

    recorder = Recorder()
    with pytest.raises(NotImplementedError, match="No `configure_optimizers\\(\\)` method defined. .* add to "
                                                  "NoOptimizers `def configure_optimizers"):
        Trainer(**QUIET, max_epochs=1, callbacks=[recorder]).fit(NoOptimizers(), data())
    assert recorder.events == []


@pytest.mark.parametrize("kwargs, message", [
    ({"limit_train_batches": 1.5}, r"limit_train_batches=...\) must be an int >= 0.*Received: 1.5"),
    ({"limit_val_batches": -1}, r"limit_val_batches=...\).*Received: -1"),
    ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches=...\) must be an int >= 1.*Received: 0"),
    ({"precision": "8-true"}, r"precision='8-true'\) is not supported. Use one of .*'16-true'"),
    ({"mixed_precision": "fp16", "precision": "bf16-mixed"}, "disagree: pass only one"),
    ({"gradient_clip_algorithm": "l2"}, r"must be one of \('norm', 'value'\). Received: 'l2'"),
    ({"max_time": "12:00"}, r"max_time='12:00'\) must be 'DD:HH:MM:SS'"),
    ({"accelerator": "tpu"}, r"accelerator='tpu'\) is not supported.*Use accelerator='gpu', 'cpu' or 'auto'"),
    ({"accelerator": "banana"}, r"accelerator=...\) takes an engine.Accelerator.*Received: 'banana'"),
    ({"min_epochs": 5, "max_epochs": 2}, r"min_epochs=5\) is larger than max_epochs=2"),
    ({"callbacks": [object()]}, "takes Callback instances. Received: <object object"),
    ({"enable_progress_bar": False, "callbacks": [ProgressBar()]}, "enable_progress_bar=False"),
])
def test_bad_trainer_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Trainer(**{**QUIET, **kwargs})


def test_given_accelerator_conflicts() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"together with \['log_with'\]: set them on the Accelerator"):
        Trainer(accelerator=accelerator, log_with="csv")
    with pytest.raises(ValueError, match="asks for mixed precision 'bf16' but the given Accelerator uses 'no'"):
        Trainer(accelerator=accelerator, precision="bf16-mixed")
    trainer = Trainer(accelerator=accelerator, max_epochs=1, enable_progress_bar=False, enable_model_summary=False)
    assert trainer.accelerator is accelerator


def test_bad_data_and_modules() -> None:
    with pytest.raises(TypeError, match="derive your model from trainer.TrainModule"):
        Trainer(**QUIET, max_epochs=1).fit(torch.nn.Linear(3, 1), data())  # type: ignore[arg-type]
    # Lightning's words first (observed, lightning 2.6: "An invalid dataloader was passed to `Trainer.fit(
    # train_dataloaders, ...)`" / "returned from `Model.train_dataloader`"), then what to do.
    with pytest.raises(TypeError, match=r"An invalid dataloader was passed to `Trainer.fit\(train_dataloaders=...\)`. "
                                        r"Found list: the train data must be a torch.utils.data.DataLoader"):
        fit(Regressor(), [[1.0, 2.0]], max_epochs=1)  # type: ignore[arg-type]

    class Returns(Regressor):
        def val_dataloader(self) -> Any:
            return [data(), object()]

    with pytest.raises(TypeError, match=r"invalid dataloader was returned from `Returns.val_dataloader\(\)`. Found "
                                        r"object: the val data must be"):
        Trainer(**QUIET).validate(Returns())
    with pytest.raises(TypeError, match=r"passed to `Trainer.test\(dataloaders=...\)`. Found str"):
        Trainer(**QUIET).test(Returns(), "data")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="No training data: pass fit"):
        Trainer(**QUIET, max_epochs=1).fit(Regressor())
    with pytest.raises(NotImplementedError, match="No `test_step\\(\\)` method defined to run `Trainer.test`: add to "
                                                  "TrainModule"):
        Trainer(**QUIET).test(TrainModule(), data())
    with pytest.raises(FileNotFoundError, match="ckpt_path='no/such/run'\\): Checkpoint file not found"):
        Trainer(**QUIET).fit(Regressor(), data(), ckpt_path="no/such/run")


def test_an_empty_training_loader_is_an_error_naming_it() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    empty = DataLoader(TensorDataset(torch.zeros(3, 3), torch.zeros(3, 1)), batch_size=4, drop_last=True)
    with pytest.raises(ValueError, match=r"The training DataLoader yields no batch: its dataset has 3 samples, "
                                         r"batch_size=4, drop_last=True\. Give it more samples"):
        Trainer(**QUIET, max_epochs=1).fit(Regressor(), empty)
    with pytest.raises(ValueError, match=r"its dataset has 0 samples"):
        Trainer(**QUIET, max_epochs=1).fit(Regressor(), DataLoader(TensorDataset(torch.zeros(0, 3)), batch_size=2))


@pytest.mark.parametrize("kwargs, error, lightning, ember", [
    ({"max_epochs": -100}, MisconfigurationException, "`max_epochs` must be a non-negative integer or -1",
     r"max_epochs=...\) must be an int >= 0, or None \(or -1\) for no limit. Received: -100"),
    ({"max_steps": -2}, MisconfigurationException, "`max_steps` must be a non-negative integer or -1",
     "Received: -2"),
    ({"gradient_clip_val": (1, 2)}, TypeError, "`gradient_clip_val` should be an int or a float",
     r"Received: \(1, 2\)"),
    ({"gradient_clip_algorithm": "norm2"}, MisconfigurationException, "`gradient_clip_algorithm` norm2 is invalid",
     r"must be one of \('norm', 'value'\). Received: 'norm2'"),
    ({"check_val_every_n_epoch": 1.2}, MisconfigurationException,
     "`check_val_every_n_epoch` should be an integer, found 1.2", r"must be an int >= 1 or None. Received: 1.2"),
])
def test_bad_arguments_raise_lightnings_type_and_sentence(kwargs: dict[str, Any], error: type[Exception],
                                                         lightning: str, ember: str) -> None:
    """Lightning's exception type and sentence (code ported from it matches on them), and Ember's received value."""
    with pytest.raises(error, match=lightning) as caught:
        Trainer(**{**QUIET, **kwargs})
    assert caught.match(ember)


def test_gradient_clip_algorithm_is_case_insensitive_as_in_lightning() -> None:
    assert Trainer(**QUIET, gradient_clip_val=1.0, gradient_clip_algorithm="Value").config.gradient_clip_algorithm == (
        "value")


def test_an_unknown_keyword_reads_as_pythons_own_error_for_a_subclass_too() -> None:
    class Custom(Trainer):
        def __init__(self, **kwargs: Any) -> None:
            self.custom = kwargs.pop("custom", 0)
            super().__init__(**kwargs)

    with pytest.raises(TypeError, match=r"^Trainer.__init__\(\) got an unexpected keyword argument 'abcdefg'"):
        Custom(abcdefg=1)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_no_module_names_the_entry_point(stage: str) -> None:
    with pytest.raises(TypeError, match=rf"`Trainer.{stage}\(\)` requires a `LightningModule`.*trainer.{stage}\(model"):
        getattr(Trainer(**QUIET), stage)()


def test_a_plain_nn_module_is_refused_with_lightnings_sentence() -> None:
    with pytest.raises(TypeError, match="must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got `Linear`. "
                                        "The trainer runs TrainModule subclasses"):
        Trainer(**QUIET).validate(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_save_checkpoint_before_any_module_is_an_attribute_error(tmp_path: Any) -> None:
    with pytest.raises(AttributeError, match="only possible if a model is attached to the Trainer.*Call one of them"):
        Trainer(**QUIET).save_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()


def test_missing_methods_raise_lightnings_misconfiguration_exception() -> None:
    # Lightning raises MisconfigurationException (and code written for it catches that), opening with its words.
    class NoStep(Regressor):
        training_step = None  # type: ignore[assignment]

    with pytest.raises(MisconfigurationException, match=r"No `training_step\(\)` method defined. Lightning `Trainer` "
                                                        r"expects as minimum .* add to NoStep `def training_step"):
        fit(NoStep(), max_epochs=1)
    module = Regressor()
    module.validation_step = None  # type: ignore[assignment]
    with pytest.raises(MisconfigurationException, match=r"No `validation_step\(\)` method defined to run "
                                                        r"`Trainer.validate`"):
        Trainer(**QUIET).validate(module, data())


def test_predict_needs_a_predict_step_or_forward() -> None:
    module = Regressor()
    module.predict_step = None  # type: ignore[assignment]
    with pytest.raises(MisconfigurationException, match=r"`predict_step` cannot be None to run `Trainer.predict`: "
                                                        r"remove Regressor.predict_step = None"):
        Trainer(**QUIET).predict(module, data())

    class NoForward(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)

    with pytest.raises(MisconfigurationException, match=r"`Trainer.predict` requires `forward` method to run: "
                                                        r"NoForward.predict_step is the default"):
        Trainer(**QUIET).predict(NoForward(), data())


@pytest.mark.parametrize("kwargs, message", [
    ({"gradient_clip_val": 1.0}, (r"Automatic gradient clipping is not supported for manual optimization \(Manual"
                                 r".automatic_optimization is False\). Remove `Trainer\(gradient_clip_val=1.0\)`")),
    ({"accumulate_grad_batches": 2}, (r"Automatic gradient accumulation is not supported for manual optimization"
                                     r" .*Remove `Trainer\(accumulate_grad_batches=2\)`")),
])
def test_manual_optimization_refuses_automatic_clipping_and_accumulation(kwargs: dict[str, Any], message: str) -> None:
    class Manual(Regressor):
        automatic_optimization = False

    with pytest.raises(MisconfigurationException, match=message):
        fit(Manual(), max_epochs=1, **kwargs)
    fit(Manual(), max_epochs=1, gradient_clip_val=0.0)  # 0 clips nothing: accepted, as in Lightning
