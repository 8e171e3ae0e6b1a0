"""A killed launcher takes its workers with it within seconds (promise 4: no orphans).

Each launcher Ember meets is started for real on this machine with a ``Trainer(devices=2)`` script: torchrun
(``torch.distributed.run``), ``ember launch``, and a plain ``python script.py`` whose Trainer starts its own two
workers. The launcher is SIGKILLed (it cannot stop its workers then) either before the rendezvous can complete
(one rank is held back) or in the middle of training, and every worker must be gone within ``GONE_WITHIN_S``.
Before the launcher watch (``engine.launch.watch``), the workers were still alive 45 s later.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.process_tree import kill_all, survivors, wait_for_workers, wait_until_gone, worker_pids

if not sys.platform.startswith("linux"):
    pytest.skip("the process-tree helpers read /proc", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("launcher_death_script.py")
GONE_WITHIN_S = 10.0  # the watch polls every 0.5 s; the rest is slack for a loaded 2-core machine
START_TIMEOUT_S = 120.0  # the launcher and both workers import torch on a machine the whole suite shares
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
    "ember launch": [sys.executable, "-m", "engine.launch.cli", "launch", "--nproc-per-node", "2", "--cpu"],
    "Trainer(devices=2)": [sys.executable],  # the script itself: its Trainer starts the workers
}


def _environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("ACCELERATE_", "TORCHELASTIC_", "EMBER_", "PYTEST_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", EMBER_CONFIG_FILE=str(tmp_path / "none.yaml"))
    return env


def _wait_for_training(out_dir: Path, steps: int, timeout: float) -> None:
    """Wait until both ranks have trained ``steps`` steps (they write their batch index after each one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [int(text) for text in (_read(out_dir / f"rank{r}.step") for r in range(2)) if text]
        if len(done) == 2 and min(done) >= steps:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the ranks did not train {steps} steps within {timeout:.0f} s")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("mode", ["rendezvous", "training"])
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_workers_exit_within_seconds_of_a_killed_launcher(launcher: str, mode: str, tmp_path: Path) -> None:
    log = tmp_path / "output.txt"
    with open(log, "w") as output:
        # A session of its own, as a scheduler would start it; the workers start sessions of their own too.
        proc = subprocess.Popen([*LAUNCHERS[launcher], str(SCRIPT), mode, str(tmp_path)], cwd=tmp_path,
                                env=_environment(tmp_path), stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)
    workers: list[int] = []
    try:
        workers = wait_for_workers(proc.pid, count=2, timeout=START_TIMEOUT_S)
        if mode == "rendezvous":
            time.sleep(1.0)  # as in the report: 1 s after the workers started, while rank 1 is held back
        else:
            _wait_for_training(tmp_path, steps=3, timeout=START_TIMEOUT_S)
        workers = sorted(set(workers) | set(worker_pids(proc.pid)))
        proc.kill()  # SIGKILL: the launcher gets no chance to stop its workers
        proc.wait()
        left, seconds = wait_until_gone(workers, timeout=GONE_WITHIN_S)
    finally:
        kill_all([proc.pid, *workers])
    text = log.read_text()
    assert left == [], (f"{launcher}: {len(left)} of {len(workers)} workers {left} still ran {seconds:.1f} s after "
                        f"the launcher was killed ({mode}):\n{text[-3000:]}")
    assert survivors(workers) == []
    # A torchrun worker that was re-parented before it imported Ember no longer knows the launcher's pid.
    named = f"(pid {proc.pid}|this worker's parent)" if launcher == "torchrun" else f"pid {proc.pid}"
    # At least one rank saw the launcher go. The other may see its peer go first (its collective fails): it then
    # ends through the trainer's failure path, saying so, which is as prompt (the workers are gone, above).
    gone = [rank for rank in range(2)
            if re.search(fr"\[ember\] rank {rank}: the launcher \({named}\) is gone; this worker exits", text)]
    assert gone, text[-3000:]
    for rank in set(range(2)) - set(gone):
        assert re.search(fr"\[ember\] rank {rank}: \w+ in the trainer; this process ends", text), text[-3000:]
