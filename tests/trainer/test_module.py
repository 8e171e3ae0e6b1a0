"""TrainModule, DataModule, TrainState and the trainer's checkpoint contents."""

from __future__ import annotations

import copy
import gc
import pickle
from argparse import Namespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data, fit
from trainer import DataModule, Trainer, TrainModule, TrainState
from trainer.loop.router import StepRouter


class Base(TrainModule):
    def __init__(self, width: int, **kwargs: Any) -> None:
        super().__init__()
        self.save_hyperparameters()


class Child(Base):
    def __init__(self, width: int = 4, depth: int = 2, *args: Any, name: str = "net") -> None:
        super().__init__(width * 2, extra=True)


def test_save_hyperparameters_forms() -> None:
    # Captured from every __init__ frame of the object; the most derived class wins, **kwargs are expanded.
    assert Child(width=3).hparams == {"width": 3, "depth": 2, "name": "net", "extra": True}

    class Picky(TrainModule):
        def __init__(self, lr: float = 0.1, backbone: Any = None, size: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters("lr", "size")

    class Ignoring(TrainModule):
        def __init__(self, lr: float = 0.1, backbone: Any = None) -> None:
            super().__init__()
            self.save_hyperparameters(ignore="backbone")

    class FromDict(TrainModule):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    assert Picky().hparams == {"lr": 0.1, "size": 3}
    assert Ignoring(lr=0.5, backbone=torch.nn.Linear(1, 1)).hparams == {"lr": 0.5}
    assert FromDict({"a": 1}).hparams.a == 1
    module = FromDict(Namespace(b=2))  # type: ignore[arg-type]
    module.hparams.b = 3
    assert module.hparams_initial == {"b": 2} and module.hparams.b == 3
    with pytest.raises(ValueError, match=r"\['nope'\] are not arguments of __init__"):
        class Wrong(TrainModule):
            def __init__(self, lr: float = 0.1) -> None:
                super().__init__()
                self.save_hyperparameters("nope")

        Wrong()


def test_the_trainer_reference_stays_out_of_state_pickles_and_children() -> None:
    module = Regressor()
    trainer = fit(module, max_epochs=1)
    assert module.trainer is trainer and module.global_step == trainer.global_step == 4
    assert module.current_epoch == 1 and module.device == torch.device("cpu")
    assert set(module.state_dict()) == {"net.weight", "net.bias"}
    assert [name for name, _ in module.named_children()] == ["net"]
    clone = pickle.loads(pickle.dumps(module))
    torch.testing.assert_close(clone.net.weight, module.net.weight)
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        _ = copy.deepcopy(module).trainer
    del trainer
    gc.collect()
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        _ = module.trainer  # held weakly: no cycle keeps the trainer alive
    assert module.global_step == 0


def test_step_router_keeps_the_modules_keys() -> None:
    module = Regressor()
    router = StepRouter(module)
    assert set(router.state_dict()) == {"net.weight", "net.bias"}
    router.load_state_dict({k: torch.zeros_like(v) for k, v in module.state_dict().items()})
    assert not module.net.weight.detach().any()


def test_freeze_and_unfreeze_switch_gradients_and_mode_and_return_the_module() -> None:
    module = Regressor()
    assert module.freeze() is module
    assert not module.training and not any(p.requires_grad for p in module.parameters())
    assert module.unfreeze() is module
    assert module.training and all(p.requires_grad for p in module.parameters())


def test_toggle_optimizer_freezes_the_other_parameters() -> None:
    module = Regressor()
    extra = torch.nn.Linear(1, 1)
    module.extra = extra
    optimizer = torch.optim.SGD(module.net.parameters(), lr=0.1)
    module.toggle_optimizer(optimizer)
    assert module.net.weight.requires_grad and not extra.weight.requires_grad
    module.untoggle_optimizer(optimizer)
    assert extra.weight.requires_grad


def test_toggle_optimizer_in_a_trainer_freezes_only_the_other_optimizers_parameters() -> None:
    # As Lightning 2.6 (test_toggle_untoggle_2_optimizers_no_shared_parameters): the parameters of the trainer's
    # other optimizers are frozen; one no optimizer holds (`head` here) keeps requires_grad, so the loss has a graph.
    seen: list[tuple[bool, bool, bool]] = []

    class TwoOptimizers(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.other = torch.nn.Linear(3, 1)
            self.head = torch.nn.Linear(1, 1)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            first, _second = self.optimizers()
            self.toggle_optimizer(first)
            seen.append((self.net.weight.requires_grad, self.other.weight.requires_grad,
                         self.head.weight.requires_grad))
            loss = torch.nn.functional.mse_loss(self.head(self.net(batch[0]) + self.other(batch[0])), batch[1])
            self.manual_backward(loss)
            first.step()
            first.zero_grad()
            self.untoggle_optimizer(first)
            assert self.other.weight.requires_grad

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.SGD(self.other.parameters(), lr=0.1)]

    fit(TwoOptimizers(), data(n=8), max_epochs=1)
    assert seen == [(True, False, True)] * 2


class Numbers(DataModule):
    def __init__(self, n: int = 12) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.calls: list[str] = []
        self.counter = 0

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage}")
        self.loader = data(n=self.hparams.n)

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage}")

    def train_dataloader(self) -> DataLoader:
        return self.loader

    def val_dataloader(self) -> DataLoader:
        return self.loader

    def test_dataloader(self) -> DataLoader:
        return self.loader

    def state_dict(self) -> dict[str, Any]:
        return {"counter": self.counter}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counter = state_dict["counter"]


