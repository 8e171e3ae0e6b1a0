"""A small character-level transformer trained on Python's own standard library source, with Ember's Trainer.

    python examples/char_lm.py                 # ~0.9 M parameters, 200 steps: ~5 minutes on 2 CPU cores
    python examples/char_lm.py                 # again: resumes from the last checkpoint (or, if finished, samples)
    python examples/char_lm.py --max-steps 400 # train further from where the last run ended

The text is the source of a few standard-library modules (nothing to download), read as UTF-8 bytes: the
vocabulary is the 256 byte values. Shown here: bf16 autocast (``mixed_precision="bf16"``) where the CPU computes
bf16 natively (AVX512-BF16 / AMX; elsewhere bf16 is slower than fp32, so ``--precision auto`` picks fp32), gradient
accumulation, gradient clipping, a warm-up + cosine learning-rate schedule stepped
every optimizer step, step-based validation and checkpoints, resume with ``ckpt_path="last"``, and sampling.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from callbacks import ModelCheckpoint
from engine.precision.cpu_features import cpu_flags, native_bf16
from trainer import Trainer, TrainModule

MODULES = ("argparse", "dataclasses", "functools", "inspect", "pathlib", "textwrap", "typing", "collections",
           "json.decoder", "json.encoder", "csv", "shutil", "tempfile", "logging", "enum", "string")


def stdlib_text(modules: tuple[str, ...] = MODULES) -> bytes:
    """The source of ``modules``, concatenated, as UTF-8 bytes (~1 MB with the default list)."""
    return "\n\n".join(inspect.getsource(importlib.import_module(name)) for name in modules).encode()


class Windows(Dataset):
    """Consecutive ``block + 1`` byte windows of ``data``: the input is the first ``block``, the target the last."""

    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data, self.block = data, block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.block: (i + 1) * self.block + 1].long()
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each added to the residual stream."""

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


class CharLM(TrainModule):
    """A GPT-style byte-level language model."""

    def __init__(self, block: int = 128, dim: int = 128, layers: int = 4, heads: int = 4, dropout: float = 0.0,
                 lr: float = 2e-3, warmup: int = 40) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Embedding(block, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256, bias=False)
        self.head.weight = self.tok.weight  # weight tying: fewer parameters, better small models
        for module in self.modules():  # GPT-2's initialisation: small weights keep the first logits near uniform
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1).float(), y.flatten())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)  # runs under autocast when mixed_precision is set: the trainer wraps the steps
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/bits_per_byte", loss / math.log(2))

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, betas=(0.9, 0.95), weight_decay=0.1)
        total, warmup = max(1, int(self.trainer.estimated_stepping_batches)), self.hparams.warmup

        def factor(step: int) -> float:  # linear warm-up, then cosine decay to 10% of the peak
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @torch.no_grad()
    def generate(self, prompt: bytes, length: int, temperature: float = 0.7, top_k: int = 40) -> bytes:
        """Continue ``prompt`` by ``length`` bytes, sampling from the ``top_k`` most likely at ``temperature``."""
        was_training = self.training
        self.eval()
        idx = torch.tensor([list(prompt)], device=self.head.weight.device)
        for _ in range(length):
            logits = self(idx[:, -self.hparams.block:])[0, -1].float() / temperature
            kth = torch.topk(logits, top_k).values[-1]
            probs = torch.softmax(logits.masked_fill(logits < kth, -math.inf), dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1)[None]], dim=1)
        self.train(was_training)
        return bytes(idx[0].tolist())


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-dir", default="runs/char_lm")
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps (each of --accumulate batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--block", type=int, default=128, help="context length in bytes")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--val-every", type=int, default=50, help="validate and checkpoint every N optimizer steps")
    parser.add_argument("--val-batches", type=int, default=10)
    parser.add_argument("--sample-bytes", type=int, default=300)
    parser.add_argument("--precision", choices=("auto", "bf16", "no"), default="auto",
                        help="autocast dtype: auto = bf16 where this CPU computes bf16 natively, else fp32 ('no')")
    args = parser.parse_args(argv)
    precision = args.precision
    if precision == "auto":
        precision = "bf16" if native_bf16(cpu_flags()) else "no"

    # Trainer first: seed=0 then also fixes the model's initial weights.
    trainer = Trainer(
        accelerator="cpu", mixed_precision=precision, max_steps=args.max_steps, accumulate_grad_batches=args.accumulate,
        gradient_clip_val=1.0, val_check_interval=args.val_every * args.accumulate, check_val_every_n_epoch=None,
        limit_val_batches=args.val_batches, num_sanity_val_steps=0, log_every_n_steps=10, seed=0,
        log_with="csv", project_dir=args.project_dir, project_name="char_lm", enable_model_summary=True,
        callbacks=[ModelCheckpoint(every_n_train_steps=args.val_every, save_top_k=-1, save_last="link",
                                   filename="step={step}")])
    model = CharLM(block=args.block, dim=args.dim, layers=args.layers, heads=max(1, args.dim // 32))

    data = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8)
    split = int(0.95 * len(data))
    train = DataLoader(Windows(data[:split], args.block), batch_size=args.batch_size, shuffle=True, drop_last=True)
    val = DataLoader(Windows(data[split:], args.block), batch_size=args.batch_size)
    print(f"{len(data) / 1e6:.2f} MB of standard-library source; {len(train)} training batches per epoch")

    # The same command resumes from the newest checkpoint under --project-dir, or starts fresh when there is none.
    trainer.fit(model, train, val, ckpt_path="last")
    print(f"Trained to step {trainer.global_step}; val/loss {float(trainer.callback_metrics['val/loss']):.3f} "
          f"({float(trainer.callback_metrics['val/bits_per_byte']):.2f} bits per byte); checkpoints in "
          f"{Path(args.project_dir) / 'checkpoints'}")

    torch.manual_seed(1)
    sample = model.generate(b"def ", args.sample_bytes).decode("utf-8", errors="replace")
    print("\nSample:\n" + "\n".join(sample.splitlines()[:8]))
    return sample


if __name__ == "__main__":
    main()
