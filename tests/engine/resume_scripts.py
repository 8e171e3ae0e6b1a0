"""A training script written the way Accelerate's ``examples/by_feature/checkpointing.py`` is, as a function.

Shared by the one-process tests (tests/engine/test_resume_patterns.py) and the two-process ones
(tests/distributed/test_resume_patterns.py). A "fresh process" is simulated by resetting the state singletons
and seeding the global RNGs with other values: only what ``save_state`` stored may decide what happens next.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from engine import Accelerator
from engine.state import AcceleratorState, GradientState

EPOCHS = 2
BATCHES_PER_EPOCH = 7  # per process: 13 samples in batches of 2 on one process, 26 on two


def _setup(seed: int) -> tuple[Accelerator, Any, Any, DataLoader]:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(seed)  # a fresh process starts elsewhere: the checkpoint must put everything back
    data = torch.Generator().manual_seed(3)
    n = 13 * accelerator.num_processes
    dataset = TensorDataset(torch.randn(n, 4, generator=data), torch.randn(n, 1, generator=data))
    init = torch.Generator().manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.25), torch.nn.Linear(8, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=init) * 0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(dataset, batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert len(loader) == BATCHES_PER_EPOCH
    return accelerator, model, optimizer, loader


def train(output_dir: str, checkpoint_at: int | None = None, resume_from: str | None = None,
          pattern: str = "accelerate", seed: int = 0) -> dict[str, Any]:
    """Train EPOCHS epochs; save ``step_{n}`` after batch ``checkpoint_at``; resume from a ``step_{n}`` folder.

    ``pattern="accelerate"`` resumes as Accelerate's scripts do (``skip_first_batches`` for the resumed epoch,
    then the loader itself); ``"engine"`` iterates the restored loader directly. Returns the final weights, the
    batch-first-sample order seen, and the lengths the loaders reported against the batches they yielded.
    """
    accelerator, model, optimizer, loader = _setup(seed)
    starting_epoch, resume_step, overall_step = 0, None, 0
    if resume_from is not None:
        accelerator.load_state(resume_from)
        # As in Accelerate's example: the folder name holds the step, split into epoch and step with len().
        resume_step = int(os.path.basename(resume_from).replace("step_", ""))
        starting_epoch = resume_step // len(loader)
        resume_step -= starting_epoch * len(loader)
        overall_step = starting_epoch * len(loader)
    seen: list[float] = []
    lengths: list[tuple[int, int]] = []
    for epoch in range(starting_epoch, EPOCHS):
        model.train()
        if pattern == "accelerate" and epoch == starting_epoch and resume_step is not None:
            active = accelerator.skip_first_batches(loader, resume_step)
            overall_step += resume_step
        else:
            active = loader
            if epoch == starting_epoch and resume_step is not None:
                overall_step += resume_step  # the restored loader continues after the saved batch
        announced, yielded = len(active), 0
        for x, y in active:
            yielded += 1
            seen.append(float(x[0, 0]))
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            overall_step += 1
            if overall_step == checkpoint_at:
                accelerator.save_state(os.path.join(output_dir, f"step_{overall_step}"))
        lengths.append((announced, yielded))
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    return {"weights": weights, "seen": seen, "lengths": lengths, "rng": torch.get_rng_state()}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Bitwise-equal weights and global RNG state."""
    return all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"])) and torch.equal(a["rng"], b["rng"])


def resume_everywhere(output_dir: str, pattern: str) -> list[str]:
    """Checkpoint after every batch of epoch 0 and a few of epoch 1, resume each; the problems found."""
    full = train(output_dir)
    problems = []
    for k in [*range(1, BATCHES_PER_EPOCH + 1), BATCHES_PER_EPOCH + 3, 2 * BATCHES_PER_EPOCH - 1]:
        folder = os.path.join(output_dir, pattern, f"run_{k}")
        interrupted = train(folder, checkpoint_at=k)
        if not same(interrupted, full):
            problems.append(f"checkpointing changed the run at step {k}")
        resumed = train(folder, resume_from=os.path.join(folder, f"step_{k}"), pattern=pattern, seed=100 + k)
        if not same(resumed, full):
            problems.append(f"resume at step {k} ({pattern}): weights differ")
        if resumed["seen"] != full["seen"][k:]:
            problems.append(f"resume at step {k} ({pattern}): batches {resumed['seen']} != {full['seen'][k:]}")
        if any(announced != yielded for announced, yielded in resumed["lengths"]) and pattern == "accelerate":
            problems.append(f"resume at step {k}: len() said {resumed['lengths']} (announced, yielded)")
    return problems
