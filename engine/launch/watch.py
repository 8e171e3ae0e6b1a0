"""End a worker within a second of its launcher's death (promise 4: no orphans).

torchrun's elastic agent (also inside ``ember launch`` and a ``Trainer(devices=N)`` started from a plain
``python train.py``) starts each worker in a session of its own, so a launcher that is SIGKILLed, OOM-killed or
hung up on cannot take its workers down, and they wait: up to torch's 30-minute timeout in a rendezvous or a
collective, or they train on with nobody to restart or stop them. Every launched worker therefore runs one daemon
thread that checks, twice a second, whether the launcher still lives, and ends the worker when it does not.

Which process is the launcher:

- ``EMBER_LAUNCHER_PID`` when set (``ember launch``, the Trainer's own launch, ``notebook_launcher`` and
  ``debug_launcher`` set it to their own pid before starting workers): exact even when the launcher died before
  this worker got this far.
- otherwise, in a torchrun worker (``TORCHELASTIC_RUN_ID`` set), the parent process: the agent starts its workers
  itself. A worker whose launcher died before Ember was imported has already been re-parented; when that parent is
  pid 1 and pid 1 is not a Python / torchrun process (a container whose init is torchrun is legitimate), the
  launcher is taken as gone. A re-parenting to a subreaper that early is not detectable.

The check is a parent-pid comparison when the launcher is the parent (immune to pid reuse) and otherwise the
launcher's ``/proc`` start time: no work is done on the training thread, and nothing of torch is touched. The
worker ends with ``os._exit`` after writing one line: a worker whose launcher is gone has nobody to report to, a
collective it is blocked in will never return, and interpreter shutdown with a live process group can abort
("terminate called without an active exception"). ``EMBER_WATCH_LAUNCHER=0`` turns the watch off.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

LAUNCHER_PID_VARIABLE = "EMBER_LAUNCHER_PID"
SWITCH_VARIABLE = "EMBER_WATCH_LAUNCHER"  # "0" / "false" / "no" / "off" turns the watch off
POLL_INTERVAL_S = 0.5
EXIT_CODE = 1
_THREAD_NAME = "ember-launcher-watch"
_FLUSH_WAIT_S = 1.0  # a flush blocked on a full pipe must not keep an orphan alive
_OFF = ("0", "false", "no", "off")
_DEAD_STATES = ("Z", "X", "x")  # /proc states of a process that has ended (a zombie awaits only its reaping)


@dataclass(frozen=True)
class Launcher:
    """The process a worker lives and dies with.

    ``pid`` is the launcher; ``as_parent`` says it is this worker's parent (then its death shows as a change of
    ``os.getppid()``); ``start_time`` is its ``/proc`` start time otherwise (None where there is no ``/proc``),
    so a pid reused after its death is not mistaken for it.
    """

    pid: int
    as_parent: bool
    start_time: int | None = None

    def is_alive(self) -> bool:
        """Whether the launcher still runs (a zombie, dead but not yet reaped, does not)."""
        if self.as_parent:
            return os.getppid() == self.pid
        stat = _stat(self.pid)
        if stat is None:
            return _signal_reaches(self.pid) if not os.path.isdir("/proc") else False
        state, _parent, started = stat
        return state not in _DEAD_STATES and (self.start_time is None or started == self.start_time)


def find_launcher(environ: Mapping[str, str]) -> Launcher | None:
    """The launcher this process must not outlive, None when it has none to watch (not a launched worker, the
    launcher is this process, or ``EMBER_WATCH_LAUNCHER=0``).

    Raises:
        LauncherGone: the launcher is already gone.
    """
    if environ.get(SWITCH_VARIABLE, "1").strip().lower() in _OFF:
        return None
    parent = os.getppid()
    named = environ.get(LAUNCHER_PID_VARIABLE, "").strip()
    if named:
        if not named.isdigit():
            raise ValueError(f"{LAUNCHER_PID_VARIABLE}={named!r} is not a process id; unset it (a launcher sets "
                             f"it), or set {SWITCH_VARIABLE}=0 to run without the launcher watch.")
        pid = int(named)
        if pid == os.getpid():
            return None  # the launcher itself (it sets the variable in its own environment for its workers)
        if pid == parent:
            return Launcher(pid, as_parent=True)
        stat = _stat(pid)
        if stat is None:  # no such process, or no /proc to ask (then a signal 0 tells whether the pid exists)
            if os.path.isdir("/proc") or not _signal_reaches(pid):
                raise LauncherGone(pid)
            return Launcher(pid, as_parent=False)
        if stat[0] in _DEAD_STATES or pid not in _ancestors():
            raise LauncherGone(pid)  # dead, or the pid was reused by a process that did not start this one
        return Launcher(pid, as_parent=False, start_time=stat[2])
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None  # not started by an elastic agent: nothing we know of to watch
    if parent == 1 and not _init_may_be_launcher():
        raise LauncherGone(None)
    return Launcher(parent, as_parent=True)


class LauncherGone(Exception):
    """The launcher of this worker is gone (``pid`` None when only the re-parenting to pid 1 shows it)."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid

    def message(self, rank: str) -> str:
        """The line the worker writes before it exits."""
        who = f"the launcher (pid {self.pid})" if self.pid is not None else "the launcher (this worker's parent)"
        return (f"[ember] rank {rank}: {who} is gone; this worker exits (set {SWITCH_VARIABLE}=0 to keep workers "
                "of a dead launcher running)\n")


