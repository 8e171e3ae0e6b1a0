"""Asynchronous checkpoints: how long a checkpoint blocks training, and what checkpoints cost a whole run.

For each state size (``--sizes-mb``: model + AdamW state, e.g. ~200 MB and ~1 GB), a training loop on an MLP of
Linear(2048, 2048) layers (batch 8, AdamW) runs ``--steps`` steps three ways, interleaved round by round so
machine noise hits all alike:

* ``none``: no checkpoint;
* ``sync``: ``save_state()`` every ``--every`` steps (automatic naming, ``total_limit=2``);
* ``async``: ``save_state(async_save=True)`` every ``--every`` steps; the run ends with ``wait_for_checkpoint()``
  (included in its time: a run is done when its last checkpoint is committed).

Printed per size: the median time the loop was blocked per checkpoint (sync vs async, and their ratio; goal:
async <= 10% of sync), the median total run time of each variant and the excess of ``sync`` / ``async`` over
``none`` (goal: async within 5% when the writes overlap with training), and the snapshot buffers' size.
Run: ``python benchmarks/checkpoint_async.py [--sizes-mb 200 1000 --rounds 3 --dir PATH]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WIDTH = 2048
VARIANTS = ("none", "sync", "async")


def build(state_mb: int, project_dir: str) -> tuple[Any, torch.nn.Module, torch.optim.Optimizer]:
    """An Accelerator over an MLP whose weights and AdamW state (3x the weights) total about ``state_mb`` MB."""
    from engine import Accelerator, AcceleratorState, GradientState, ProjectConfiguration

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    layers = max(1, round(state_mb * 2**20 / 3 / (4 * WIDTH * WIDTH)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def run(variant: str, state_mb: int, steps: int, every: int, workdir: str) -> dict[str, Any]:
    """One training run; returns its total seconds, the seconds blocked in each save, and the snapshot size."""
    project = tempfile.mkdtemp(prefix=f"{variant}-", dir=workdir)
    accelerator, model, optimizer = build(state_mb, project)
    x = torch.randn(8, WIDTH)
    blocked: list[float] = []
    os.sync()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if variant != "none" and step % every == 0:
            began = time.perf_counter()
            accelerator.save_state(async_save=variant == "async")
            blocked.append(time.perf_counter() - began)
    accelerator.wait_for_checkpoint()
    total = time.perf_counter() - start
    snapshot = accelerator.checkpoint_snapshot_bytes
    shutil.rmtree(project, ignore_errors=True)
    return {"total": total, "blocked": blocked, "snapshot": snapshot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 40 for <= 300 MB, else 12)")
    parser.add_argument("--every", type=int, default=None, help="steps between checkpoints (default: steps / 4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder under the cwd)")
    args = parser.parse_args()
    print(f"asynchronous checkpoints: {args.rounds} rounds interleaved, medians, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads")
    for state_mb in args.sizes_mb:
        steps = args.steps or (40 if state_mb <= 300 else 12)
        every = args.every or max(1, steps // 4)
        workdir = tempfile.mkdtemp(prefix=".bench-async-", dir=args.dir or os.getcwd())
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        try:
            for round_ in range(args.rounds):
                order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    results[variant].append(run(variant, state_mb, steps, every, workdir))
                    print(f"  [{state_mb} MB round {round_}] {variant}: {results[variant][-1]['total']:.2f} s",
                          file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        total = {v: statistics.median(r["total"] for r in results[v]) for v in VARIANTS}
        blocked = {v: statistics.median(b for r in results[v] for b in r["blocked"]) for v in ("sync", "async")}
        snapshot_mb = results["async"][-1]["snapshot"] / 2**20
        print(f"state {state_mb} MB: {steps} steps, a checkpoint every {every} "
              f"({steps // every} per run), snapshot buffers {snapshot_mb:.0f} MB")
        print(f"  blocked per checkpoint: sync {blocked['sync']:.3f} s, async {blocked['async']:.3f} s "
              f"({100 * blocked['async'] / blocked['sync']:.1f}% of sync; goal <= 10%)")
        print(f"  total run: none {total['none']:.2f} s, sync {total['sync']:.2f} s "
              f"(+{100 * (total['sync'] / total['none'] - 1):.1f}%), async {total['async']:.2f} s "
              f"(+{100 * (total['async'] / total['none'] - 1):.1f}%; goal <= 5%)")


if __name__ == "__main__":
    main()
