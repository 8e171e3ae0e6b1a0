"""The fork guard (engine/data/worker_start.py): a forked loader worker stuck inside fork is replaced and the pass
gives the batches it would have given; a fork that never works ends with an error naming the fixes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from engine.data.worker_start import DEFAULT_START_LIMIT_S, START_LIMIT_ENV, fork_lock_note, start_limit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "engine", "worker_start_script.py")


def run(*args: str, limit: str = "4") -> subprocess.CompletedProcess[str]:
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
    assert "A DataLoader worker had not started 4 s after it was forked (worker 0 (pid" in stalled.stderr
    assert "(attempt 2 of 3); the batches are unchanged" in stalled.stderr
    assert "wchan" in stalled.stderr  # the kernel's word for what it waited in
    assert ("gh-112275" in stalled.stderr) == bool(fork_lock_note())  # the fix named where the Python needs it
    (stuck,) = pids(flag)
    assert gone(stuck)


def test_workers_that_never_start_end_the_pass_with_the_fixes_named(tmp_path: Any) -> None:
    flag = str(tmp_path / "stalled")
    result = run("--stall-epoch", "0", "--always", "--flag", flag, limit="1")
    assert result.returncode != 0
    assert ("LoaderWorkerStartError: Forked DataLoader workers did not start, 3 times in a row (the last time "
            "within 4 s") in result.stderr  # 1 s, then 2, then 4
    assert f"raise {START_LIMIT_ENV}" in result.stderr and "multiprocessing_context='forkserver'" in result.stderr
    stuck = pids(flag)
    assert len(stuck) >= 3 and all(gone(pid) for pid in stuck)


def test_the_start_limit_is_ten_seconds_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(START_LIMIT_ENV, raising=False)
    assert start_limit() == DEFAULT_START_LIMIT_S == 10.0
    monkeypatch.setenv(START_LIMIT_ENV, "4.5")
    assert start_limit() == 4.5
    for bad in ("0", "soon"):
        monkeypatch.setenv(START_LIMIT_ENV, bad)
        with pytest.raises(ValueError, match=rf"{START_LIMIT_ENV} must be a number of seconds > 0.*got "
                                             rf"{START_LIMIT_ENV}='{bad}'"):
            start_limit()


def test_the_messages_name_the_python_fix_only_on_a_python_that_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for version, affected in [((3, 11, 7), True), ((3, 10, 14), True), ((3, 11, 10), False), ((3, 12, 0), False)]:
        monkeypatch.setattr(sys, "version_info", (*version, "final", 0))
        note = fork_lock_note()
        assert bool(note) is affected, version
        if affected:
            assert f"This Python ({'.'.join(map(str, version))}) has CPython gh-112275" in note
            assert "Python 3.11.10 or 3.12+ fixes it" in note
