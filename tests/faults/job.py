"""The fault fuzzer's job: a small Trainer run on one backend that can SIGKILL one of its ranks at a chosen point.

Two epochs of 6 batches per rank, shuffled, with dropout, gradient accumulation 2, validation every 4 batches and
a checkpoint after every optimizer step (``ModelCheckpoint(every_n_train_steps=1)``, optionally ``async_save``),
so a kill lands among saves, evaluations and accumulation windows. ``--kill POINT:RANK:NTH:DELAY_MS`` makes rank
RANK SIGKILL itself DELAY_MS after the NTH time it reaches POINT:

- ``save``: a checkpoint save starts (the kill lands inside it, or inside its background write with async saves);
- ``eval``: a validation batch starts;
- ``accum``: a batch ended without an optimizer step (between the micro-batches of one step);
- ``train``: a training batch starts.

Rank 0 writes ``{dir}/final.pt`` (the full weights, gathered from shards), ``{dir}/counts_{rank}.json`` (how often
each rank reached each point, for the fuzzer to pick NTH) and appends where each start began to
``{dir}/starts.txt``.

    python -m torch.distributed.run --nproc-per-node 2 tests/faults/job.py --dir D --backend ddp [--kill save:1:3:20]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import Callback, ModelCheckpoint
from trainer import Trainer, TrainModule

# How many processes each backend runs on (the fuzzer launches them with torchrun when more than one).
BACKENDS: dict[str, int] = {"single": 1, "ddp": 2, "fsdp2": 2, "deepspeed2": 2, "deepspeed3": 2, "tp": 2,
                            "dp2xtp2": 4}
POINTS = ("save", "eval", "accum", "train")
BATCH, BATCHES = 4, 6  # per rank and step, per epoch


class Net(TrainModule):
    def __init__(self, parallel: bool) -> None:
        super().__init__()
        self.parallel = parallel
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                       torch.nn.Linear(32, 1))

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if not self.parallel or mesh is None or getattr(self, "_parallelized", False):
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(self.net, mesh["tensor_parallel"], {"0": ColwiseParallel(), "3": RowwiseParallel()})
        if mesh["data_parallel"].size() > 1:
            fully_shard(self.net, mesh=mesh["data_parallel"])
        self._parallelized = True

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def datasets(data_parallel: int) -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * BATCHES * data_parallel, 8, generator=generator)
    vx = torch.randn(4 * data_parallel * 2, 8, generator=generator)
    return TensorDataset(x, x[:, :3].sum(1, keepdim=True)), TensorDataset(vx, vx[:, :3].sum(1, keepdim=True))


class Fault(Callback):
    """Counts each point per rank; SIGKILLs this rank ``delay`` seconds after the ``nth`` arrival at ``point``."""

    def __init__(self, spec: str | None, rank: int) -> None:
        self.counts = dict.fromkeys(POINTS, 0)
        self.rank = rank
        self.point, self.nth, self.delay = None, 0, 0.0
        if spec:
            point, kill_rank, nth, delay_ms = spec.split(":")
            if int(kill_rank) == rank:
                self.point, self.nth, self.delay = point, int(nth), float(delay_ms) / 1000

    def reached(self, point: str) -> None:
        self.counts[point] += 1
        if point == self.point and self.counts[point] == self.nth:
            if self.delay <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
            timer = threading.Timer(self.delay, os.kill, args=(os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.reached("train")

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.state.micro_step % 2 == 1 and trainer.state.batch_in_epoch < BATCHES:
            self.reached("accum")  # the first micro-batch of a step is done, its step not taken

    def on_validation_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self.reached("eval")


def strategy_of(backend: str) -> Any:
    if backend in ("single", "ddp"):
        return "auto"
    if backend == "fsdp2":
        from trainer.strategies import FSDPStrategy

        return FSDPStrategy()
    if backend.startswith("deepspeed"):
        from trainer.strategies import DeepSpeedStrategy

        strategy = DeepSpeedStrategy(stage=int(backend[-1]))
        strategy.config["zero_force_ds_cpu_optimizer"] = False  # torch's AdamW: no compiled optimizer to build
        return strategy
    from trainer.strategies import ModelParallelStrategy

    return ModelParallelStrategy(data_parallel_size=2 if backend == "dp2xtp2" else 1, tensor_parallel_size=2)


def full_weights(trainer: Trainer, module: Net, backend: str) -> dict[str, torch.Tensor]:
    """Every parameter in full on rank 0 (a collective: every rank calls it)."""
    if backend == "deepspeed3":  # ZeRO-3's partitions, gathered in their own precision
        import deepspeed

        params = list(module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
            return {name: p.detach().clone() for name, p in params}
    state = trainer.accelerator.get_state_dict(trainer.plan.model)
    return {name: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().cpu().clone()
            for name, value in state.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--backend", choices=sorted(BACKENDS), required=True)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--kill", default=None, help="POINT:RANK:NTH:DELAY_MS")
    parser.add_argument("--ckpt-path", default=None)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the fuzzer asks for stacks before giving up
    os.makedirs(args.dir, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    backend = args.backend
    fault = Fault(args.kill, rank)

    checkpoint = ModelCheckpoint(dirpath=os.path.join(args.dir, "checkpoints"), every_n_train_steps=1,
                                 async_save=args.async_save)
    trainer = Trainer(accelerator="cpu", devices=BACKENDS[backend], strategy=strategy_of(backend), max_epochs=2,
                      accumulate_grad_batches=2, val_check_interval=4, seed=0, deterministic=True,
                      callbacks=[fault, checkpoint], log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, project_dir=args.dir)
    real_save = trainer.accelerator.save_state

    def save_state(*a: Any, **k: Any) -> Any:
        fault.reached("save")
        return real_save(*a, **k)

    trainer.accelerator.save_state = save_state  # type: ignore[method-assign]
    real_values = trainer.accelerator.state_values  # a .ckpt file's save starts here (one process, DDP)

    def state_values(*a: Any, **k: Any) -> Any:
        fault.reached("save")
        return real_values(*a, **k)

    trainer.accelerator.state_values = state_values  # type: ignore[method-assign]
    data_parallel = {"dp2xtp2": 2, "tp": 1}.get(backend, BACKENDS[backend])
    train, val = datasets(data_parallel)
    # Model parallelism hands every tensor-parallel rank the same batch: the global batch is per data-parallel rank.
    loader = DataLoader(train, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(2))
    module = Net(parallel=backend in ("tp", "dp2xtp2"))

    class Where(Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            if trainer.is_global_zero:
                with open(os.path.join(args.dir, "starts.txt"), "a") as handle:
                    handle.write(f"{trainer.current_epoch} {trainer.state.batch_in_epoch} {trainer.global_step}\n")

    trainer.callbacks.append(Where())
    trainer.fit(module, loader, DataLoader(val, batch_size=4), ckpt_path=args.ckpt_path)
    weights = full_weights(trainer, module, backend)
    with open(os.path.join(args.dir, f"counts_{rank}.json"), "w") as handle:
        json.dump(fault.counts, handle)
    if trainer.is_global_zero:
        torch.save({"weights": weights, "global_step": trainer.global_step}, os.path.join(args.dir, "final.pt"))


if __name__ == "__main__":
    main()
