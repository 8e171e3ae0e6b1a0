"""A LightningModule, a manual-optimisation GAN and a LightningDataModule, written for Lightning 2.x.

They were ported to Ember by changing only the import lines; the original ones were::

    import lightning.pytorch as L
    from lightning.pytorch import LightningDataModule, LightningModule

Everything below the imports is Lightning code, unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from trainer import DataModule as LightningDataModule
from trainer import TrainModule as LightningModule


def blobs(n: int, seed: int = 0) -> TensorDataset:
    """Two Gaussian blobs in 2-D, labels 0 / 1."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2, generator=generator) * 0.5 + (y.float().unsqueeze(1) * 2 - 1) * 1.5
    return TensorDataset(x, y)


class LitClassifier(LightningModule):
    def __init__(self, lr: float = 0.05, optimizer_form: str = "dict_config", batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
        self.epoch_losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        self.log_dict({"train_acc": acc}, on_step=False, on_epoch=True)
        return {"loss": loss, "acc": acc, "logits": logits}

    def on_train_epoch_end(self):
        self.epoch_losses.append(self.trainer.callback_metrics["train_loss_epoch"].item())

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(dim=1) == y).float().mean())

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, _ = batch
        return self(x).argmax(dim=1)

    def configure_optimizers(self):
        form = self.hparams.optimizer_form
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        if form == "optimizer":
            return opt
        if form == "list":
            return [opt]
        if form == "two_lists":
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)]
        if form == "dict":
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)}
        if form == "dict_config":
            scheduler = torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=self.hparams.lr, total_steps=self.trainer.estimated_stepping_batches)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
        if form == "plateau":
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min"),
                    "monitor": "val_loss"}
        if form == "list_of_dicts":
            return [{"optimizer": opt, "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9), "interval": "epoch"}}]
        raise ValueError(form)

    def train_dataloader(self):
        return DataLoader(blobs(64), batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(blobs(32, seed=1), batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(blobs(32, seed=2), batch_size=self.hparams.batch_size)

    def predict_dataloader(self):
        return DataLoader(blobs(20, seed=3), batch_size=self.hparams.batch_size)


class LitGAN(LightningModule):
    """Manual optimisation with two optimizers, as in Lightning's GAN example."""

    def __init__(self, latent: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, 8), nn.ReLU(), nn.Linear(8, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
        self.optimizer_types: list[bool] = []

    def training_step(self, batch, batch_idx):
        real, _ = batch
        g_opt, d_opt = self.optimizers()
        self.optimizer_types.append(isinstance(g_opt, torch.optim.Optimizer))
        z = torch.randn(real.shape[0], self.hparams.latent, device=self.device)
        ones = torch.ones(real.shape[0], 1, device=self.device)

        self.toggle_optimizer(d_opt)
        fake = self.generator(z).detach()
        d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake), torch.zeros_like(ones)))
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        self.untoggle_optimizer(d_opt)

        self.toggle_optimizer(g_opt)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def on_train_epoch_end(self):
        for scheduler in self.lr_schedulers():
            scheduler.step()

    def configure_optimizers(self):
        g_opt = torch.optim.Adam(self.generator.parameters(), lr=1e-3)
        d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=1e-3)
        return [g_opt, d_opt], [torch.optim.lr_scheduler.StepLR(g_opt, 1, gamma=0.5),
                                torch.optim.lr_scheduler.StepLR(d_opt, 1, gamma=0.5)]


class BlobsDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 16, n: int = 96) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.stages: list[str] = []

    def prepare_data(self):
        self.prepared = True  # e.g. a download; runs once per machine

    def setup(self, stage: str):
        self.stages.append(stage)
        if stage == "fit":
            self.train_set, self.val_set = random_split(blobs(self.hparams.n), [self.hparams.n - 32, 32],
                                                        generator=torch.Generator().manual_seed(0))
        if stage in ("test", "predict"):
            self.test_set = blobs(32, seed=5)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)
