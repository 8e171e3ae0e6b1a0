"""The engine under a ``ParallelismConfig``: a tiny transformer with a ``tp_plan`` trained on a device mesh.

    python -m torch.distributed.run --nproc-per-node N tensor_parallel_script.py OUT_JSON RUN_JSON

RUN_JSON: ``{"config": {ParallelismConfig kwargs} or null, "plan": "tp" | "sp", "steps": 6,
"save_at": step or null, "state_dir": dir, "resume_from": dir or null, "resume_at": step, "reference": bool,
"clip": max_norm, "zero_grad": "first" | "last"}`` (``steps == resume_at``: only load, to compare the loaded weights).
Each step: forward, backward, ``clip_grad_norm_(1.0)``, optimizer step. Every process records its losses and
gradient norms; process 0 writes them with the full weights (``get_state_dict``), what ``gather_for_metrics``
gave on an evaluation loader, each process's batches, and, with ``"reference"``, the same training in this
process alone without any Accelerator on the data-parallel ranks' batches taken together.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_parallel_script import SEQ, VOCAB, TinyTransformer  # the model Lightning's values were recorded on

from engine import Accelerator, ParallelismConfig

SAMPLES, BATCH, LR, SEED = 48, 2, 1e-2, 7
CLIP = float(os.environ.get("TP_CLIP", "1.0"))


def plan(variant: str) -> dict[str, Any]:
    """The model's ``tp_plan``: style names and wildcards; ``"sp"`` adds sequence parallelism (torchtitan's)."""
    if variant == "tp":
        return {"tok_embeddings": "rowwise_rep", "output": "colwise_rep",
                "layers.*.attention.wq": "colwise", "layers.*.attention.wk": "colwise",
                "layers.*.attention.wv": "colwise", "layers.*.attention.wo": "rowwise",
                "layers.*.feed_forward.w1": "colwise", "layers.*.feed_forward.w2": "rowwise"}
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    to_sequence = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": "sequence_parallel",
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            "layers.*.attention_norm": "sequence_parallel", "layers.*.attention": to_sequence,
            "layers.*.attention.wq": "colwise", "layers.*.attention.wk": "colwise",
            "layers.*.attention.wv": "colwise", "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "layers.*.ffn_norm": "sequence_parallel", "layers.*.feed_forward": to_sequence,
            "layers.*.feed_forward.w1": "colwise", "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}


def data() -> torch.Tensor:
    return torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=torch.Generator().manual_seed(1234))


def loss_of(model: torch.nn.Module, batch: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1), reduction=reduction)
    return loss if reduction == "mean" else loss.view(batch.shape[0], -1).mean(dim=1)


def reference(steps: int, batch: int) -> dict[str, Any]:
    """The same training in one process, each step on ``batch`` samples (all data-parallel ranks' together)."""
    torch.manual_seed(SEED)
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens, losses, norms = data(), [], []
    for step in range(steps):
        loss = loss_of(model, tokens[step * batch:(step + 1) * batch])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        gathered = loss_of(model, tokens[:5], reduction="none").tolist()
    return {"losses": losses, "norms": norms, "gathered": gathered,
            "weights": {k: v.flatten().tolist() for k, v in model.state_dict().items()}}


def _reachable(mesh: Any, name: str) -> bool:
    try:
        mesh[name]
    except (KeyError, RuntimeError, ValueError):
        return False
    return True


def main(out: str, run: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    config = ParallelismConfig(**run["config"]) if run.get("config") is not None else None
    accelerator = Accelerator(parallelism_config=config)
    torch.manual_seed(SEED)
    model = TinyTransformer()
    model.tp_plan = plan(run.get("plan", "tp"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(data()), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(loader)
    if run.get("resume_from"):
        accelerator.load_state(run["resume_from"])
    start = run.get("resume_at", 0)
    # "zero_grad": "first" zeroes before backward (Lightning's order): a save after the step then holds the
    # gradients, each rank its part of them laid out as its part of the parameter.
    zero_first = run.get("zero_grad") == "first"
    losses, norms, batches, saved = [], [], [], None
    for step, (batch,) in enumerate(loader, start=start):
        if step >= run["steps"]:
            break
        batches.append(batch[:, 0].tolist())
        if zero_first:
            optimizer.zero_grad()
        loss = loss_of(model, batch)
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), run.get("clip", 1.0))))
        optimizer.step()
        if not zero_first:
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if run.get("save_at") == step + 1:
            accelerator.save_state(os.path.join(run["state_dir"], f"state_{step + 1}"))
            saved = {k: v.flatten().tolist() for k, v in accelerator.get_state_dict(model).items()}
    eval_loader = accelerator.prepare(DataLoader(TensorDataset(data()[:5]), batch_size=BATCH))
    gathered = []
    with torch.no_grad():
        for (batch,) in eval_loader:
            gathered += accelerator.gather_for_metrics(loss_of(model, batch, reduction="none")).tolist()
    state = accelerator.get_state_dict(model)
    # What Accelerate's recording saw on the same mesh: each dimension's local rank, and which indices of
    # DataLoader(range(16), batch_size=2) each process gets.
    mesh = accelerator.torch_device_mesh
    names = ("dp_replicate", "dp_shard", "tp", "dp", "dp_shard_cp", "dp_cp")
    local_ranks = {} if mesh is None else {n: mesh[n].get_local_rank() for n in names if _reachable(mesh, n)}
    probe = [b.tolist() for b in accelerator.prepare(DataLoader(list(range(16)), batch_size=2))]
    mine = {"losses": losses, "norms": norms, "batches": batches, "mesh_local_ranks": local_ranks,
            "probe_batches": probe}
    everyone: list[Any] = [mine]
    if dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    if accelerator.is_main_process:
        mesh = accelerator.torch_device_mesh
        result = {**{key: [r[key] for r in everyone] for key in mine}, "gathered": gathered,
                  "weights": {k: v.flatten().tolist() for k, v in state.items()}, "weights_at_save": saved,
                  "mesh": None if mesh is None else list(mesh.mesh_dim_names),
                  "backend": type(accelerator.backend).__name__,
                  "param_types": sorted({type(p).__name__ for p in model.parameters()})}
        if run.get("reference"):
            used = accelerator.parallelism_config  # the one given, or built from PARALLELISM_CONFIG_* variables
            data_parallel = used.data_parallel_size if used is not None else accelerator.num_processes
            result["reference"] = reference(run["steps"], BATCH * data_parallel)
        with open(out, "w") as handle:
            json.dump(result, handle)
    accelerator.end_training()


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        main(sys.argv[1], json.load(f))
