"""The fork guard (engine/data/worker_start.py): a forked loader worker stuck inside fork is replaced and the pass
gives the batches it would have given; a fork that never works ends with an error naming the fixes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from engine.data.worker_start import DEFAULT_START_LIMIT_S, START_LIMIT_ENV, start_limit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "engine", "worker_start_script.py")


def run(*args: str, limit: str = "2") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT, START_LIMIT_ENV: limit}
    return subprocess.run([sys.executable, SCRIPT, *args], check=False, capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


def pids(flag: str) -> list[int]:
    with open(flag) as handle:
        return [int(line) for line in handle.read().split()]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return "State:\tZ" in handle.read()
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("persistent, epoch", [(False, 1), (True, 0)], ids=["per-epoch", "persistent"])
def test_a_worker_stuck_inside_fork_is_replaced_and_the_batches_are_unchanged(tmp_path: Any, persistent: bool,
                                                                             epoch: int) -> None:
    extra = ["--persistent"] if persistent else []
    clean = run(*extra)
    assert clean.returncode == 0, clean.stderr
    flag = str(tmp_path / "stalled")
    stalled = run(*extra, "--stall-epoch", str(epoch), "--flag", flag)
    assert stalled.returncode == 0, stalled.stderr
    # the same batches (worker seeds included) and the same global random stream after them
    assert json.loads(stalled.stdout) == json.loads(clean.stdout)
    assert "A DataLoader worker had not started 2 s after it was forked (worker 0 (pid" in stalled.stderr
    assert "(attempt 2 of 3); the batches are unchanged" in stalled.stderr
    assert "wchan" in stalled.stderr  # the kernel's word for what it waited in
    (stuck,) = pids(flag)
    assert gone(stuck)


def test_workers_that_never_start_end_the_pass_with_the_fixes_named(tmp_path: Any) -> None:
    flag = str(tmp_path / "stalled")
    result = run("--stall-epoch", "0", "--always", "--flag", flag, limit="1")
    assert result.returncode != 0
    assert "LoaderWorkerStartError: Forked DataLoader workers did not start within 1 s, 3 times in a row" in result.stderr
    assert f"raise {START_LIMIT_ENV}" in result.stderr and "multiprocessing_context='forkserver'" in result.stderr
    stuck = pids(flag)
    assert len(stuck) >= 3 and all(gone(pid) for pid in stuck)


def test_the_start_limit_is_thirty_seconds_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(START_LIMIT_ENV, raising=False)
    assert start_limit() == DEFAULT_START_LIMIT_S == 30.0
    monkeypatch.setenv(START_LIMIT_ENV, "4.5")
    assert start_limit() == 4.5
    for bad in ("0", "soon"):
        monkeypatch.setenv(START_LIMIT_ENV, bad)
        with pytest.raises(ValueError, match=rf"{START_LIMIT_ENV} must be a number of seconds > 0.*got "
                                             rf"{START_LIMIT_ENV}='{bad}'"):
            start_limit()
