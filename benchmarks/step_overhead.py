"""Per-step framework overhead: a raw PyTorch loop against the same loop through ``engine`` (and others).

Tiny MLP, batch 64, CPU, one thread. Each variant runs in interleaved rounds (raw, engine, raw, engine, ...)
so machine noise hits all of them alike; the figure is the median step time per variant and its excess over
raw. Run: ``python benchmarks/step_overhead.py [--rounds 15 --steps 300]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

StepFn = Callable[[int], None]


# Set by share_model_and_data(): every variant then trains the same parameters on the same batch tensors.
_SHARED: dict[str, Any] = {}


def share_model_and_data() -> None:
    """Give every variant built from now on the same model object and the same batches.

    Separately built models and batches sit at different addresses, and that alone moves a step of this tiny
    MLP by up to +-20 us from one instance to the next (measured: two raw loops built one after the other).
    With one model and one batch list, every variant runs the same kernels on the same memory, so the
    differences left are the loops' own code. Each variant still has its own optimizer (plain SGD keeps no
    state), and all of them apply the same updates.
    """
    _SHARED["model"], _SHARED["data"] = _new_model(), _new_data()


def _new_data(n: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(n)]


def _new_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _data(n: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return _SHARED["data"] if "data" in _SHARED and n == 64 else _new_data(n)


def _model() -> torch.nn.Module:
    return _SHARED["model"] if "model" in _SHARED else _new_model()


def make_raw() -> StepFn:
    model, data = _model(), _data()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.functional.cross_entropy

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def _accelerator_loop(accelerator: Any) -> StepFn:
    """The quicktour step through an engine or Accelerate ``Accelerator`` (same code for both)."""
    model, data = _model(), _data()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loss_fn = torch.nn.functional.cross_entropy

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        with accelerator.accumulate(model):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()

    return step


def make_engine() -> StepFn:
    from engine import Accelerator, AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return _accelerator_loop(Accelerator(cpu=True))


def make_accelerate() -> StepFn:
    from accelerate import Accelerator  # type: ignore[import-not-found]

    return _accelerator_loop(Accelerator(cpu=True))


VARIANTS: dict[str, Callable[[], Any]] = {"raw": make_raw, "engine": make_engine}
if importlib.util.find_spec("accelerate") is not None:
    VARIANTS["accelerate"] = make_accelerate


def _run(fn: Any, steps: int) -> tuple[float, float]:
    """Wall and CPU (this thread's) seconds for ``steps`` steps. A variant that runs whole loops (the Trainer) has
    ``run_steps`` and times itself, since its loop cannot be called one step at a time. CPU time leaves out the
    time the process waited for a core, so it stays meaningful on a loaded machine."""
    run_steps = getattr(fn, "run_steps", None)
    if run_steps is not None:
        wall, cpu = run_steps(steps)
        return float(wall), float(cpu)
    start, cpu_start = time.perf_counter(), time.thread_time()
    for i in range(steps):
        fn(i)
    return time.perf_counter() - start, time.thread_time() - cpu_start


Samples = dict[str, list[float]]


def measure_rounds(variants: dict[str, Callable[[], Any]], rounds: int, steps: int) -> tuple[Samples, Samples]:
    """Wall and CPU microseconds per step of each variant in each round (variants interleaved round by round)."""
    torch.set_num_threads(1)
    fns = {name: make() for name, make in variants.items()}
    for fn in fns.values():  # warm-up
        _run(fn, 50)
    wall: Samples = {name: [] for name in fns}
    cpu: Samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            seconds, cpu_seconds = _run(fn, steps)
            wall[name].append(seconds / steps * 1e6)
            cpu[name].append(cpu_seconds / steps * 1e6)
    return wall, cpu


def measure(variants: dict[str, Callable[[], Any]], rounds: int, steps: int) -> tuple[dict[str, float],
                                                                                     dict[str, float]]:
    """Median wall and CPU microseconds per step for each variant, interleaved round by round."""
    wall, cpu = measure_rounds(variants, rounds, steps)
    return ({name: statistics.median(v) for name, v in wall.items()},
            {name: statistics.median(v) for name, v in cpu.items()})


def paired_excess(samples: Samples, name: str, baseline: str) -> float:
    """Median over rounds of ``name``'s time minus ``baseline``'s in the same round: a slow stretch of the
    machine hits both sides of each difference, so this is steadier than a difference of medians."""
    return statistics.median(a - b for a, b in zip(samples[name], samples[baseline]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    wall, cpu = measure(VARIANTS, args.rounds, args.steps)
    print(f"{'loop':<28}{'us/step':>10}{'extra us/step':>16}{'cpu us/step':>13}{'extra':>8}")
    for name, value in wall.items():
        print(f"{name:<28}{value:>10.1f}{value - wall['raw']:>16.1f}{cpu[name]:>13.1f}{cpu[name] - cpu['raw']:>8.1f}")


if __name__ == "__main__":
    main()
