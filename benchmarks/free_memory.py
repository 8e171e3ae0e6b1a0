"""Why a trailing ``accelerator.free_memory()`` seemed to make the engine's quicktour loop slower per step.

Reproduces the report of the Trainer redesign issue: in one process, a raw loop interleaved with the engine
quicktour loop (``Accelerator(cpu=True)``, prepared model / optimizer / shuffled ``DataLoader``, tiny MLP
32-64-10, 2,000 batches of 64, one thread), each round ending with ``acc.free_memory()`` or not. Each phase is
timed on its own (wall and this thread's CPU time), so a one-time cost at the end of a round is not spread over
its steps: the loop itself, then ``free_memory()``. ``gc.collect()`` alone is timed too, with the number of
objects the collector tracks (what a full collection walks).

Run: ``python benchmarks/free_memory.py [--rounds 5 --batches 2000]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Accelerator, AcceleratorState, GradientState


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


class _Clock:
    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.thread_time() - self.cpu


def raw_round(x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple[float, float]]:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    clock = _Clock()
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {"loop": clock.read()}


def engine_round(x: torch.Tensor, y: torch.Tensor, free: bool) -> dict[str, tuple[float, float]]:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(cpu=True)
    model = _mlp()
    model, opt, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01),
                                     DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    clock = _Clock()
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    result = {"loop": clock.read()}
    if free:
        clock = _Clock()
        acc.free_memory()
        result["free_memory"] = clock.read()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(args.batches * 64, 32, generator=g), torch.randint(0, 10, (args.batches * 64,), generator=g)
    variants: dict[str, Any] = {"raw": lambda: raw_round(x, y), "engine": lambda: engine_round(x, y, False),
                                "engine + free_memory()": lambda: engine_round(x, y, True)}
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(args.rounds):
        for name, fn in variants.items():
            for phase, value in fn().items():
                samples[name].setdefault(phase, []).append(value)
    raw_wall = statistics.median(w for w, _ in samples["raw"]["loop"]) / args.batches * 1e6
    raw_cpu = statistics.median(c for _, c in samples["raw"]["loop"]) / args.batches * 1e6
    print(f"{'variant':<26}{'loop us/step (wall)':>21}{'over raw':>10}{'(cpu)':>9}{'over raw':>10}"
          f"{'free_memory ms':>16}{'= us/step':>11}")
    for name, phases in samples.items():
        wall = statistics.median(w for w, _ in phases["loop"]) / args.batches * 1e6
        cpu = statistics.median(c for _, c in phases["loop"]) / args.batches * 1e6
        free = statistics.median(w for w, _ in phases["free_memory"]) * 1e3 if "free_memory" in phases else 0.0
        print(f"{name:<26}{wall:>21.1f}{wall - raw_wall:>+10.1f}{cpu:>9.1f}{cpu - raw_cpu:>+10.1f}"
              f"{free:>16.1f}{free * 1e3 / args.batches:>11.1f}")
    start = time.perf_counter()
    gc.collect()
    print(f"\ngc.collect() alone: {(time.perf_counter() - start) * 1e3:.1f} ms over {len(gc.get_objects()):,} "
          "tracked objects (a full collection walks all of them; most come from importing torch).")


if __name__ == "__main__":
    main()
