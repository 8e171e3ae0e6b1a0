"""A 2-task SLURM job (the tasks started here as ``srun`` starts them, SLURM's variables set, a stand-in
``scontrol`` on PATH that records its arguments) gets SIGUSR1 from outside, as ``#SBATCH --signal=SIGUSR1@90``
sends it: both tasks save one checkpoint at the same step and exit with 143, process 0 runs ``scontrol requeue``
once; the requeued job (same job id, the same script line ``fit(module, data)``) resumes by itself and ends with
the uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("slurm_task_script.py")
TIMEOUT_S = 180.0


def _tasks(out: Path, job: str, slow: float, extra: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "TORCHELASTIC_", "ACCELERATE_", "EMBER_", "PYTEST_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base.update(PYTHONPATH=os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1", PATH=f"{out.parent / 'bin'}{os.pathsep}{base['PATH']}",
                SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="2", SLURM_NNODES="1", SLURM_NODEID="0", SLURM_JOB_ID=job,
                SLURM_JOB_NAME="train.sh", SLURM_JOB_NODELIST="localhost", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port, SCONTROL_LOG=str(out.parent / "scontrol.log"), **(extra or {}))
    out.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([sys.executable, str(SCRIPT), str(out), str(slow)], cwd=out,
                             env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]


def _finish(tasks: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    results = []
    for task in tasks:
        try:
            output, _ = task.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for t in tasks:
                t.kill()
            raise
        results.append((task.returncode, output))
    return results


def _wait_for_step(out: Path, rank: int, step: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if int((out / f"rank{rank}.step").read_text() or 0) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"rank {rank} did not reach step {step}")


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def test_sigusr1_to_one_task_saves_both_requeues_once_and_the_requeue_resumes_bitwise(cluster: Path) -> None:
    reference = _tasks(cluster / "reference", job="1", slow=0.0)  # the uninterrupted job
    assert [code for code, _ in _finish(reference)] == [0, 0]

    job = cluster / "job"
    first = _tasks(job, job="77", slow=0.05)
    _wait_for_step(job, 1, 5)
    # SLURM signals every task, not at the same instant: here only task 1 gets it (the other's copy would be late).
    os.kill(first[1].pid, signal.SIGUSR1)
    (code0, out0), (code1, out1) = _finish(first)
    assert (code0, code1) == (143, 143), out0 + out1
    assert "Preempted by a signal to another process" in out0  # process 0 speaks for the job
    assert "SLURM job 77 requeued" in out0  # process 0 requeued although the signal reached task 1
    assert (cluster / "scontrol.log").read_text().splitlines() == ["requeue 77"]
    stopped_at = int((job / "rank0.step").read_text())
    assert stopped_at < 48 and int((job / "rank1.step").read_text()) == stopped_at  # the same step on both

    requeued = _finish(_tasks(job, job="77", slow=0.0, extra={"SLURM_RESTART_COUNT": "1"}))
    assert [code for code, _ in requeued] == [0, 0], requeued
    assert "slurm:77 wrote checkpoints before" in requeued[0][1]
    assert f"step {stopped_at}." in requeued[0][1]  # "Resumed from ... at epoch E, batch B, step S."
    for rank in range(2):
        got = torch.load(job / f"rank{rank}.final.pt")
        want = torch.load(cluster / "reference" / f"rank{rank}.final.pt")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
