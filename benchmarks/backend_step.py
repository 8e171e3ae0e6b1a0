"""One torchrun worker of ``benchmarks/backends_vs_anchors.py``: the same training step through one API.

    torchrun --nproc-per-node 2 benchmarks/backend_step.py --api engine --backend zero2 --out result.json

``--api``: ``engine`` (``from engine import Accelerator``), ``accelerate`` (``from accelerate import
Accelerator``: run it with a Python that has Accelerate), ``deepspeed`` (raw ``deepspeed.initialize``, for the
ZeRO backends) or ``torch`` (raw ``DistributedDataParallel`` / ``fully_shard``, for ddp and fsdp2).
``--backend``: ``ddp``, ``fsdp2``, ``zero1``, ``zero2``, ``zero3``, ``tp`` (tensor parallel over both processes: the
engine's ``tp_plan`` vs raw ``parallelize_module`` with the same plan; its all-reduces are functional collectives,
which the Python counter does not see: the aten count compares them).

The model is ``--layers`` x ``Linear(--width, --width)`` (seed 0), AdamW, fp32, a micro batch of ``--batch`` per
process; each step is forward, ``loss = out.square().mean()``, backward, optimizer step, zero_grad. Rank 0 writes
the per-step wall times of the ``--steps`` timed steps (after ``--warmup``) and the collectives each step made,
counted by wrapping ``torch.distributed``'s Python collectives (DDP's bucketed all-reduces run in C++ and are
not counted; both sides of a DDP comparison use the same reducer), to ``--out``. Nothing is compared here.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
                "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
                "broadcast_object_list", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
                "all_to_all", "all_to_all_single", "barrier", "all_reduce_coalesced", "all_gather_coalesced",
                "send", "recv", "isend", "irecv", "batch_isend_irecv", "_reduce_scatter_base", "_all_gather_base")


def count_collectives() -> collections.Counter[str]:
    """Wrap every Python collective of ``torch.distributed`` (both the package's and ``distributed_c10d``'s names,
    which callers reach either way) so each call adds one to the returned counter under its name. Only the
    outermost call counts: a deprecated collective that calls its successor, or an object collective that
    broadcasts sizes first, is one collective of the caller's."""
    counts: collections.Counter[str] = collections.Counter()
    depth = threading.local()
    for name in _COLLECTIVES:
        original = getattr(distributed_c10d, name, None)
        if original is None:
            continue

        def counted(*args: Any, __name: str = name, __original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            level = getattr(depth, "level", 0)
            if level == 0:
                counts[__name] += 1
            depth.level = level + 1
            try:
                return __original(*args, **kwargs)
            finally:
                depth.level = level

        for module in (dist, distributed_c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, counted)
    return counts


def model_and_optimizer(layers: int, width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def deepspeed_config(stage: int, batch: int) -> dict[str, Any]:
    """The config both Accelerate's and Ember's plugin would build for ``zero_stage=stage``, with the batch set."""
    return {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False, "gradient_clipping": 0.0, "steps_per_print": 10**9,
            "fp16": {"enabled": False}, "bf16": {"enabled": False}}


Checkpoint = tuple[Callable[[str], Any], Callable[[str], Any]]  # save(folder), load(folder)


def tp_plan(layers: int) -> dict[str, str]:
    """Each pair of Linear layers split column- then row-wise: one all-reduce per pair forward and backward."""
    return {str(i): "colwise" if i % 2 == 0 else "rowwise" for i in range(layers)}


def dcp_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Checkpoint:
    """Raw ``torch.distributed.checkpoint`` of the model and optimizer (what Ember's sharded layout writes, without
    its fsync, manifest and atomic commit)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def save(folder: str) -> None:
        weights, optim = get_state_dict(model, optimizer)
        dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=folder)

    def load(folder: str) -> None:
        weights, optim = get_state_dict(model, optimizer)
        state = {"model": weights, "optimizer": optim}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    return save, load


def build(api: str, backend: str, layers: int, width: int,
          batch: int) -> tuple[Callable[[torch.Tensor], float], str, Checkpoint | None]:
    """A function running one step on a batch (returns the loss), a description of what was built, and how each
    API saves and loads the state (``save_state`` / ``load_state``; raw DCP; DeepSpeed's own checkpoints)."""
    model, optimizer = model_and_optimizer(layers, width)
    stage = int(backend[-1]) if backend.startswith("zero") else None
    if api in ("engine", "accelerate"):
        if api == "engine":
            from engine import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig
        else:
            from accelerate import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
        # cpu=True for DDP and FSDP2 (without it, Accelerate on a machine without a GPU runs each process alone:
        # DistributedType.NO); not for DeepSpeed, whose plugin Accelerate drops under cpu=True.
        kwargs: dict[str, Any] = {"cpu": stage is None}
        if stage is not None:
            kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=deepspeed_config(stage, batch))
        elif backend == "fsdp2":
            kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
        elif backend == "tp":
            kwargs["parallelism_config"] = ParallelismConfig(tp_size=2)
            model.tp_plan = tp_plan(layers)  # type: ignore[assignment]  # the engine's attribute for a plan
        accelerator = Accelerator(**kwargs)
        model, optimizer = accelerator.prepare(model, optimizer)

        def step(x: torch.Tensor) -> float:
            loss = model(x).square().mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            return float(loss.detach())

        return step, f"{api} {accelerator.distributed_type}", (accelerator.save_state, accelerator.load_state)
    if api == "deepspeed":
        import deepspeed

        assert stage is not None, "--api deepspeed runs the ZeRO backends"
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config(stage, batch))

        def ds_step(x: torch.Tensor) -> float:
            loss = engine(x).square().mean()
            engine.backward(loss)
            engine.step()
            return float(loss.detach())

        return ds_step, "deepspeed", (engine.save_checkpoint, engine.load_checkpoint)
    if api == "torch":
        dist.init_process_group("gloo")
        if backend == "ddp":
            wrapped: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(model)
        elif backend == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            wrapped = fully_shard(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # over the sharded parameters
        elif backend == "tp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
            wrapped = parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)),
                                         {name: styles[style]() for name, style in tp_plan(layers).items()})
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # over the split parameters
        else:
            raise SystemExit(f"--api torch runs ddp, fsdp2 and tp, not {backend}")

        def torch_step(x: torch.Tensor) -> float:
            loss = wrapped(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return float(loss.detach())

        return torch_step, "torch", dcp_checkpoint(model, optimizer) if backend != "ddp" else None
    raise SystemExit(f"unknown --api {api!r}")


def ops_per_step(step: Callable[[torch.Tensor], float], batch: torch.Tensor, steps: int = 3) -> float:
    """torch operators a step dispatches (the profiler's count of every ``aten::`` call, counted, not timed): the
    same model through two APIs differs here only by what each adds around forward, backward and step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step(batch)
    return sum(event.count for event in prof.key_averages() if event.key.startswith("aten::")) / steps


def checkpoint_times(checkpoint: Checkpoint | None, out: str, rounds: int) -> tuple[list[float], list[float]]:
    """Wall ms of ``rounds`` saves (each into a new folder) and of the load of each, every process between two
    barriers; the folders are removed untimed."""
    saves: list[float] = []
    loads: list[float] = []
    if checkpoint is None:
        return saves, loads
    for round_ in range(rounds):
        folder = f"{out}.state{round_}"
        for action, record in ((checkpoint[0], saves), (checkpoint[1], loads)):
            dist.barrier()
            start = time.perf_counter()
            action(folder)
            dist.barrier()
            record.append((time.perf_counter() - start) * 1000)
        if int(os.environ.get("RANK", "0")) == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return saves, loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True, choices=("engine", "accelerate", "deepspeed", "torch"))
    parser.add_argument("--backend", required=True, choices=("ddp", "fsdp2", "zero1", "zero2", "zero3", "tp"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-rounds", type=int, default=0,
                        help="then time this many saves and loads of the whole state")
    parser.add_argument("--no-fsync", action="store_true",
                        help="measure what durability costs: os.fsync / os.fdatasync do nothing in this run")
    args = parser.parse_args()
    if args.no_fsync:
        os.fsync = os.fdatasync = lambda fd: None
    torch.set_num_threads(1)  # two processes on two cores: one thread each, the same for every API
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's deprecations, once per step otherwise
    counts = count_collectives()
    step, built, checkpoint = build(args.api, args.backend, args.layers, args.width, args.batch)
    rank = int(os.environ.get("RANK", "0"))
    # Tensor-parallel ranks compute on the same batch; data-parallel ones on their own.
    generator = torch.Generator().manual_seed(1000 + (0 if args.backend == "tp" else rank))
    batches = [torch.randn(args.batch, args.width, generator=generator) for _ in range(8)]
    for i in range(args.warmup):
        step(batches[i % len(batches)])
    dist.barrier()
    counts.clear()
    times, losses = [], []
    for i in range(args.steps):
        start = time.perf_counter()
        losses.append(step(batches[i % len(batches)]))
        times.append((time.perf_counter() - start) * 1000)
    per_step = {name: count / args.steps for name, count in sorted(counts.items())}
    ops = ops_per_step(step, batches[0])
    saves, loads = checkpoint_times(checkpoint, args.out, args.save_rounds)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"api": args.api, "backend": args.backend, "built": built, "ms": times,
                       "median_ms": statistics.median(times), "collectives_per_step": per_step,
                       "last_loss": losses[-1], "ops_per_step": ops, "save_ms": saves, "load_ms": loads}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
