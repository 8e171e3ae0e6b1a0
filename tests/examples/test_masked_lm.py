"""A collator drawing its masks from the global RNGs gives Accelerate's batches and weights, and resumes exactly.

tests/examples/accelerate_scripts/masked_lm.py is an MLM loop (masking collator, dropout, accumulation over 2
batches); ``RECORDED`` is what it gave under Accelerate 1.15 (tests/parity_scripts/record_masked_lm.py). The
engine must give the same masks in the same batches, hence the same losses and weights, which it does only if
it collates batch k+1 before it yields batch k, as Accelerate's loader does. A run resumed from a checkpoint
taken anywhere in an epoch must then end bitwise equal to the uninterrupted run: its first batch was collated
before the checkpoint, under random states the checkpoint no longer holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.state import AcceleratorState, GradientState
from tests.examples.accelerate_scripts import masked_lm
from tests.examples.accelerate_scripts.masked_lm_recorded import RECORDED

CHECKPOINT_STEPS = (1, 6, 10, 13)  # early, mid-epoch, the epoch's last batch, mid-epoch in the second epoch


def _run(folder: str, *args: str, seed: int = 0) -> dict[str, Any]:
    """One script start in ``folder`` (a fresh process: other global RNG state until the script seeds it)."""
    previous, threads = os.getcwd(), torch.get_num_threads()
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    torch.set_num_threads(1)  # as recorded under torchrun (OMP_NUM_THREADS=1): float sums depend on it
    try:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        torch.manual_seed(1000 + seed)
        return masked_lm.main(["--cpu", *args])
    finally:
        os.chdir(previous)
        torch.set_num_threads(threads)


def full_and_resumed(folder: str, steps: tuple[int, ...]) -> dict[str, Any]:
    """The uninterrupted run, and for each step and resume pattern the run resumed from a checkpoint there."""
    out: dict[str, Any] = {"full": _run(folder)}
    for step in steps:
        out[f"checkpointed_{step}"] = _run(os.path.join(folder, str(step)), "--checkpointing_steps", str(step))
        for pattern in ("accelerate", "engine"):
            out[f"{pattern}_{step}"] = _run(os.path.join(folder, str(step)), "--resume_from_checkpoint",
                                            f"step_{step}", "--resume_pattern", pattern, seed=step)
    return out


def _assert_matches_accelerate_and_resumes(runs: dict[str, Any], procs: int, steps: tuple[int, ...]) -> None:
    full, recorded = runs["full"], RECORDED[f"masked_lm_{procs}"]
    assert full == recorded
    flat = [key for epoch in full["keys"] for key in epoch]
    for step in steps:
        assert runs[f"checkpointed_{step}"] == full, f"saving at step {step} changed the run"
        for pattern in ("accelerate", "engine"):
            resumed = runs[f"{pattern}_{step}"]
            where = f"resumed at step {step} ({pattern} pattern)"
            assert [key for epoch in resumed["keys"] for key in epoch] == flat[step:], where
            assert resumed["losses"] == full["losses"][step:], where
            assert (resumed["sha"], resumed["sum"]) == (full["sha"], full["sum"]), where


@pytest.mark.recorded_bits
def test_one_process_gives_accelerates_masks_and_weights_and_resumes_exactly(tmp_path: Path) -> None:
    runs = full_and_resumed(str(tmp_path), CHECKPOINT_STEPS)
    _assert_matches_accelerate_and_resumes(runs, 1, CHECKPOINT_STEPS)


@pytest.mark.recorded_bits
def test_two_processes_give_accelerates_masks_and_weights_and_resume_exactly(
        run_distributed: Callable[..., list[Any]], tmp_path: Path) -> None:
    steps = (6, 13)
    rank0, rank1 = run_distributed(full_and_resumed, 2, str(tmp_path), steps, timeout=300)
    _assert_matches_accelerate_and_resumes(rank0, 2, steps)
    assert rank1["full"]["sha"] == rank0["full"]["sha"]
