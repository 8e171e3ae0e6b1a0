"""The Trainer as a facade: its keywords are TrainerConfig's, it is rebuilt from a config, Lightning's attribute
names come from one table, the module reaches it through ModuleHost, and checkpoint state travels as values."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from trainer import Trainer, TrainModule
from trainer.compat.attributes import LIGHTNING_ATTRIBUTES, with_lightning_attributes
from trainer.config import KEYWORDS, TrainerConfig
from trainer.host import ModuleHost


class Regressor(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.calls: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y) * 100  # large gradients: clipping has work to do
        self.log("loss", loss)
        return loss

    def on_train_epoch_end(self) -> None:
        self.calls.append("module")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 3, generator=generator), torch.randn(16, 1, generator=generator)),
                      batch_size=4)


def _trainer(**kwargs: Any) -> Trainer:
    return Trainer(log_with=None, enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_the_signature_is_trainer_configs_keywords_with_their_defaults() -> None:
    parameters = inspect.signature(Trainer).parameters
    assert list(parameters) == list(KEYWORDS)
    fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    for name, parameter in parameters.items():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default is fields[name].default, name
    assert parameters["log_every_n_steps"].default == 50 and parameters["max_epochs"].default is None


def test_an_unknown_keyword_names_the_close_match() -> None:
    with pytest.raises(TypeError, match=r"Trainer.__init__\(\) got an unexpected keyword argument 'max_epoch'\. Did you mean "
                                        r"'max_epochs'\?"):
        Trainer(max_epoch=3)
    with pytest.raises(TypeError, match="'max_epochs_defaulted'"):  # resolved fields are not keywords
        Trainer(max_epochs_defaulted=True)


def test_from_config_rebuilds_a_trainer_with_one_setting_changed() -> None:
    trainer = _trainer(max_epochs=3, gradient_clip_val=0.5, precision="bf16-mixed", limit_train_batches=2)
    again = Trainer.from_config(dataclasses.replace(trainer.config, max_epochs=5))
    assert (again.max_epochs, again.gradient_clip_val, again.limit_train_batches) == (5, 0.5, 2)
    assert again.config.mixed_precision == "bf16" and again.accelerator.mixed_precision == "bf16"
    assert dataclasses.replace(again.config, max_epochs=3) == trainer.config  # resolving is idempotent


def test_replacing_keeps_what_the_limits_resolved_to() -> None:
    unlimited = TrainerConfig(max_epochs=-1)
    assert unlimited.max_epochs is None
    assert dataclasses.replace(unlimited, gradient_clip_val=1.0).max_epochs is None  # still no limit, not 1000
    defaulted = TrainerConfig()
    assert (defaulted.max_epochs, defaulted.max_epochs_defaulted) == (1000, True)
    assert dataclasses.replace(defaulted, log_every_n_steps=5).max_epochs_defaulted
    assert not dataclasses.replace(defaulted, max_epochs=7).max_epochs_defaulted
    with pytest.raises(ValueError, match=r"min_epochs=4\) is larger than max_epochs=3"):
        dataclasses.replace(TrainerConfig(max_epochs=5, min_epochs=4), max_epochs=3)


def test_every_lightning_attribute_name_reads_its_owner() -> None:
    trainer = _trainer(max_epochs=2)
    module = Regressor()
    trainer.fit(module, _data())
    for name in LIGHTNING_ATTRIBUTES:
        getattr(trainer, name)  # none raises
    assert (trainer.global_step, trainer.current_epoch, trainer.model, trainer.num_training_batches) == (8, 2, module, 4)
    trainer.max_epochs = 4  # a settable name replaces the config, checked again
    assert trainer.config.max_epochs == 4
    with pytest.raises(AttributeError, match="read-only"):
        trainer.log_every_n_steps = 3


def test_the_attribute_table_refuses_a_name_the_class_defines() -> None:
    class Clash:
        def max_epochs(self) -> None: ...

    with pytest.raises(TypeError, match="Clash.max_epochs is defined by the class and in LIGHTNING_ATTRIBUTES"):
        with_lightning_attributes(Clash)


def test_the_trainer_has_every_name_of_the_module_contract() -> None:
    trainer = _trainer(max_epochs=1)
    names = [name for name in vars(ModuleHost) if not name.startswith("_")] + list(ModuleHost.__annotations__)
    assert {"log_value", "module_optimizers", "backward", "global_step", "accelerator"} <= set(names)
    for name in names:
        assert hasattr(trainer, name), name


def test_a_callback_declares_its_place_at_the_training_epoch_end() -> None:
    calls: list[str] = []

    class Before(Callback):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            calls.append("before")

    class After(Callback):
        epoch_end_after_module = True

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            calls.append("after")

    module = Regressor()
    module.calls = calls
    _trainer(max_epochs=1, callbacks=[After(), Before()]).fit(module, _data())
    assert calls == ["before", "module", "after"]
    assert ModelCheckpoint.epoch_end_after_module and not Callback.epoch_end_after_module


def test_the_trainer_clips_by_itself_unless_the_module_overrides_clipping(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []

    def spy(self: Any, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None) -> None:
        raise AssertionError("the trainer clips by itself when the module does not override clipping")

    monkeypatch.setattr(TrainModule, "configure_gradient_clipping", spy)  # the base's own: not an override

    class Watch(Callback):
        def on_before_zero_grad(self, trainer: Any, module: Any, optimizer: Any) -> None:
            if module.net.weight.grad is not None:
                seen.append(float(torch.cat([p.grad.flatten() for p in module.parameters()]).norm()))

    _trainer(max_epochs=1, gradient_clip_val=0.5, callbacks=[Watch()]).fit(Regressor(), _data())
    assert seen and max(seen) <= 0.5 + 1e-6  # clipped: the unclipped norms are far larger

    class OwnClipping(Regressor):
        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.calls.append(f"clip {gradient_clip_val}")

    module = OwnClipping()
    _trainer(max_epochs=1, gradient_clip_val=0.5).fit(module, _data())
    assert module.calls.count("clip 0.5") == 4  # once per optimizer step


def test_the_engine_restores_the_trainer_entry_on_any_load_state(tmp_path: Any) -> None:
    trainer = _trainer(max_epochs=1, project_dir=str(tmp_path))
    trainer.fit(Regressor(), _data())
    folder = trainer.accelerator.save_state(str(tmp_path / "at_4"))  # an engine folder (the trainer writes .ckpt files)
    trainer.state.global_step, trainer.state.epoch = 0, 0
    trainer.accelerator.load_state(folder)  # by hand: the registered entry is restored as a value
    assert (trainer.global_step, trainer.current_epoch) == (4, 1)
