"""A GPT-style language model (weight tying, pre-norm blocks, scaled-dot-product attention with dropout) trained
with bf16-mixed, gradient clipping and accumulation, a warm-up + cosine schedule over the estimated steps, and
validation every few optimizer steps across epochs."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from tests.lightning_corpus.common import scalars, weights_summary


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(pl.LightningModule):
    def __init__(self, vocab: int = 64, block: int = 16, dim: int = 32, lr: float = 3e-3, warmup: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.blocks = nn.Sequential(Block(dim, 4, 0.1), Block(dim, 4, 0.1))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1).float(), y.flatten())
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).flatten(0, 1).float(), y.flatten()))

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.named_parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": no_decay, "weight_decay": 0.0}, {"params": decay}],
                                      lr=self.hparams.lr, betas=(0.9, 0.95), weight_decay=0.1)
        total, warmup = max(1, int(self.trainer.estimated_stepping_batches)), self.hparams.warmup

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(workdir: str) -> dict[str, Any]:
    pl.seed_everything(5, verbose=False)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, 64, (100, 17), generator=g)
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    model = TinyGPT()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0,
                         accumulate_grad_batches=3, val_check_interval=6, check_val_every_n_epoch=None,
                         limit_val_batches=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, log_every_n_steps=2)
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16))
    return {"weights": weights_summary(model), "metrics": scalars(trainer.callback_metrics),
            "global_step": trainer.global_step}
