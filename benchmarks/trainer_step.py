"""One torchrun worker of ``benchmarks/backends_vs_anchors.py`` for the Trainers: the same module through Lightning's
``Trainer`` or Ember's, by import swap.

    torchrun --nproc-per-node 2 benchmarks/trainer_step.py --framework ember --backend ddp --out result.json

``--framework``: ``ember`` (``from trainer import Trainer, TrainModule``) or ``lightning`` (``from lightning.pytorch
import ...``: run it with a Python that has Lightning). ``--backend``: ``ddp`` (``strategy="ddp"``) or ``tp``
(``ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)``: the module splits each pair of Linear
layers column- then row-wise in ``configure_model``). The model and step are ``backend_step.py``'s: ``--layers``
x ``Linear(--width, --width)``, AdamW, fp32, ``loss = out.square().mean()``; a callback times each training batch
from its ``on_train_batch_start`` to the next batch's (all the Trainer does per batch, in whichever hook) after
``--warmup`` batches and counts the collectives in the timed ones (``backend_step.count_collectives``). Rank 0 writes them to ``--out``.

The losses differ from Lightning's by design, not by arithmetic: Lightning puts a shuffling ``DistributedSampler``
on every training loader, Ember splits the loader's own order (the porting page's deliberate difference), so
the two Trainers train on other batches; the time and collectives per step are what compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backend_step import count_collectives  # a sibling script, imported after the path is set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", required=True, choices=("ember", "lightning"))
    parser.add_argument("--backend", required=True, choices=("ddp", "tp"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if args.framework == "ember":
        from trainer import Callback, Trainer, TrainModule
        from trainer.strategies import ModelParallelStrategy  # type: ignore[attr-defined]
    else:
        from lightning.pytorch import Callback, Trainer
        from lightning.pytorch import LightningModule as TrainModule
        from lightning.pytorch.strategies import ModelParallelStrategy
    counts = count_collectives()
    width, layers = args.width, args.layers

    class Stack(TrainModule):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

        def configure_model(self) -> None:
            if args.backend != "tp" or getattr(self, "_split", False):
                return
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            plan = {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(layers)}
            parallelize_module(self.net, self.device_mesh["tensor_parallel"], plan)
            self._split = True

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Clock(Callback):  # type: ignore[misc, valid-type]
        """A step is timed from one training batch's start to the next one's: everything the Trainer does per
        batch (fetching it, the hooks, forward, backward, the optimizer step, logging) falls inside, whichever
        hook each Trainer happens to do it in."""

        def __init__(self) -> None:
            self.starts: list[float] = []
            self.losses: list[float] = []

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == args.warmup:
                counts.clear()
            if batch_idx >= args.warmup:
                self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.losses.append(float(loss.detach()))

        @property
        def times(self) -> list[float]:
            return [(after - before) * 1000 for before, after in zip(self.starts, self.starts[1:])]

    total = args.warmup + args.steps
    generator = torch.Generator().manual_seed(1000)
    data = torch.utils.data.TensorDataset(torch.randn(total * args.batch * 2, width, generator=generator))
    # Tensor-parallel ranks share each batch (the strategy's sampler splits over the data-parallel dimension).
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch)
    strategy: Any = "ddp" if args.backend == "ddp" else ModelParallelStrategy(data_parallel_size=1,
                                                                              tensor_parallel_size=2)
    clock = Clock()
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=total, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[clock])
    trainer.fit(Stack(), loader)
    timed = len(clock.starts) or 1
    if trainer.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({"api": args.framework, "backend": args.backend, "built": f"{args.framework} Trainer",
                       "ms": clock.times, "median_ms": statistics.median(clock.times),
                       "collectives_per_step": {name: count / timed for name, count in sorted(counts.items())},
                       "last_loss": clock.losses[-1], "losses": clock.losses, "ops_per_step": 0.0, "save_ms": [], "load_ms": []}, f)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
