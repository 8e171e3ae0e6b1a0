"""Asynchronous checkpoints: how long a checkpoint blocks training, and what checkpoints cost a stretch of training.

For each state size (``--sizes-mb``: model + AdamW state, e.g. ~200 MB and ~1 GB), one training loop on an MLP of
Linear(2048, 2048) layers (batch 8, AdamW) runs segments of ``N`` steps, three kinds in turn:

* ``none``: ``N`` steps, no checkpoint;
* ``sync``: ``save_state()`` (automatic naming, ``total_limit=2``), then ``N`` steps;
* ``async``: ``save_state(async_save=True)``, then ``N`` steps, then ``wait_for_checkpoint()`` (timed too: the
  segment is done when its checkpoint is committed).

So a segment is "training with a checkpoint every ``N`` steps", and the three kinds run interleaved, round by round
(the order rotates), in one process on one model: this machine's step time drifts by up to 2x over tens of
seconds (other tenants), which whole runs one after the other would measure instead of the checkpoints. ``N`` is
chosen so that a segment lasts ``--factor`` times one synchronous save (measured first), i.e. long enough for the
background write to overlap training; ``--every`` sets it directly.

Printed per size: the median time the loop was blocked per checkpoint (sync vs async, and their ratio; goal:
async <= 10% of sync); the median segment time of each kind and the median over rounds of each round's excess
over its ``none`` segment (goal: async within 5%); the snapshot buffers' size; the CPU time a synchronous save
takes (what a background write must find somewhere: on a machine whose cores training keeps busy, it is taken
from training).
Run: ``python benchmarks/checkpoint_async.py [--sizes-mb 200 1000 --rounds 5 --threads 1 --dir PATH]``.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
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
KINDS = ("none", "sync", "async")


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


class Loop:
    """The training loop under test, and the segments it runs."""

    def __init__(self, state_mb: int, project_dir: str) -> None:
        self.accelerator, self.model, self.optimizer = build(state_mb, project_dir)
        self.x = torch.randn(8, WIDTH)

    def steps(self, count: int) -> None:
        for _ in range(count):
            self.model(self.x).square().mean().backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def segment(self, kind: str, count: int) -> tuple[float, float | None]:
        """Seconds of one segment of ``count`` steps of ``kind``, and the seconds its save blocked the loop."""
        blocked = None
        start = time.perf_counter()
        if kind != "none":
            self.accelerator.save_state(async_save=kind == "async")
            blocked = time.perf_counter() - start
        self.steps(count)
        self.accelerator.wait_for_checkpoint()
        return time.perf_counter() - start, blocked

    def calibrate(self) -> tuple[float, float, float]:
        """Seconds per step, seconds and CPU seconds of one synchronous save (after a warm-up of each kind)."""
        self.steps(3)
        for kind in ("sync", "async"):
            self.segment(kind, 1)
        start = time.perf_counter()
        self.steps(5)
        step = (time.perf_counter() - start) / 5
        before = resource.getrusage(resource.RUSAGE_SELF)
        _, save = self.segment("sync", 0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        assert save is not None
        return step, save, cpu


def measure(state_mb: int, rounds: int, every: int | None, factor: float, workdir: str) -> None:
    loop = Loop(state_mb, tempfile.mkdtemp(prefix="project-", dir=workdir))
    step, save, cpu = loop.calibrate()
    every = every or max(5, math.ceil(factor * save / step))
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    blocked: dict[str, list[float]] = {"sync": [], "async": []}
    for round_ in range(rounds):
        for kind in KINDS[round_ % 3:] + KINDS[:round_ % 3]:
            total, held = loop.segment(kind, every)
            seconds[kind].append(total)
            if held is not None:
                blocked[kind].append(held)
        print(f"  [{state_mb} MB round {round_}] " + ", ".join(f"{k} {seconds[k][-1]:.2f} s" for k in KINDS),
              file=sys.stderr, flush=True)
    median = {kind: statistics.median(values) for kind, values in seconds.items()}
    excess = {kind: statistics.median(t / n - 1 for t, n in zip(seconds[kind], seconds["none"]))
              for kind in ("sync", "async")}
    held = {kind: statistics.median(values) for kind, values in blocked.items()}
    print(f"state {state_mb} MB: snapshot buffers {loop.accelerator.checkpoint_snapshot_bytes / 2**20:.0f} MB; "
          f"a step {1e3 * step:.0f} ms, a synchronous save {save:.3f} s using {cpu:.3f} s of CPU; "
          f"segments of {every} steps ({rounds} rounds)")
    print(f"  blocked per checkpoint: sync {held['sync']:.3f} s, async {held['async']:.3f} s "
          f"({100 * held['async'] / held['sync']:.1f}% of sync; goal <= 10%)")
    print(f"  segment: none {median['none']:.2f} s, sync {median['sync']:.2f} s ({100 * excess['sync']:+.1f}%), "
          f"async {median['async']:.2f} s ({100 * excess['async']:+.1f}%; goal <= 5%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--every", type=int, default=None, help="steps per segment (default: from --factor)")
    parser.add_argument("--factor", type=float, default=20.0,
                        help="a segment lasts this many synchronous saves (default: 20)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for training (default: torch's)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder under the cwd)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"asynchronous checkpoints: {args.rounds} rounds interleaved, medians, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads")
    for state_mb in args.sizes_mb:
        workdir = tempfile.mkdtemp(prefix=".bench-async-", dir=args.dir or os.getcwd())
        try:
            measure(state_mb, args.rounds, args.every, args.factor, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
