"""The Trainer's ways to the engine's big-model features: ``Trainer(precision="fp8")`` (torchao, as the engine's
``mixed_precision="fp8"``) and ``apply_activation_checkpointing`` in ``TrainModule.configure_model``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from engine.imports import is_torchao_available
from engine.utils import apply_activation_checkpointing
from tests.kernel_path import FP8_PINNED, cpu_runs_fp8_training
from tests.trainer.helpers import QUIET, data
from trainer import Trainer, TrainModule


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(torch.relu(self.fc1(x))))


class Stack(TrainModule):
    """Linear(3 -> 32), two blocks, Linear(32 -> 1): the blocks' layers are the ones fp8 converts."""

    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.checkpointed = checkpointed
        self.inp = nn.Linear(3, 32)
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.out = nn.Linear(32, 1)

    def configure_model(self) -> None:
        if self.checkpointed:  # called again on resume: the second call changes nothing
            apply_activation_checkpointing(self, [Block])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def test_checkpointed_blocks_train_to_the_same_weights_and_resume(tmp_path: Path) -> None:
    plain = Stack()
    Trainer(max_epochs=2, **QUIET).fit(plain, data(n=32, seed=1))
    checkpointed = Stack(checkpointed=True)
    Trainer(max_epochs=2, **QUIET).fit(checkpointed, data(n=32, seed=1))
    assert [n for n, m in checkpointed.named_modules() if type(m).__name__ == "CheckpointWrapper"] == \
        ["blocks.0", "blocks.1"]
    assert _weights(checkpointed).keys() == _weights(plain).keys()
    assert all(torch.equal(v, _weights(plain)[k]) for k, v in _weights(checkpointed).items())  # dropout included

    first = Trainer(max_epochs=1, **QUIET)
    first.fit(Stack(checkpointed=True), data(n=32, seed=1))
    first.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = Stack(checkpointed=True)
    Trainer(max_epochs=2, **QUIET).fit(resumed, data(n=32, seed=1), ckpt_path=str(tmp_path / "ckpt"))
    assert all(torch.equal(v, _weights(plain)[k]) for k, v in _weights(resumed).items())


@pytest.mark.skipif(not is_torchao_available(), reason='needs torchao: pip install "ember-train[fp8]"')
@pytest.mark.skipif(not cpu_runs_fp8_training(),
                    reason="torch's CPU fp8 training kernels need AVX512-FP16, which this CPU lacks")
def test_trainer_precision_fp8_converts_and_trains(run_distributed: Any) -> None:
    # In a child with oneDNN at the fp8 kernels' level (tests/kernel_path.py: FP8_PINNED).
    run_distributed(trainer_precision_fp8_converts_and_trains, 1, env=FP8_PINNED, launch_env=False)


def trainer_precision_fp8_converts_and_trains() -> None:
    module = Stack()
    before = _weights(module)
    trainer = Trainer(precision="fp8", max_epochs=1, **QUIET)
    trainer.fit(module, data(n=32, seed=1))
    assert trainer.precision == "fp8" and trainer.accelerator.mixed_precision == "fp8"
    kinds = {n: type(m).__name__ for n, m in module.named_modules() if isinstance(m, nn.Linear)}
    # The first and last registered Linear stay; inp (3 wide) would anyway.
    assert kinds == {"inp": "Linear", "blocks.0.fc1": "Float8Linear", "blocks.0.fc2": "Float8Linear",
                     "blocks.1.fc1": "Float8Linear", "blocks.1.fc2": "Float8Linear", "out": "Linear"}
    assert all(not torch.equal(v, before[k]) for k, v in _weights(module).items())  # every layer trained


@pytest.mark.parametrize("name", ["transformer-engine", "transformer-engine-float16"])
def test_lightnings_transformer_engine_precision_names_torchao(name: str) -> None:
    with pytest.raises(ValueError, match=f"Trainer\\(precision='{name}'\\) needs NVIDIA TransformerEngine, a GPU-only "
                                         "package Ember does not use. Ember trains in fp8 through torchao: "
                                         "Trainer\\(precision='fp8'\\)"):
        Trainer(precision=name)