def test_datamodule_flow_and_fallbacks(tmp_path: Any) -> None:
    dm = Numbers()
    # Checkpointing on: a test() without a module loads the best checkpoint into the fitted module (Lightning's
    # rule, tests/trainer/test_eval_after_fit.py).
    trainer = Trainer(**{**QUIET, "enable_checkpointing": True}, project_dir=str(tmp_path), max_epochs=1)
    trainer.fit(Regressor(), dm)  # a data module in the loaders' place counts as datamodule=
    assert dm.calls == ["prepare_data", "setup:fit", "teardown:fit"] and dm.trainer is trainer
    assert trainer.global_step == 3
    with pytest.warns(UserWarning, match="The best model of the previous `fit` call will be used"):
        trainer.test(verbose=False)  # no module, no data: the fitted module and the last data module
    assert dm.calls[-3:] == ["prepare_data", "setup:test", "teardown:test"]
    with pytest.raises(ValueError, match="Both train_dataloaders= and datamodule= were given"):
        trainer.fit(Regressor(), data(), datamodule=dm)

    class OwnData(Regressor):
        def train_dataloader(self) -> DataLoader:
            return data(n=8)

    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(OwnData())
    assert trainer.global_step == 2


class Counter(Callback):
    def __init__(self) -> None:
        self.count = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.count = state_dict["count"]


def test_train_state_and_trainer_state_dict_round_trip() -> None:
    state = TrainState(epoch=3, batch_in_epoch=2, global_step=9, micro_step=20, samples_seen=80)
    assert TrainState.from_state_dict(state.state_dict()) == state
    with pytest.raises(KeyError, match=r"unknown keys \['extra'\]"):
        TrainState().load_state_dict({**state.state_dict(), "extra": 1})

    dm = Numbers()
    dm.counter = 5
    trainer = Trainer(**QUIET, max_epochs=2, callbacks=[Counter()])
    trainer.fit(Regressor(), datamodule=dm)
    saved = trainer.state_dict()
    assert saved["state"]["global_step"] == 6 and saved["callbacks"] == {"Counter": {"count": 6}}
    assert saved["datamodule"] == {"counter": 5}
    fresh = Trainer(**QUIET, max_epochs=2, callbacks=[Counter()])
    fresh.datamodule = Numbers()
    fresh.load_state_dict(saved)
    assert fresh.state == trainer.state and fresh.callbacks[0].count == 6 and fresh.datamodule.counter == 5
    # Two stateful callbacks under one state_key: refused when the Trainer is built (Lightning's RuntimeError).
    with pytest.raises(RuntimeError, match=r"Found more than one stateful callback of type `Counter`.*both are "
                                           r"'Counter'\): give them different arguments, or override `state_key`"):
        Trainer(**QUIET, callbacks=[Counter(), Counter()])
    Trainer(**QUIET, callbacks=[Counter(), Callback(), Callback()])  # stateless ones may share a key


def test_estimated_stepping_batches() -> None:
    trainer = fit(Regressor(), data(n=20), max_epochs=3, accumulate_grad_batches=2)  # 5 batches -> 3 steps/epoch
    assert trainer.estimated_stepping_batches == 9 == trainer.global_step
    trainer = fit(Regressor(), data(n=20), max_epochs=3, max_steps=4)
    assert trainer.estimated_stepping_batches == 4


def test_assigning_the_trainer_attaches_inner_modules_too() -> None:
    # Lightning 2.6.6 (tests_pytorch/core/test_lightning_module.py): module.trainer = t reaches the TrainModules
    # inside it; an unattached module says it is "not attached to a `Trainer`".
    ensemble, inner = TrainModule(), TrainModule()
    ensemble.inner = inner
    assert inner._trainer is None
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        _ = ensemble.trainer
    trainer = Trainer(log_with=None)
    ensemble.trainer = trainer
    assert ensemble.trainer is inner.trainer is trainer


def test_dtype_follows_the_weights_as_lightning() -> None:
    module = Regressor()
    assert module.dtype == torch.float32
    module.double()
    assert module.dtype == torch.float64
    assert TrainModule().dtype == torch.get_default_dtype()  # no weights yet: torch's default
