"""`python deepspeed_script.py RUN_JSON OUT_JSON` on 2 processes (torchrun, or devices=2 from one process).

A LightningModule trained a few steps under a DeepSpeed strategy (a Lightning strategy string or
``DeepSpeedStrategy(**kwargs)``), ``accelerator="cpu"``, 2 devices, accumulation 2, clipping 1.0, a
ModelCheckpoint saving every epoch. Process 0 writes OUT_JSON: the strategy's DeepSpeed config after fit, the
losses of both processes per batch, the full weights (gathered with ``deepspeed.zero.GatheredParameters``, a no-op
below ZeRO-3) as summaries and a sha256, and the files each checkpoint holds. ``ckpt_path`` in RUN_JSON resumes.

Written with Ember's imports; tests/parity_scripts/record_deepspeed_lightning.py turns them into Lightning's
(nothing else changes) to record tests/lightning_corpus/deepspeed_expected.py.

RUN_JSON keys: strategy (a string) or strategy_kwargs (a dict for DeepSpeedStrategy), precision ("32" or
"bf16-mixed"), force_ds_cpu_optimizer (False: let DeepSpeed run torch's AdamW on offloaded states; None: leave
the config alone), persistence_threshold (ZeRO-3: 0 partitions every parameter; None: DeepSpeed's default),
ckpt_path, max_epochs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import ModelCheckpoint
from trainer.strategies import DeepSpeedStrategy


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 20, generator=g)
    y = torch.tanh(x @ torch.randn(20, 4, generator=g)) + 0.1 * torch.randn(64, 4, generator=g)
    return TensorDataset(x, y)


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 48)
        self.fc2 = nn.Linear(48, 4)
        self.losses: list[list[float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x).float(), y)
        self.log("train_loss", loss)
        self.losses.append([float(v) for v in self.all_gather(loss.detach())])
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def full_weights(model: nn.Module) -> tuple[dict[str, list[Any]], str]:
    params = list(model.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        tensors = {name: p.detach().clone() for name, p in params}
    out, digest = {}, hashlib.sha256()
    for name, t in tensors.items():
        f = t.to(torch.float32).contiguous()
        d = f.double()
        out[name] = [str(t.dtype), list(t.shape), float(d.sum()), float(d.abs().sum()),
                     [float(v) for v in d.flatten()[:3]]]
        digest.update(name.encode())
        digest.update(f.numpy().tobytes())
    return out, digest.hexdigest()


def listing(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(folder, n), root) for folder, _, names in os.walk(root) for n in names)


def main(run: dict[str, Any], out_path: str) -> None:
    workdir = os.path.dirname(os.path.abspath(out_path))
    pl.seed_everything(42, verbose=False)
    strategy = DeepSpeedStrategy(**run["strategy_kwargs"]) if "strategy_kwargs" in run else run["strategy"]
    checkpoints = os.path.join(workdir, "checkpoints")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, precision=run.get("precision", "32"),
                         max_epochs=run.get("max_epochs", 2), accumulate_grad_batches=2, gradient_clip_val=1.0,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=workdir,
                         callbacks=[ModelCheckpoint(dirpath=checkpoints, save_top_k=-1, every_n_epochs=1)])
    config_before = json.loads(json.dumps(trainer.strategy.config))
    if run.get("force_ds_cpu_optimizer", False) is False:
        trainer.strategy.config["zero_force_ds_cpu_optimizer"] = False
    zero = trainer.strategy.config.get("zero_optimization", {})
    if zero.get("stage") == 3 and run.get("persistence_threshold", 0) is not None:
        zero["stage3_param_persistence_threshold"] = run.get("persistence_threshold", 0)
    model = Regressor()
    trainer.fit(model, DataLoader(make_data(), batch_size=4), ckpt_path=run.get("ckpt_path"))
    weights, sha = full_weights(model)
    record = {"strategy_type": type(trainer.strategy).__name__, "config_before_fit": config_before,
              "config": trainer.strategy.config, "precision": str(trainer.precision),
              "world_size": trainer.world_size, "global_step": trainer.global_step, "losses": model.losses,
              "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
              "weights": weights, "sha256": sha,
              "checkpoints": {name: listing(os.path.join(checkpoints, name)) if os.path.isdir(
                  os.path.join(checkpoints, name)) else "file" for name in sorted(os.listdir(checkpoints))}}
    if trainer.global_rank == 0:
        with open(out_path, "w") as f:
            json.dump(record, f, indent=1)
    # Leave together: a process that exits while the other still gathers makes the other one fail.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f), sys.argv[2])