def watch_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """Start the launcher watch for this process if it is a launched worker; True if a watch runs now.

    Called when ``engine`` is imported, and by the in-Python launchers in each worker they start (a forked worker
    inherits the parent's modules but not its threads). Idempotent: one watch per process.
    """
    environ = os.environ if environ is None else environ
    if any(thread.name == _THREAD_NAME for thread in threading.enumerate()):
        return True
    rank = environ.get("RANK", "?")
    try:
        launcher = find_launcher(environ)
    except LauncherGone as gone:
        _exit_orphaned(gone.message(rank))
    if launcher is None:
        return False
    # A daemon thread: it never holds up the interpreter's exit, and it touches nothing but os and stderr.
    threading.Thread(target=_watch, args=(launcher, rank), name=_THREAD_NAME, daemon=True).start()
    return True


def _watch(launcher: Launcher, rank: str) -> None:
    while launcher.is_alive():
        time.sleep(POLL_INTERVAL_S)
    _exit_orphaned(LauncherGone(launcher.pid).message(rank))


def _exit_orphaned(message: str) -> NoReturn:
    """Write ``message`` and end the process now (see the module docstring for why ``os._exit``)."""
    try:
        os.write(2, message.encode())  # unbuffered and lock-free: cannot wait on a lock the training thread holds
    except OSError:
        pass  # stderr may have been a pipe to the dead launcher
    # Python's buffers hold what the worker printed last; a flush can block on a pipe nobody reads, so it gets a
    # thread of its own and a short wait.
    flusher = threading.Thread(target=_flush_output, name="ember-launcher-watch-flush", daemon=True)
    flusher.start()
    flusher.join(_FLUSH_WAIT_S)
    os._exit(EXIT_CODE)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can be written to it


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid`` from ``/proc``, None when there is no such process or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces or parentheses
    return fields[0], int(fields[1]), int(fields[19])


def _ancestors() -> set[int]:
    """The pids above this process, from ``/proc`` (empty where there is no ``/proc``)."""
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return found


def _init_may_be_launcher() -> bool:
    """Whether pid 1 could be the launcher itself (a container whose entry point is torchrun or a Python script
    that starts workers); where it cannot tell, yes, so that no worker is ended by a guess."""
    try:
        with open("/proc/1/cmdline", "rb") as cmdline:
            words = cmdline.read().replace(b"\0", b" ").decode(errors="replace").lower()
    except OSError:
        return True
    return any(name in words for name in ("python", "torchrun", "torch.distributed", "ember"))


def _signal_reaches(pid: int) -> bool:
    """Whether ``pid`` exists, where there is no ``/proc`` (macOS): signal 0 checks without sending anything."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
