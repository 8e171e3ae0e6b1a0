"""Process-tree helpers for fault tests: find a launcher's workers, kill it, count the processes left behind.

Linux only (they read ``/proc``). A launcher's workers are the processes below it whose environment carries
``LOCAL_RANK`` (torchrun, ``ember launch`` and the Trainer's own launch all set it); the pids are collected while
the launcher lives, because a process whose launcher died is re-parented (to pid 1 or a subreaper) and can no
longer be found from it. The usual shape of a test::

    launcher = subprocess.Popen([...torchrun...], start_new_session=True)
    workers = wait_for_workers(launcher.pid, count=2, timeout=60)
    try:
        launcher.kill()
        left, seconds = wait_until_gone(workers, timeout=15)
        assert left == [], f"{len(left)} orphans after {seconds:.1f} s"
    finally:
        kill_all([launcher.pid, *workers])
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable

_POLL_S = 0.05


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None if there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses: split after the last one.
    return text[text.rfind(")") + 2:].split()


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs: a zombie (dead, not yet reaped) counts as gone."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X", "x")


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (one scan of ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Every pid below ``pid`` in the process tree (children, their children, ...)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = [child for parent in frontier for child in children(parent)]
        found += below
        frontier = below
    return sorted(found)


def has_variable(pid: int, name: str) -> bool:
    """Whether ``pid`` was started with the environment variable ``name`` (its environment at exec or fork)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            entries = environ.read().split(b"\0")
    except OSError:
        return False
    return any(entry.startswith(name.encode() + b"=") for entry in entries)


def worker_pids(launcher_pid: int) -> list[int]:
    """The training workers below ``launcher_pid``: its descendants started with ``LOCAL_RANK`` set (a worker's
    own DataLoader workers and other children inherit it, and are counted too: they belong to the run)."""
    return [pid for pid in descendants(launcher_pid) if has_variable(pid, "LOCAL_RANK")]


def wait_for_workers(launcher_pid: int, count: int, timeout: float,
                     select: Callable[[int], list[int]] = worker_pids) -> list[int]:
    """Wait until ``launcher_pid`` has at least ``count`` workers and return them.

    ``select(launcher_pid)`` lists them: ``worker_pids`` by default, ``descendants`` for workers that a launcher
    forks from itself (``notebook_launcher``, ``debug_launcher``: they set ``LOCAL_RANK`` after they start, which
    ``/proc/<pid>/environ`` does not show).

    Raises ``TimeoutError`` naming what was found if they do not appear within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    found: list[int] = []
    while time.monotonic() < deadline:
        found = select(launcher_pid)
        if len(found) >= count:
            return found
        if not is_running(launcher_pid):
            break
        time.sleep(_POLL_S)
    raise TimeoutError(f"launcher {launcher_pid} (running: {is_running(launcher_pid)}) had {len(found)} worker(s) "
                       f"{found} after {timeout:.0f} s; expected {count}")


def survivors(pids: Iterable[int]) -> list[int]:
    """The pids in ``pids`` that still run (the orphans, once their launcher is dead)."""
    return [pid for pid in pids if is_running(pid)]


def wait_until_gone(pids: Iterable[int], timeout: float) -> tuple[list[int], float]:
    """Wait up to ``timeout`` seconds for every pid in ``pids`` to end.

    Returns ``(survivors, seconds)``: the pids still running at the end (empty when all ended) and the seconds
    waited until the last one ended (``timeout`` or a little more when some survived).
    """
    pids = list(pids)
    start = time.monotonic()
    left = survivors(pids)
    while left and time.monotonic() - start < timeout:
        time.sleep(_POLL_S)
        left = survivors(left)
    return left, time.monotonic() - start


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL every pid in ``pids`` that still runs (cleanup: no test may leave a process behind)."""
    for pid in pids:
        if is_running(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
