"""Record Lightning 2.6.6's EMAWeightAveraging on a tiny regression (run with /work/refvenv/bin/python).

Prints the averaged weights the trained module ends with, and the weights validation saw after epoch 0; the
values are pasted into tests/tools/test_weight_averaging.py (LIGHTNING_EMA_*).
"""
import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import lightning as L
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging
from torch.utils.data import DataLoader, TensorDataset


def data(n: int = 16, batch_size: int = 4) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=generator)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.norm = torch.nn.BatchNorm1d(3)
        self.seen: list[list[float]] = []

    def forward(self, x):
        return self.net(self.norm(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        self.seen.append(self.net.weight.detach().flatten().tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
model = Model()
trainer = L.Trainer(max_epochs=2, callbacks=[EMAWeightAveraging(decay=0.9)], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=0, accelerator="cpu")
trainer.fit(model, data(), data(n=8))
print("final net.weight", model.net.weight.detach().flatten().tolist(), "net.bias", model.net.bias.item())
print("validation after epoch 0", model.seen[0])
