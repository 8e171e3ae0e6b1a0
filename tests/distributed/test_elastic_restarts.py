"""torchrun's elastic restarts with the Trainer: a rank SIGKILLed from outside, the group restarted by the agent,
the run finished bitwise as if nothing happened (issue 38).

Every case runs tests/distributed/elastic_script.py under real torchrun agents (``--rdzv-backend c10d`` on a free
port of 127.0.0.1, gloo workers) and compares with one uninterrupted 2-process run, shared by the module. Before
``engine.launch.elastic_store``, 3 of 5 restarted groups failed in ``init_process_group``: they read the previous
attempt's gloo addresses from the agent's shared store (a hang, or "Connection refused").
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.environment import ElasticInfo, EngineEnvironment
from engine.launch.elastic_store import restart_scoped_store
from tests.conftest import free_port
from tests.process_tree import kill_all, wait_until_gone, worker_pids

if not sys.platform.startswith("linux"):
    pytest.skip("the process-tree helpers read /proc", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("elastic_script.py")
RUN_TIMEOUT_S = 120.0  # a whole torchrun job (start, kill, restart, finish) on a 2-core machine shared by the suite
KILL_AT_STEP = 4  # checkpoints after steps 3, 6, 9, 12 (EVERY = 3): a kill at 4 resumes from 3, mid-epoch 0


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("ACCELERATE_", "TORCHELASTIC_", "EMBER_", "PYTEST_", "TORCH_DISABLE_SHARE"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", **extra)
    return env


class Job:
    """One torchrun agent started on the script (a session of its own, output in ``log``), and everything it
    started: killed with it when the test ends, however it ends."""

    def __init__(self, out: Path, endpoint: str, *script_args: str, nproc: int = 2, nnodes: int = 1,
                 max_restarts: int = 1, env: dict[str, str] | None = None, name: str = "agent") -> None:
        self.log = out / f"{name}.txt"
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
                   str(nproc), "--max-restarts", str(max_restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   endpoint, "--rdzv-id", "elastic-test", str(SCRIPT), str(out), "--num-nodes", str(nnodes),
                   *script_args]
        with open(self.log, "a") as output:
            self.proc = subprocess.Popen(command, cwd=out, env=env or _environment(), stdout=output,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: set[int] = set()  # every worker pid seen (a dead agent's workers cannot be found from it)

    def workers(self) -> list[int]:
        self.seen |= set(worker_pids(self.proc.pid))
        return sorted(self.seen)

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        """The agent's exit status; on a timeout every process is killed and the test fails with the output."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.workers()
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.kill()
            raise AssertionError(f"torchrun did not finish within {timeout:.0f} s (a hang):\n{self.output()[-4000:]}")
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the agent and its workers (each worker runs in a session of its own)."""
        workers = self.workers() if self.proc.poll() is None else sorted(self.seen)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        kill_all(workers)
        self.proc.wait()
        wait_until_gone(workers, timeout=10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _held_pid(out: Path, jobs: list[Job], timeout: float = RUN_TIMEOUT_S) -> int:
    """Wait until the script's rank stops at its hold point; its pid."""
    marker = out / "held"
    deadline = time.monotonic() + timeout
    while not marker.exists():
        for job in jobs:
            job.workers()
            if job.proc.poll() is not None:
                raise AssertionError(f"torchrun ended ({job.proc.returncode}) before the hold:\n{job.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no rank reached the hold point in {timeout:.0f} s:\n{jobs[0].output()[-4000:]}")
        time.sleep(0.05)
    return int(marker.read_text())


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


def _assert_bitwise(reference: Path, out: Path) -> None:
    expected, got = _weights(reference), _weights(out)
    assert expected.keys() == got.keys()
    different = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert not different, f"weights differ from the uninterrupted run's: {different}"


def _metric_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "ember" / "version_0" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _starts(out: Path) -> list[str]:
    """``<restart count> <world size>`` of every start of rank 0's script, in order."""
    return (out / "starts_0").read_text().split("\n")[:-1]


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """The agents a test starts; whatever still runs at its end is killed."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run: 2 processes, 12 steps, under the same torchrun command."""
    out = tmp_path_factory.mktemp("reference")
    job = Job(out, f"127.0.0.1:{free_port()}")
    try:
        assert job.wait() == 0, job.output()
    finally:
        job.kill()
    assert len(_metric_rows(out)) == 12
    return out


