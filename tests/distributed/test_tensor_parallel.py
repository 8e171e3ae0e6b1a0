"""Tensor and 2-D parallelism through the engine (``Accelerator(parallelism_config=...)``), on CPU with gloo.

Each test is a few real runs of tests/distributed/tensor_parallel_script.py (a tiny transformer with a
``tp_plan``), started with torch's launcher on 1, 2 or 4 processes: training equals one process training on the
data-parallel ranks' batches together (float32 reduction order apart: within 1e-6), the mesh and the batches each
process gets are what Accelerate 1.15 built on the same mesh (tests/distributed/parallelism_config_expected.py; it
refuses to train on CPU), resuming is bitwise, and a checkpoint loads on another layout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.parallelism_config_expected import EXPECTED

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "tensor_parallel_script.py"
TOLERANCE = 1e-6


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(processes: int, run: dict[str, Any], folder: Path, name: str, fails: bool = False,
           ember_flags: list[str] | None = None) -> Any:
    """Run the script on ``processes`` processes with ``run`` as its RUN_JSON; returns what process 0 wrote
    (with ``fails``: the run's error output, asserting that it failed). With ``ember_flags`` the processes are
    started by ``ember launch FLAGS`` instead of torch's launcher."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(run))
    out = folder / f"{name}.out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    arguments = [str(SCRIPT), str(out), str(folder / f"{name}.json")]
    if ember_flags is not None:
        command = [sys.executable, "-m", "engine.launch.cli", "launch", "--nproc-per-node", str(processes), *ember_flags,
                   *arguments]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                   "--master-addr", "127.0.0.1", "--master-port", str(_port()), *arguments]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    if fails:
        assert result.returncode != 0
        return result.stderr
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


def max_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    assert sorted(a) == sorted(b)
    return max(abs(x - y) for key in a for x, y in zip(a[key], b[key], strict=True))


def data_parallel_losses(losses: list[list[float]], groups: list[list[int]]) -> list[float]:
    """The global loss of each step: the mean over data-parallel groups (ranks in a group hold the same loss)."""
    for group in groups:
        assert all(losses[rank] == losses[group[0]] for rank in group)
    return [sum(values) / len(values) for values in zip(*(losses[group[0]] for group in groups), strict=True)]


def check_against_reference(result: dict[str, Any], groups: list[list[int]]) -> None:
    reference = result["reference"]
    assert result["backend"] == "ModelParallel" and "DTensor" in result["param_types"]
    mine = data_parallel_losses(result["losses"], groups)
    assert max(abs(a - b) for a, b in zip(mine, reference["losses"], strict=True)) < TOLERANCE
    assert max(abs(a - b) for a, b in zip(result["norms"][0], reference["norms"], strict=True)) < TOLERANCE
    assert max_diff(result["weights"], reference["weights"]) < TOLERANCE
    # gather_for_metrics over the data-parallel ranks only: each sample once, in order (5 samples, 2 per batch).
    assert len(result["gathered"]) == 5
    assert max(abs(a - b) for a, b in zip(result["gathered"], reference["gathered"], strict=True)) < TOLERANCE


def check_mesh_as_accelerates(result: dict[str, Any], name: str) -> None:
    expected = EXPECTED["processes"][name]
    assert result["mesh_local_ranks"] == expected["mesh_local_ranks"]
    assert result["probe_batches"] == expected["batches_per_rank"]


