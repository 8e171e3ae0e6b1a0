"""Record Lightning 2.6.6's lr_find on the regression of tests/tools/test_tuner.py (run with /work/refvenv/bin/python).

Prints the recorded learning rates, smoothed losses and the suggestion, pasted into test_tuner.py (LIGHTNING_*).
"""
import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import lightning as L
import torch
from lightning.pytorch.tuner import Tuner
from torch.utils.data import DataLoader, TensorDataset


def regression(n: int = 512, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    return TensorDataset(x, x @ torch.linspace(-1, 1, 8, dtype=torch.float32).unsqueeze(1))


class Model(L.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.norm = torch.nn.BatchNorm1d(8)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(self.norm(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


torch.manual_seed(0)
model = Model()
trainer = L.Trainer(max_epochs=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, accelerator="cpu")
finder = Tuner(trainer).lr_find(model, DataLoader(regression(), batch_size=16), min_lr=1e-5, max_lr=10.0,
                                num_training=60)
print("lrs", finder.results["lr"])
print("losses", finder.results["loss"])
print("suggestion", finder.suggestion())