def test_a_rank_killed_mid_epoch_is_restarted_and_the_run_ends_bitwise(reference: Path, tmp_path: Path,
                                                                         jobs: list[Job]) -> None:
    jobs.append(job := Job(tmp_path, f"127.0.0.1:{free_port()}", "--hold-at", str(KILL_AT_STEP)))
    os.kill(_held_pid(tmp_path, jobs), signal.SIGKILL)  # rank 1, after step 4; rank 0 waits in step 5
    assert job.wait() == 0, job.output()
    output = job.output()
    assert _starts(tmp_path) == ["0 2", "1 2"]  # the agent restarted the group once
    assert "Resumed from" in output and "at epoch 0, batch 3, step 3." in output, output
    _assert_bitwise(reference, tmp_path)
    assert _metric_rows(tmp_path) == _metric_rows(reference)


def test_a_rank_killed_inside_a_checkpoint_save_resumes_from_the_previous_one(reference: Path, tmp_path: Path,
                                                                              jobs: list[Job]) -> None:
    # Rank 0, the writer of a DDP run's .ckpt file, stops inside the write of step 6's, its temporary file complete
    # but not renamed into place: that checkpoint never commits.
    jobs.append(job := Job(tmp_path, f"127.0.0.1:{free_port()}", "--hold-in-save", "6", "--hold-rank", "0"))
    held = _held_pid(tmp_path, jobs)
    assert list((tmp_path / "checkpoints").glob(".*.tmp-*")), sorted(os.listdir(tmp_path / "checkpoints"))
    os.kill(held, signal.SIGKILL)
    assert job.wait() == 0, job.output()
    output = job.output()
    assert _starts(tmp_path) == ["0 2", "1 2"]
    assert "at epoch 0, batch 3, step 3." in output, output  # step 3's checkpoint, not the half-written step 6
    _assert_bitwise(reference, tmp_path)
    assert _metric_rows(tmp_path) == _metric_rows(reference)


@pytest.fixture(scope="module")
def exhausted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """A 2-process run with ``--max-restarts 0`` whose rank 1 is killed after step 4: (folder, status, output).
    Its checkpoints (2 processes, step 3) serve the world-size test too."""
    out = tmp_path_factory.mktemp("exhausted")
    job = Job(out, f"127.0.0.1:{free_port()}", "--hold-at", str(KILL_AT_STEP), max_restarts=0)
    try:
        os.kill(_held_pid(out, [job]), signal.SIGKILL)
        code = job.wait()
    finally:
        job.kill()
    return out, code, job.output()


def test_when_the_restarts_are_spent_the_output_names_the_newest_checkpoint(
        exhausted: tuple[Path, int, str]) -> None:
    out, code, output = exhausted
    assert code == 1, output  # torchrun's own status when a worker failed and no restart is left
    newest = out / "checkpoints" / "last.ckpt"
    # Rank 1 was killed and says nothing; rank 0 fails in its next collective and names where to resume from.
    assert (f"[ember] rank 0: RuntimeError in the trainer; this process ends within 5 s so the other ranks do not "
            f"wait for it; the newest checkpoint is {newest}; run the same command with fit(..., "
            "ckpt_path='last') to resume from it.") in output, output


