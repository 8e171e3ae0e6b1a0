"""save_state / load_state on 2 real gloo processes: exact resume, per-rank files, failures agreed by all ranks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch


def _resume(tmp: str, stop_at: int) -> dict[str, Any]:
    from tests.engine.test_checkpoint import Run

    reference = Run()
    reference.train()
    expected = reference.snapshot()

    interrupted = Run(tmp)
    interrupted.train(stop_at=stop_at)
    step_at_save = interrupted.acc.step
    folder = interrupted.acc.save_state()

    resumed = Run(tmp)  # fresh objects and fresh state singletons, as a new process would have
    loaded = resumed.acc.load_state()
    position = (resumed.batches.n, resumed.acc.step)
    resumed.train()
    got = resumed.snapshot()
    return {"folder": folder, "loaded": loaded, "files": sorted(os.listdir(folder)), "step_at_save": step_at_save,
            "position": position, "params_equal": all(torch.equal(a, b) for a, b in zip(expected["params"], got["params"])),
            "rng_equal": torch.equal(expected["rng"], got["rng"]),
            "other_equal": (expected["scale"], expected["lr"], expected["counters"]) == (got["scale"], got["lr"],
                                                                                         got["counters"])}


@pytest.mark.parametrize("stop_at", [3, 8])  # mid-accumulation in epoch 0 and in epoch 1 (5 batches per rank)
def test_two_process_resume_is_bitwise_exact(run_distributed: Callable[..., list[Any]], tmp_path: Path,
                                             stop_at: int) -> None:
    results = run_distributed(_resume, 2, str(tmp_path), stop_at)
    for rank, result in enumerate(results):
        assert result["step_at_save"] % 2 == 1, result  # saved between the two micro-steps of an optimizer step
        assert result["loaded"] == result["folder"] == str(tmp_path / "checkpoints" / "checkpoint_0")
        assert result["position"] == (stop_at, result["step_at_save"])
        assert result["params_equal"] and result["rng_equal"] and result["other_equal"], (rank, result)
    assert results[0]["files"] == sorted([
        "manifest.json", "model.safetensors", "optimizer.bin", "scheduler.bin", "scaler.pt",
        "custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "random_states_0.pkl", "random_states_1.pkl",
        "dataloader_0_0.bin", "dataloader_0_1.bin", "gradients_0_0.safetensors", "gradients_0_1.safetensors"])


class Exploding:
    """A registered object whose state_dict fails (on every rank: the engine takes it on every rank)."""

    def state_dict(self) -> dict[str, int]:
        raise OSError("disk full (simulated)")

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


class Counting:
    """A registered object counting its state_dict calls on this rank; with ``fail_on`` it fails on that rank."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls = 0
        self.fail_on = fail_on

    def state_dict(self) -> dict[str, int]:
        self.calls += 1
        if self.fail_on is not None and int(os.environ["RANK"]) == self.fail_on:
            raise ValueError(f"state_dict failed on rank {self.fail_on} only (simulated)")
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


def _failures(tmp: str) -> dict[str, Any]:
    from engine.checkpoint.io import CorruptCheckpointError, UnsafeCheckpointError
    from tests.engine.test_checkpoint import Run
    from tests.engine.test_checkpoint_safety import plant

    out: dict[str, Any] = {}
    run = Run(tmp)
    run.train(stop_at=2)
    good = run.acc.save_state()
    run.acc.wait_for_everyone()

    run.acc.register_for_checkpointing(Exploding())
    try:
        run.acc.save_state()
        out["save_error"] = None
    except OSError as err:
        out["save_error"] = str(err)
    run.acc._custom_objects.pop()
    run.acc.wait_for_everyone()
    out["after_failed_save"] = sorted(os.listdir(os.path.join(tmp, "checkpoints")))
    run.acc.wait_for_everyone()  # before rank 0 starts the next save (its temporary folder) under rank 1's listing

    newer = run.acc.save_state()
    if run.acc.is_main_process:  # only rank 1's own file is damaged: rank 0 alone would not notice
        path = Path(newer) / "random_states_1.pkl"
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        path.write_bytes(bytes(data))
    run.acc.wait_for_everyone()
    try:
        run.acc.load_state(newer)
        out["corrupt_error"] = None
    except CorruptCheckpointError as err:
        out["corrupt_error"] = str(err)
    out["fallback"] = run.acc.load_state()  # the newest is corrupt: every rank falls back to the same one
    out["good"] = good

    if run.acc.is_main_process:
        plant(Path(good), "random_states_1.pkl", Path(tmp) / "pwned")
    run.acc.wait_for_everyone()
    try:
        run.acc.load_state(good)
        out["unsafe_error"] = None
    except UnsafeCheckpointError as err:
        out["unsafe_error"] = str(err)
    out["pwned"] = os.path.exists(os.path.join(tmp, "pwned"))

    # Registered objects are taken on every rank, as Accelerate does (the trainer's hooks run everywhere) ...
    counting = Counting()
    run.acc.register_for_checkpointing(counting)
    run.acc.save_state()
    out["state_dict_calls"] = counting.calls
    # ... so one that fails on rank 1 only fails the save on every rank, without a hang, and commits nothing.
    run.acc._custom_objects[-1] = Counting(fail_on=1)
    try:
        run.acc.save_state()
        out["rank1_error"] = None
    except ValueError as err:
        out["rank1_error"] = str(err)
    run.acc._custom_objects.pop()
    run.acc.wait_for_everyone()
    out["after_rank1_failure"] = sorted(os.listdir(os.path.join(tmp, "checkpoints")))

    return out


def test_a_failure_on_one_rank_is_raised_on_every_rank(run_distributed: Callable[..., list[Any]],
                                                       tmp_path: Path) -> None:
    results = run_distributed(_failures, 2, str(tmp_path), timeout=90)
    for result in results:
        assert "disk full (simulated)" in result["save_error"]
        assert result["after_failed_save"] == ["checkpoint_0"], result["after_failed_save"]  # nothing committed, temporary folder removed
        assert "random_states_1.pkl" in result["corrupt_error"]
        assert result["fallback"] == result["good"]
        assert "random_states_1.pkl" in result["unsafe_error"] and "allow_unsafe_pickle" in result["unsafe_error"]
        assert result["pwned"] is False
        assert result["state_dict_calls"] == 1
        assert "failed on rank 1 only" in result["rank1_error"]
        assert result["after_rank1_failure"] == ["checkpoint_0", "checkpoint_1", "checkpoint_2"], result
    assert "on rank 0" in results[1]["save_error"]
    assert "(on rank 1)" in results[0]["rank1_error"] and "(on rank 1)" not in results[1]["rank1_error"]
