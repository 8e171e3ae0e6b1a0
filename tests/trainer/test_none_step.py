"""A ``training_step`` returning None, as Lightning 2.6: the batch's backward is skipped but the optimizer step of
its accumulation window still runs and counts (global step, per-step schedulers), and ``on_train_batch_end``
receives ``{}``. Values recorded from lightning 2.6.6 by tests/parity_scripts/record_none_step.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.trainer.helpers import QUIET
from trainer import Trainer, TrainModule

# accumulate_grad_batches -> ((global step, sorted keys of on_train_batch_end's outputs) per batch, final lr,
# weight, bias), as printed by record_none_step.py under the suite's pinned kernel path (tests/kernel_path.py).
LIGHTNING = {
    1: ([(1, ["loss"]), (2, []), (3, []), (4, ["loss"]), (5, ["loss"]), (6, ["loss"])], 0.0015625,
        [[0.5966377854347229, 0.7492218613624573, -0.06217629089951515]], [-0.7939402461051941]),
    2: ([(0, ["loss"]), (1, []), (1, []), (2, ["loss"]), (2, ["loss"]), (3, ["loss"])], 0.0125,
        [[0.4449285864830017, 0.6601953506469727, -0.0484134778380394]], [-0.5999483466148376]),
}


class Skipper(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)
        self.seen: list[tuple[int, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        if batch_idx in (1, 2):
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append((self.trainer.global_step, sorted(outputs) if isinstance(outputs, dict) else outputs))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.recorded_bits
def test_a_none_step_still_steps_and_counts_as_lightning(accumulate: int) -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(24, 3, generator=generator)
    module = Skipper()
    trainer = Trainer(**QUIET, max_epochs=1, accumulate_grad_batches=accumulate)
    trainer.fit(module, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    seen, lr, weight, bias = LIGHTNING[accumulate]
    assert module.seen == [(step, keys) for step, keys in seen]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(lr, rel=1e-12)
    assert module.net.weight.tolist() == weight and module.net.bias.tolist() == bias  # bit for bit
