"""Accelerate's example scripts, ported by changing only their imports, give what the real Accelerate gives.

The scripts in tests/examples/accelerate_scripts/ follow Accelerate's ``examples/by_feature/*.py`` (checkpointing,
local SGD, profiler, memory, early stopping, multi-process metrics, autoregressive accumulation) on tiny plain-torch
models. ``RECORDED`` holds what each run gave under the real Accelerate 1.15 (``record.py`` in that folder, run
with /work/refvenv/bin/python on 1 and 2 CPU processes through torchrun). Here the same runs are made with the
engine: one process in this interpreter, two processes in one pair of gloo ranks.

Where Accelerate's own resume is not exact (a checkpoint taken mid-epoch on one process, restored with a plainly
shuffled loader: Accelerate restores the global RNG at the save point, so the resumed epoch's order and dropout
differ), the engine's resumed run must equal the *uninterrupted* run instead: that is the engine's promise.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.state import AcceleratorState, GradientState
from tests.examples.accelerate_scripts.cases import CASES

RECORDED: dict[str, dict[str, Any]] = {}  # filled below


def run_case(key: str, folder: str) -> dict[str, Any]:
    """Run one case's steps, in order, in ``folder`` (each step as a fresh script start)."""
    name, _, steps = CASES[key]
    module = importlib.import_module(f"tests.examples.accelerate_scripts.{name[:-3]}")
    os.makedirs(folder, exist_ok=True)
    previous = os.getcwd()
    os.chdir(folder)
    try:
        result: dict[str, Any] = {}
        for args in steps:
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
            result = module.main(["--cpu", *args])
        return result
    finally:
        os.chdir(previous)


def run_cases(keys: list[str], folder: str) -> dict[str, dict[str, Any]]:
    return {key: run_case(key, os.path.join(folder, key)) for key in keys}


def expected(key: str) -> dict[str, Any]:
    """What the engine must give: Accelerate's value, or for a step resume the uninterrupted run's weights."""
    value = dict(RECORDED[key])
    procs = CASES[key][1]
    if key.startswith(("checkpointing_mid_epoch", "checkpointing_epoch_end_step")):
        full = RECORDED[f"checkpointing_full_{procs}"]
        value.update(sha=full["sha"], sum=full["sum"], accuracy=full["accuracy"][-len(value["accuracy"]):])
    return value


def _keys(procs: int) -> list[str]:
    return [key for key, (_, p, _) in CASES.items() if p == procs]


def test_one_process_runs_give_accelerates_values(tmp_path: Path) -> None:
    results = run_cases(_keys(1), str(tmp_path))
    assert {k: v for k, v in results.items()} == {k: expected(k) for k in results}


def test_two_process_runs_give_accelerates_values(run_distributed: Callable[..., list[Any]],
                                                  tmp_path: Path) -> None:
    rank0, _ = run_distributed(run_cases, 2, _keys(2), str(tmp_path), timeout=300)
    assert rank0 == {k: expected(k) for k in rank0}
