"""Warnings Lightning 2.6 gives, in its words (observed), where Ember shares the behaviour they describe."""

from __future__ import annotations

import dataclasses
import enum
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer, TrainModule
from trainer.core.saving import load_hparams_from_yaml, save_hparams_to_yaml
from trainer.utilities.warnings import PossibleUserWarning


class Silent(Regressor):
    def predict_step(self, batch: Any, batch_idx: int) -> None:
        return None


def test_a_predict_step_returning_none_warns_once_a_run() -> None:
    trainer = Trainer(**QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.predict(Silent(), data(n=12, batch_size=4))  # three batches, one warning
    said = [str(w.message) for w in caught if "predict returned None" in str(w.message)]
    assert said == ["predict returned None if it was on purpose, ignore this warning..."]


class Counter(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches = state_dict["batches"]


def test_a_resume_without_a_callback_whose_state_was_saved_names_it(tmp_path: Path) -> None:
    first = Trainer(max_epochs=1, callbacks=[Counter()], **QUIET)
    first.fit(Regressor(), data())
    first.save_checkpoint(tmp_path / "one.ckpt")
    resumed = Trainer(max_epochs=2, **QUIET)
    with pytest.warns(UserWarning, match=r"callbacks used to create the checkpoint need to be provided during "
                                         r"`Trainer` instantiation. Please add the following callbacks: \['Counter'\]"):
        resumed.fit(Regressor(), data(), ckpt_path=tmp_path / "one.ckpt")
    again = Trainer(max_epochs=2, callbacks=[counter := Counter()], **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # every saved state has its callback: nothing to say
        warnings.simplefilter("ignore", PossibleUserWarning)  # (but Regressor has no validation data)
        again.fit(Regressor(), data(), ckpt_path=tmp_path / "one.ckpt")
    assert counter.batches == 8  # 4 restored + 4 of the second epoch


def said(category: type[Warning], run: Any) -> list[str]:
    """The messages of ``category`` (and its subclasses) that ``run()`` warns."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, category)]


def test_adding_params_the_optimizer_holds_gives_lightnings_hint() -> None:
    from callbacks import BaseFinetuning

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    messages = said(UserWarning, lambda: BaseFinetuning.unfreeze_and_add_param_group(net[1], optimizer))
    # Lightning 2.6.6's text (observed), then how many were skipped.
    assert messages == [(
        "The provided params to be frozen already exist within another group of this optimizer. Those parameters "
        "will be skipped.\nHINT: Did you init your optimizer in `configure_optimizer` as such:\n <class "
        "'torch.optim.sgd.SGD'>(filter(lambda p: p.requires_grad, self.parameters()), ...) (2 of the parameters "
        "to add to SGD are in one of its groups already.)")]
    assert len(optimizer.param_groups) == 1


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)


def module_warning(name: str) -> str:  # Lightning 2.6.6's words (observed)
    return (f"Attribute {name!r} is an instance of `nn.Module` and is already saved during checkpointing. It is "
            f"recommended to ignore them using `self.save_hyperparameters(ignore=[{name!r}])`.")


def test_a_module_kept_as_a_hyperparameter_warns() -> None:
    class All(TrainModule):
        def __init__(self, encoder: torch.nn.Module, decoder: torch.nn.Module, other: int = 7) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=["decoder"])

    class Named(TrainModule):
        def __init__(self, encoder: torch.nn.Module, other: int = 7) -> None:
            super().__init__()
            self.save_hyperparameters("other")

    class FromDict(TrainModule):
        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.save_hyperparameters({"enc": encoder, "x": 1})

    assert said(UserWarning, lambda: All(Encoder(), Encoder())) == [module_warning("encoder")]  # not the ignored
    assert said(UserWarning, lambda: Named(Encoder())) == []
    assert said(UserWarning, lambda: FromDict(Encoder())) == [module_warning("enc")]


def test_a_dataclass_module_saves_its_init_fields() -> None:
    @dataclasses.dataclass
    class Config(TrainModule):
        mandatory: int
        optional: str = "optional"
        derived: int = dataclasses.field(default=999, init=False)

        def __post_init__(self) -> None:
            super().__init__()
            self.save_hyperparameters()

    module = Config(33, optional="x")
    assert module.hparams == {"mandatory": 33, "optional": "x"} and module.derived == 999  # as Lightning 2.6.6


def test_enums_are_written_to_yaml_by_name(tmp_path: Path) -> None:
    class Mode(str, enum.Enum):
        fast = "fast-mode"

    class Level(enum.Enum):
        high = 2

    path = tmp_path / "hparams.yaml"
    save_hparams_to_yaml(path, {"mode": Mode.fast, "nested": {"level": Level.high}, "levels": [Level.high]})
    # Lightning 2.6.6 reads back the names (observed; a str Enum made the safe dump fail before).
    assert load_hparams_from_yaml(path, use_omegaconf=False) == {"mode": "fast", "nested": {"level": "high"},
                                                                 "levels": ["high"]}


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), batch_size=4)


class WithValData(Regressor):
    def val_dataloader(self) -> DataLoader:
        return loader()


NO_STEP = "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop"
NO_DATA = "You defined a `validation_step` but have no `val_dataloader`. Skipping val loop"


@pytest.mark.parametrize(("switch_off", "limit_val_batches", "given", "expected"), [
    ("validation_step", None, False, (UserWarning, NO_STEP)),
    ("val_dataloader", None, False, (PossibleUserWarning, NO_DATA)),
    ("val_dataloader", 0, False, (PossibleUserWarning, NO_DATA)),  # whatever limit_val_batches says
    ("validation_step", 0, False, (UserWarning, NO_STEP)),
    ("both", None, True, (UserWarning, NO_STEP)),  # data passed to fit counts as defined
    (None, None, False, None),
])
def test_fit_says_when_validation_has_a_step_or_data_but_not_both(switch_off: str | None,
                                                                 limit_val_batches: int | None, given: bool,
                                                                 expected: tuple[type[Warning], str] | None) -> None:
    # Lightning 2.6.6 (observed): one warning each, a UserWarning for data without a step, a PossibleUserWarning
    # for a step without data.
    module = WithValData()
    for name in ("validation_step", "val_dataloader") if switch_off == "both" else (switch_off,):
        if name is not None:
            setattr(module, name, None)
    limits = {} if limit_val_batches is None else {"limit_val_batches": limit_val_batches}
    trainer = Trainer(**QUIET, max_epochs=1, **limits)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, loader(), loader() if given else None)
    found = [(w.category, str(w.message)) for w in caught if "Skipping val loop" in str(w.message)]
    assert [(category, text.split(":")[0]) for category, text in found] == ([expected] if expected else [])
