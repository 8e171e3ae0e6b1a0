"""A GAN with two optimizers and manual optimisation (Lightning's basic GAN example, shrunk)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from tests.lightning_corpus.common import scalars, weights_summary


class GAN(pl.LightningModule):
    def __init__(self, latent_dim: int = 4, lr: float = 2e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent_dim, 16), nn.LeakyReLU(0.2), nn.Linear(16, 6))
        self.discriminator = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def training_step(self, batch):
        real, = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent_dim).type_as(real)
        bce = nn.functional.binary_cross_entropy_with_logits

        self.toggle_optimizer(opt_g)
        fake = self(z)
        g_loss = bce(self.discriminator(fake), torch.ones(real.shape[0], 1))
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        real_loss = bce(self.discriminator(real), torch.ones(real.shape[0], 1))
        fake_loss = bce(self.discriminator(self(z).detach()), torch.zeros(real.shape[0], 1))
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)

    def configure_optimizers(self):
        lr = self.hparams.lr
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))
        return [opt_g, opt_d], []


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(7, verbose=False)
    real = torch.randn(64, 6, generator=torch.Generator().manual_seed(1)) * 0.5 + 1.0
    loader = DataLoader(TensorDataset(real), batch_size=16, shuffle=True)
    model = GAN()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=workdir)
    trainer.fit(model=model, train_dataloaders=loader)
    return {"weights": weights_summary(model), "metrics": scalars(trainer.callback_metrics),
            "global_step": trainer.global_step}
