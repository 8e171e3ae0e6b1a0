"""Record what Lightning does when ``training_step`` returns None (tests/trainer/test_none_step.py asserts it).

    /work/venvs/l26/bin/python tests/parity_scripts/record_none_step.py

A linear model, SGD with momentum and a per-step StepLR; the steps of batches 1 and 2 return None. Printed per
accumulation factor: the global step after each batch, what on_train_batch_end received, the final learning rate
and the final weights.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Skipper(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)
        self.seen: list[tuple[int, object]] = []

    def training_step(self, batch, batch_idx):
        if batch_idx in (1, 2):
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append((self.trainer.global_step, sorted(outputs) if isinstance(outputs, dict) else outputs))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(24, 3, generator=generator)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    for k in (1, 2):
        module = Skipper()
        trainer = Trainer(max_epochs=1, accumulate_grad_batches=k, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, DataLoader(data, batch_size=4))
        print(k, module.seen, trainer.optimizers[0].param_groups[0]["lr"],
              module.net.weight.tolist(), module.net.bias.tolist())


if __name__ == "__main__":
    main()
