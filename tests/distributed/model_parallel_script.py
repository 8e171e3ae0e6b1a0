"""A tiny transformer trained with ``ModelParallelStrategy``: the same code runs under Lightning and under Ember.

    python model_parallel_script.py OUT_JSON --dp 2 --tp 2 [--variant sp] [--epochs 2] [--max-steps N] [--save DIR | --resume DIR]

``--tp 0`` runs the single-process reference (no strategy, ``configure_model`` leaves the model whole). The
Lightning names come from ``MODEL_PARALLEL_FRAMEWORK=lightning`` (``lightning.pytorch``); by default the script
imports Ember's (``trainer``), so a test runs the very code whose values were recorded from Lightning 2.6.6 by
tests/parity_scripts/record_model_parallel.py (the values are in model_parallel_expected.py).

Data: ``BATCHES`` steps per epoch, each data-parallel rank ``BATCH`` random sequences per step. The tokens come
from a fixed table indexed by (batch_idx, data-parallel rank), not from the loader: Lightning injects a *shuffling*
DistributedSampler (seed ``PL_GLOBAL_SEED``) into every training loader, so which samples a rank gets is
Lightning's choice, not the strategy's. The loader yields sample indices only; they are all-gathered over the
tensor-parallel group to record that tensor-parallel ranks are handed the same batch. The reference takes the
data-parallel ranks' batches together (``BATCH * dp`` per step), so its mean loss and gradient are the
data-parallel run's.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("MODEL_PARALLEL_FRAMEWORK", "ember") == "lightning":
    from lightning.pytorch import LightningModule as TrainModule
    from lightning.pytorch import Trainer, seed_everything
else:
    from trainer import Trainer, TrainModule, seed_everything

VOCAB, DIM, HEADS, HIDDEN, SEQ, BLOCKS = 32, 16, 2, 32, 8, 2
HEAD_DIM = DIM // HEADS
BATCH, BATCHES, SEED, DATA_SEED, LR = 2, 3, 7, 1234, 1e-2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism wq/wk/wv hold HEADS / tp heads on each rank.
        q, k, v = (w(x).view(b, s, -1, HEAD_DIM).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def tensor_parallel_plan(variant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(root plan, per-block plan) for ``parallelize_module``: ``"tp"`` column/row only, ``"sp"`` with
    sequence parallelism on the norms (activations between blocks sharded along the sequence)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if variant == "tp":
        root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                "output": ColwiseParallel(output_layouts=Replicate())}
        block = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                 "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                 "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()}
        return root, block
    root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    block = {"attention_norm": SequenceParallel(),
             "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
             "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
             "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
             "ffn_norm": SequenceParallel(),
             "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}
    return root, block


def _float32_list(t: torch.Tensor) -> list[float]:
    # Shortest decimal that reads back as the same float32: exact, and half the text of float64 reprs.
    return [float(np.format_float_positional(v, unique=True)) for v in t.detach().float().flatten().numpy()]


class LanguageModel(TrainModule):
    def __init__(self, variant: str = "tp", dp: int = 1) -> None:
        super().__init__()
        self.variant = variant
        self.model = TinyTransformer()
        g = torch.Generator().manual_seed(DATA_SEED)
        self.tokens = torch.randint(0, VOCAB, (BATCHES, dp, BATCH, SEQ + 1), generator=g)
        self.tp_same_batch: list[bool] = []
        self.sample_indices: list[list[int]] = []
        self.losses: list[float] = []
        self.hook_log: list[str] = []
        self.mesh_info: dict[str, Any] = {}
        self.result: dict[str, Any] = {}

    def setup(self, stage: str) -> None:
        self.hook_log.append(f"setup:{getattr(stage, 'value', stage)}")  # Lightning passes a str enum

    def configure_model(self) -> None:
        self.hook_log.append("configure_model")
        mesh = self.device_mesh
        if mesh is None or "tensor_parallel" not in (mesh.mesh_dim_names or ()):
            return  # the single-process reference: the model stays whole
        if self.mesh_info:
            return  # already parallelized (the hook runs once per fit / validate / ... in one process)
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        self.mesh_info = {"dim_names": list(mesh.mesh_dim_names), "shape": list(mesh.shape),
                          "param_device": str(next(self.parameters()).device)}
        tp_mesh, dp_mesh = mesh["tensor_parallel"], mesh["data_parallel"]
        root, block = tensor_parallel_plan(self.variant)
        parallelize_module(self.model, tp_mesh, root)
        for layer in self.model.layers:
            parallelize_module(layer, tp_mesh, block)
        if dp_mesh.size() > 1:
            for layer in self.model.layers:
                fully_shard(layer, mesh=dp_mesh)
            fully_shard(self.model, mesh=dp_mesh)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.hook_log.append("configure_optimizers")
        return torch.optim.AdamW(self.parameters(), lr=LR)

    def on_fit_start(self) -> None:
        self.hook_log.append("on_fit_start")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        (indices,) = batch
        self.sample_indices.append(indices.tolist())
        mesh = self.device_mesh
        if mesh is not None and "tensor_parallel" in (mesh.mesh_dim_names or ()):
            tp_group = mesh["tensor_parallel"]
            seen: list[Any] = [None] * tp_group.size()
            dist.all_gather_object(seen, indices.tolist(), group=tp_group.get_group())
            self.tp_same_batch.append(all(s == seen[0] for s in seen))
            data = self.tokens[batch_idx, mesh["data_parallel"].get_local_rank()]
        else:
            data = self.tokens[batch_idx].flatten(0, 1)  # the reference: every data-parallel rank's batch
        tokens, targets = data[:, :-1], data[:, 1:]
        logits = self.model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        self.losses.append(float(loss.detach()))
        return loss

    def on_train_end(self) -> None:
        # Collectives: every rank gathers the full weights and every rank's losses, in the same order.
        weights = {}
        for name, value in self.model.state_dict().items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            weights[name] = _float32_list(full)
        mine: dict[str, Any] = {"losses": self.losses, "tp_same_batch": self.tp_same_batch,
                                "sample_indices": self.sample_indices}
        ranks: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized():
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, mine)
        self.result = {"weights": weights, **{key: [r[key] for r in ranks] for key in mine}}


def data(dp: int, batch_size: int) -> DataLoader:
    """Sample indices, ``BATCHES`` steps of ``BATCH`` per data-parallel rank (the tokens come from the module)."""
    return DataLoader(TensorDataset(torch.arange(BATCH * BATCHES * dp)), batch_size=batch_size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=2, help="0: single-process reference without a strategy")
    parser.add_argument("--variant", choices=("tp", "sp"), default="tp")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop fit after this many steps (mid-epoch)")
    parser.add_argument("--save", help="trainer.save_checkpoint(SAVE) after fit")
    parser.add_argument("--resume", help="fit(..., ckpt_path=RESUME)")
    parser.add_argument("--full-checkpoint", action="store_true", help="save_distributed_checkpoint=False")
    args = parser.parse_args()

    torch.set_num_threads(1)  # same reductions in every run, whatever the machine
    seed_everything(SEED)
    model = LanguageModel(args.variant, args.dp)
    if args.tp == 0:
        loader = data(args.dp, BATCH * args.dp)
        strategy: Any = "auto"
        devices = 1
    else:
        if os.environ.get("MODEL_PARALLEL_FRAMEWORK", "ember") == "lightning":
            from lightning.pytorch.strategies import ModelParallelStrategy
        else:
            from trainer.strategies import ModelParallelStrategy  # type: ignore[attr-defined]
        options = {"save_distributed_checkpoint": False} if args.full_checkpoint else {}
        strategy = ModelParallelStrategy(data_parallel_size=args.dp, tensor_parallel_size=args.tp, **options)
        loader, devices = data(args.dp, BATCH), args.dp * args.tp
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=args.epochs,
                      max_steps=args.max_steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader, ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    if trainer.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({**model.result, "world_size": trainer.world_size, "global_step": trainer.global_step,
                       "hook_log": model.hook_log, "mesh": model.mesh_info,
                       # Ember's promise (issue 43): the module's mesh is the engine's, not a second one.
                       "one_mesh": getattr(trainer, "accelerator", None) is not None
                       and model.device_mesh is getattr(trainer.accelerator, "torch_device_mesh", None)}, f)


if __name__ == "__main__":
    main()
