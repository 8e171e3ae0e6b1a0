"""Record Lightning's batch-transfer hooks order (tests/trainer/test_batch_transfer.py asserts it).

    /work/venvs/lconf/bin/python tests/parity_scripts/record_batch_transfer.py

A module overriding ``on_before_batch_transfer`` (x10) and ``on_after_batch_transfer`` (+1) trains on one loader
of 2 batches and validates on two loaders; printed: every hook and step call in order, with dataloader_idx.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

calls: list[tuple[object, ...]] = []


class Hooked(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        calls.append(("before", dataloader_idx))
        return batch * 10

    def on_after_batch_transfer(self, batch, dataloader_idx):
        calls.append(("after", dataloader_idx))
        return batch + 1

    def training_step(self, batch, batch_idx):
        calls.append(("step", batch.tolist()))
        return self.layer(batch[:, None]).sum()

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        calls.append(("val", batch.tolist(), dataloader_idx))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        calls.append(("predict", batch.tolist(), dataloader_idx))
        return batch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    model = Hooked()
    trainer.fit(model, DataLoader(torch.arange(4.0), batch_size=2),
                [DataLoader(torch.arange(2.0), batch_size=2), DataLoader(torch.arange(2.0), batch_size=2)])
    print("fit", calls)
    calls.clear()
    trainer.predict(model, DataLoader(torch.arange(2.0), batch_size=2))
    print("predict", calls)


if __name__ == "__main__":
    main()
