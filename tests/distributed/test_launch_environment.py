"""How processes find each other without ``ember launch``: SLURM variables, and the process-group timeout."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import pytest
import torch

from engine.environment import read_launch, slurm_master_addr, slurm_tasks_on_this_node

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


def _as_slurm_task() -> dict[str, Any]:
    """Turn this harness process into what ``srun`` starts: only SLURM's variables say who it is."""
    from engine import Accelerator

    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    for name in _LAUNCHER_VARS:
        del os.environ[name]
    os.environ.update(SLURM_PROCID=rank, SLURM_NTASKS=world, SLURM_LOCALID=rank, SLURM_NODEID="0",
                      SLURM_TASKS_PER_NODE=world, SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="4242")
    acc = Accelerator()
    total = acc.reduce(torch.tensor([float(acc.process_index + 1)]), "sum").item()
    return {"index": acc.process_index, "n": acc.num_processes, "local": acc.local_process_index,
            "type": str(acc.distributed_type), "sum": total, "env": {k: os.environ.get(k) for k in _LAUNCHER_VARS}}


def test_slurm_variables_start_a_real_process_group(run_distributed: Any) -> None:
    results = run_distributed(_as_slurm_task, 2)
    assert [r["index"] for r in results] == [0, 1] and [r["local"] for r in results] == [0, 1]
    assert all(r["n"] == 2 and r["type"] == "DistributedType.MULTI_CPU" and r["sum"] == 3.0 for r in results)
    # Written back as torchrun would have, with the rendezvous address taken from the node list.
    assert results[1]["env"] == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                 "MASTER_ADDR": "localhost"}


def test_slurm_environment_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                 "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "6")
    monkeypatch.setenv("SLURM_NTASKS", "7")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x3),1")  # nodes 0-2 run 2 tasks, node 3 runs 1
    monkeypatch.setenv("SLURM_NODEID", "3")
    info = read_launch(os.environ)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.launched) == (6, 7, 0, 1, True)
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert slurm_tasks_on_this_node(os.environ, 7) == 2
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[03-07,9],cpu01")
    assert slurm_master_addr(os.environ) == "gpu03"
    # A launcher's variables win over SLURM's (torchrun started inside an allocation).
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (read_launch(os.environ).rank, read_launch(os.environ).world_size) == (1, 2)
    # One SLURM task (an sbatch script run without srun) is a single process.
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert not read_launch(os.environ).launched


def _collective_one_rank_skips(timeout_s: float) -> dict[str, Any]:
    from engine import Accelerator, InitProcessGroupKwargs

    acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))])
    if acc.process_index == 1:
        time.sleep(timeout_s + 4)  # alive, but never joins the collective
        return {}
    start = time.monotonic()
    try:
        acc.reduce(torch.ones(1))
        error = None
    except RuntimeError as err:
        error = str(err)
    return {"elapsed": time.monotonic() - start, "error": error}


def test_process_group_timeout_is_applied(run_distributed: Any) -> None:
    result = run_distributed(_collective_one_rank_skips, 2, 2.0)[0]
    assert result["error"] is not None and "Timed out" in result["error"], result
    # About the configured 2 s: not the default 30 minutes, nor the 6 s until the other rank exits.
    assert 1.5 <= result["elapsed"] < 4.5, result
