"""Native (C/C++) stacks of a stuck process group, for a test's timeout report.

faulthandler shows Python frames only; issue 39's stuck loader worker was inside ``os.fork()``, where the lock it
waited on is visible in its C stack alone. Where gdb is installed, a timeout also prints every thread's native
stack of every process in the groups (gdb attaches read-only and detaches); elsewhere this prints nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def group_members(groups: list[int]) -> list[int]:
    """Every live process whose process group is one of ``groups``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups:  # after the command name: state, ppid, pgrp
            members.append(int(entry))
    return members


def print_native_stacks(groups: list[int], seconds: float = 30.0) -> None:
    gdb = shutil.which("gdb")
    if gdb is None:
        return
    for pid in group_members(groups):
        try:
            result = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 40"],
                                    check=False, capture_output=True, text=True, timeout=seconds)
            text = result.stdout
        except subprocess.TimeoutExpired:
            text = "(gdb did not answer)"
        print(f"--- native stacks of pid {pid} ---\n{text}", file=sys.stderr, flush=True)