def test_two_agents_one_killed_with_its_workers_and_started_again(reference: Path, tmp_path: Path,
                                                                   jobs: list[Job]) -> None:
    """``--nnodes 2 --nproc-per-node 1``: two agents on one c10d endpoint; node 1's agent and worker are killed,
    the same command is started again, and the job ends bitwise.

    torch 2.13's agents share one TCPStore per agent across rendezvous rounds unless
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; with sharing, an agent started again (no bootstrap info yet) waits
    for the new round's ``MASTER_ADDR`` key, which the surviving rank-0 agent (bootstrap info kept from round 0)
    never writes: ``DistStoreError: wait timeout after 60000ms, keys: /torch.rendezvous.<id>.1/MASTER_ADDR``
    and the job fails. So a node that may be started again needs the variable (docs/guides/clusters.md).
    """
    endpoint = f"127.0.0.1:{free_port()}"
    env = _environment(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    args: dict[str, Any] = {"nproc": 1, "nnodes": 2, "env": env}
    jobs.append(first := Job(tmp_path, endpoint, "--hold-at", str(KILL_AT_STEP), name="node0", **args))
    _wait_for_endpoint(endpoint, first)  # node 0 hosts the rendezvous store: its agent is the one that must stay
    jobs.append(second := Job(tmp_path, endpoint, "--hold-at", str(KILL_AT_STEP), name="node1", **args))
    held = _held_pid(tmp_path, jobs)  # the rank-1 worker: node 1's (ranks follow the agents' order)
    assert held in second.workers(), (held, first.workers(), second.workers())
    second.kill()  # the agent and its worker, as a machine that goes down
    jobs.append(again := Job(tmp_path, endpoint, "--hold-at", str(KILL_AT_STEP), name="node1", **args))
    assert first.wait() == 0, first.output() + again.output()
    assert again.wait() == 0, again.output()
    _assert_bitwise(reference, tmp_path)
    assert _metric_rows(tmp_path) == _metric_rows(reference)


def _wait_for_endpoint(endpoint: str, job: Job, timeout: float = 60.0) -> None:
    """Wait until the agent listens on ``endpoint`` (it hosts the c10d rendezvous store)."""
    import socket

    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the first agent did not open {endpoint}:\n{job.output()}")


def test_a_resume_on_another_world_size_is_refused_unless_asked_for(exhausted: tuple[Path, int, str],
                                                                    jobs: list[Job]) -> None:
    """Checkpoints written by 2 processes, then the same command with 1 process: refused, naming both sizes and
    the opt-in; with ``EMBER_ALLOW_WORLD_SIZE_CHANGE=1`` it resumes, with the engine's warning."""
    out = exhausted[0]
    jobs.append(one := Job(out, f"127.0.0.1:{free_port()}", nproc=1, max_restarts=0, name="one"))
    assert one.wait() != 0
    folder = out / "checkpoints" / "last.ckpt"
    assert (f"ValueError: fit(ckpt_path='last'): the checkpoint {folder} was saved by 2 process(es), and this run "
            "has 1.") in one.output(), one.output()
    assert "Start 2 process(es) to resume exactly, or set EMBER_ALLOW_WORLD_SIZE_CHANGE=1" in one.output()
    assert not (out / "final.pt").exists()

    jobs.append(allowed := Job(out, f"127.0.0.1:{free_port()}", nproc=1, max_restarts=0, name="allowed",
                               env=_environment(EMBER_ALLOW_WORLD_SIZE_CHANGE="1")))
    assert allowed.wait() == 0, allowed.output()
    assert f"Checkpoint {folder} was saved by 2 processes and is loaded by 1" in allowed.output()
    assert "Resumed from" in allowed.output() and (out / "final.pt").exists()


# -- the pieces, without processes ------------------------------------------------------------------------------
def test_a_torchrun_worker_on_the_agent_store_gets_a_store_scoped_to_its_restart() -> None:
    env = EngineEnvironment.from_env({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "1",
                                      "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert env.elastic == ElasticInfo(restart_count=1, agent_store=True)
    # torch writes the flag as str(bool): "False" (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) and other launchers
    # (no TORCHELASTIC_* at all) keep the default env:// rendezvous.
    for environ in ({"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_USE_AGENT_STORE": "False"}, {}):
        assert restart_scoped_store(EngineEnvironment.from_env(environ), None) is None
    with pytest.raises(ValueError, match="MASTER_ADDR=None / MASTER_PORT=None: torchrun sets all three"):
        restart_scoped_store(env, None)
    assert EngineEnvironment.from_env({"EMBER_ALLOW_WORLD_SIZE_CHANGE": "1"}).allow_world_size_change
    assert not EngineEnvironment.from_env({}).allow_world_size_change