def test_tensor_parallel_on_2_processes_trains_as_one_and_resumes_bitwise(tmp_path: Path) -> None:
    # Lightning's order (zero_grad before backward): the checkpoint holds each rank's part of the gradients.
    base = {"config": {"tp_size": 2}, "plan": "tp", "steps": 6, "state_dir": str(tmp_path), "zero_grad": "first"}
    first = launch(2, {**base, "save_at": 3, "reference": True}, tmp_path, "first")
    check_against_reference(first, [[0, 1]])
    check_mesh_as_accelerates(first, "tp2")
    assert first["batches"][0] == first["batches"][1]  # tensor-parallel ranks see the same batches
    resumed = launch(2, {**base, "resume_from": str(tmp_path / "state_3"), "resume_at": 3}, tmp_path, "resumed")
    assert resumed["losses"] == [losses[3:] for losses in first["losses"]]
    assert resumed["weights"] == first["weights"]
    # Gradients saved between steps are each rank's part: another layout cannot take them, and says so.
    error = launch(1, {"config": None, "steps": 3, "resume_from": str(tmp_path / "state_3"), "resume_at": 3},
                   tmp_path, "elsewhere", fails=True)
    assert "only load on the same number of processes and layout" in error and "include_gradients=False" in error


def test_sequence_parallel_resumes_bitwise_and_loads_on_one_process(tmp_path: Path) -> None:
    base = {"config": {"tp_size": 2}, "plan": "sp", "steps": 6, "state_dir": str(tmp_path)}
    # accelerate launch's flags: the Accelerator builds ParallelismConfig() from the variables they set.
    flags = ["--use_parallelism_config", "--parallelism_config_tp_size", "2"]
    first = launch(2, {**base, "config": None, "save_at": 3, "reference": True}, tmp_path, "first",
                   ember_flags=flags)
    check_against_reference(first, [[0, 1]])
    resumed = launch(2, {**base, "resume_from": str(tmp_path / "state_3"), "resume_at": 3}, tmp_path, "resumed")
    assert resumed["losses"] == [losses[3:] for losses in first["losses"]]
    assert resumed["weights"] == first["weights"]
    one = launch(1, {"config": None, "steps": 3, "resume_from": str(tmp_path / "state_3"), "resume_at": 3},
                 tmp_path, "one")
    assert one["backend"] != "ModelParallel" and one["param_types"] == ["Parameter"]
    assert one["weights"] == first["weights_at_save"]


def test_fsdp2_with_tensor_parallel_on_a_2x2_mesh_resumes_bitwise_and_loads_on_one_process(tmp_path: Path) -> None:
    base = {"config": {"dp_shard_size": 2, "tp_size": 2}, "plan": "tp", "steps": 6, "state_dir": str(tmp_path)}
    first = launch(4, {**base, "save_at": 3, "reference": True}, tmp_path, "first")
    check_against_reference(first, [[0, 1], [2, 3]])  # rank = dp_shard rank * 2 + tp rank
    check_mesh_as_accelerates(first, "fsdp2_tp2")
    resumed = launch(4, {**base, "resume_from": str(tmp_path / "state_3"), "resume_at": 3}, tmp_path, "resumed")
    assert resumed["losses"] == [losses[3:] for losses in first["losses"]]
    assert resumed["weights"] == first["weights"]
    one = launch(1, {"config": None, "steps": 3, "resume_from": str(tmp_path / "state_3"), "resume_at": 3},
                 tmp_path, "one")
    assert one["weights"] == first["weights_at_save"]


def test_hsdp_on_a_2x2_mesh_resumes_bitwise_and_loads_on_ddp(tmp_path: Path) -> None:
    base = {"config": {"dp_replicate_size": 2, "dp_shard_size": 2}, "steps": 6, "state_dir": str(tmp_path)}
    first = launch(4, {**base, "save_at": 3, "reference": True}, tmp_path, "first")
    check_against_reference(first, [[0], [1], [2], [3]])
    check_mesh_as_accelerates(first, "hsdp2x2")
    resumed = launch(4, {**base, "resume_from": str(tmp_path / "state_3"), "resume_at": 3}, tmp_path, "resumed")
    assert resumed["losses"] == [losses[3:] for losses in first["losses"]]
    assert resumed["weights"] == first["weights"]
    ddp = launch(2, {"config": None, "steps": 3, "resume_from": str(tmp_path / "state_3"), "resume_at": 3},
                 tmp_path, "ddp")
    assert ddp["weights"] == first["weights_at_save"]
