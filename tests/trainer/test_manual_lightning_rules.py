"""Manual optimisation and custom schedulers by Lightning 2.6's rules (its tests in
tests_pytorch/trainer/optimization/test_manual_optimization.py pass on both): ``manual_backward`` goes through
``trainer.strategy.backward`` (code and tests wrap it), ``optimizer.step(closure, **kwargs)`` passes the keywords
on, a ``zero_grad`` taking ``**kwargs`` gets ``set_to_none``, and a scheduler that is not torch's needs
``lr_scheduler_step`` only under automatic optimisation."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch

from callbacks.exceptions import MisconfigurationException
from tests.trainer.helpers import QUIET, data
from trainer import Trainer, TrainModule
from trainer.strategies.base import Strategy


class StepWithOptions(torch.optim.SGD):
    seen: list[dict[str, Any]] = []  # noqa: RUF012 - filled by the test

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        StepWithOptions.seen.append(kwargs)
        return super().step(closure)


class Manual(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()

        def closure() -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.manual_backward(loss)
            return loss

        optimizer.step(closure=closure, optim="sgd")
        optimizer.zero_grad()

    def configure_optimizers(self) -> Any:
        return StepWithOptions(self.parameters(), lr=0.1)


def test_manual_backward_goes_through_the_strategy_and_step_keywords_reach_the_optimizer() -> None:
    StepWithOptions.seen = []
    trainer = Trainer(**{**QUIET, "max_steps": 3})
    with mock.patch.object(Strategy, "backward", wraps=trainer.strategy.backward) as backward:
        trainer.fit(Manual(), data(16, 4))
    assert backward.call_count == 3 and trainer.global_step == 3
    assert StepWithOptions.seen == [{"optim": "sgd"}] * 3


def test_a_zero_grad_taking_keywords_gets_set_to_none() -> None:
    with mock.patch("torch.optim.SGD.zero_grad") as zero_grad:
        module = Manual()
        Trainer(**{**QUIET, "max_steps": 1}).fit(module, data(4, 4))
    zero_grad.assert_called_with(set_to_none=True)


class Stateful:
    """A scheduler that is not torch's: it saves its state, nothing more."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.parametrize("automatic", [True, False])
def test_a_custom_scheduler_needs_lr_scheduler_step_only_under_automatic_optimisation(automatic: bool) -> None:
    class Model(Manual):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = automatic

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]) if automatic else None

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [Stateful(optimizer)]

    trainer = Trainer(**{**QUIET, "max_epochs": 1})
    if automatic:
        with pytest.raises(MisconfigurationException, match="doesn't follow PyTorch's LRScheduler API.*"
                                                            r"Model\.lr_scheduler_step"):
            trainer.fit(Model(), data(4, 4))
    else:
        trainer.fit(Model(), data(4, 4))


def test_a_scheduler_without_state_methods_is_refused() -> None:
    class Model(Manual):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [object()]

    with pytest.raises(TypeError, match="should have `state_dict` and `load_state_dict` methods defined"):
        Trainer(**{**QUIET, "max_epochs": 1}).fit(Model(), data(4, 4))


def test_several_optimizers_or_an_optimizer_idx_need_manual_optimisation() -> None:
    class WithIndex(Manual):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = True

        def training_step(self, batch: Any, batch_idx: int, optimizer_idx: int = 0) -> Any:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    with pytest.raises(RuntimeError, match="Remove the `optimizer_idx` argument from `training_step`"):
        Trainer(**{**QUIET, "max_steps": 1}).fit(WithIndex(), data(4, 4))

    class Two(WithIndex):
        def training_step(self, batch: Any, batch_idx: int) -> Any:  # type: ignore[override]
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(RuntimeError, match="only supported with manual optimization: Two.configure_optimizers "
                                           "returned 2 optimizers"):
        Trainer(**{**QUIET, "max_steps": 1}).fit(Two(), data(4, 4))
