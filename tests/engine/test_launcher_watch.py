"""Which launcher a worker watches, and what it decides when that launcher is gone (``engine.launch.watch``).

The end-to-end kills (torchrun, ``ember launch``, a Trainer's own launch) are in
tests/distributed/test_launcher_death.py; these check the decisions on real processes of this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.launch.watch import Launcher, LauncherGone, find_launcher, watch_launcher

if not sys.platform.startswith("linux"):
    pytest.skip("the pid-reuse and zombie checks read /proc", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process of this one: alive, but not an ancestor."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid names no process now
    return proc.pid


def test_a_process_no_launcher_started_watches_nothing() -> None:
    assert find_launcher({}) is None
    assert find_launcher({"RANK": "0", "WORLD_SIZE": "2"}) is None  # a test helper's rank: no launcher to watch
    assert watch_launcher({}) is False


def test_the_switch_turns_the_watch_off() -> None:
    assert find_launcher({"EMBER_WATCH_LAUNCHER": "0", "EMBER_LAUNCHER_PID": str(_dead_pid())}) is None


def test_a_torchrun_worker_watches_its_parent() -> None:
    launcher = find_launcher({"TORCHELASTIC_RUN_ID": "job"})
    assert launcher == Launcher(os.getppid(), as_parent=True)
    assert launcher.is_alive()


def test_the_named_launcher_is_watched_as_parent_or_ancestor() -> None:
    assert find_launcher({"EMBER_LAUNCHER_PID": str(os.getppid())}) == Launcher(os.getppid(), as_parent=True)
    assert find_launcher({"EMBER_LAUNCHER_PID": str(os.getpid())}) is None  # the launcher process itself
    grandparent = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if grandparent > 1:
        launcher = find_launcher({"EMBER_LAUNCHER_PID": str(grandparent)})
        assert launcher is not None and not launcher.as_parent and launcher.is_alive()


def test_a_launcher_dead_before_the_worker_looked_is_gone() -> None:
    pid = _dead_pid()
    with pytest.raises(LauncherGone) as gone:
        find_launcher({"EMBER_LAUNCHER_PID": str(pid)})
    assert gone.value.message("3").startswith(f"[ember] rank 3: the launcher (pid {pid}) is gone; this worker exits")


def test_a_reused_pid_is_not_taken_for_the_launcher(sleeper: subprocess.Popen[bytes]) -> None:
    # The pid runs, but it did not start this process: the launcher died and its pid went to another process.
    with pytest.raises(LauncherGone):
        find_launcher({"EMBER_LAUNCHER_PID": str(sleeper.pid)})


def test_an_ancestor_launcher_that_ends_is_seen_dead(sleeper: subprocess.Popen[bytes]) -> None:
    start_time = int(Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    watched = Launcher(sleeper.pid, as_parent=False, start_time=start_time)
    assert watched.is_alive()
    assert not Launcher(sleeper.pid, as_parent=False, start_time=start_time + 1).is_alive()  # another process
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie still has its pid
    assert not watched.is_alive()


def test_a_bad_launcher_pid_is_named() -> None:
    with pytest.raises(ValueError, match="EMBER_LAUNCHER_PID='abc' is not a process id"):
        find_launcher({"EMBER_LAUNCHER_PID": "abc"})


def test_a_worker_whose_launcher_died_before_it_imported_engine_exits_at_once() -> None:
    env = {**os.environ, "EMBER_LAUNCHER_PID": str(_dead_pid()), "RANK": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("EMBER_WATCH_LAUNCHER", None)
    done = subprocess.run([sys.executable, "-c", "import engine; print('still running')"], check=False, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert "still running" not in done.stdout
    assert f"[ember] rank 1: the launcher (pid {env['EMBER_LAUNCHER_PID']}) is gone; this worker exits" in done.stderr
