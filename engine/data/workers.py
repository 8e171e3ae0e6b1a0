"""A limit on how long a process waits for a DataLoader worker's batch, and the stuck worker's stack when it is hit.

A DataLoader waits for a worker's batch without end by default (``timeout=0``). A worker that never answers (a
deadlock, a read that never returns) then holds its rank in ``_get_data`` forever, and every other rank in its next
collective: no error, no exit. A prepared loader therefore waits at most ``worker_timeout`` seconds
(``DataLoaderConfiguration(worker_timeout=...)``) when the user's DataLoader sets no ``timeout`` of its own (theirs
wins when set), then raises ``LoaderWorkerTimeout`` carrying the stacks of its workers, which each worker writes
on request (``faulthandler`` on ``STACK_SIGNAL``, registered when the worker starts).
Why a limit rather than a cure: issue 39 saw a rank of a 2-process resume wait in ``_get_data`` forever, once in a
while in CI; it did not happen here in 40 resumed runs (4,000 worker starts) under CPU load (benchmarks/
resume_hang.py), so its cause is unknown. With the limit, the next occurrence ends the run with the stuck worker's
stack instead of a silent wait.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import tempfile
import time
import weakref
from typing import Any, TextIO

# A real-time signal: unlike SIGUSR1/SIGUSR2 (SLURM's and Lightning's preemption signals) nothing sends it to a
# job's processes, and a worker that has not registered the handler yet is merely ended by it.
STACK_SIGNAL = signal.SIGRTMIN + 6
DEFAULT_WORKER_TIMEOUT_S = 600.0
_DUMP_WAIT_S = 2.0  # how long a worker gets to write its stacks once asked


class LoaderWorkerTimeout(RuntimeError):
    """A DataLoader worker sent no batch within the loader's time limit (its stacks are in the message)."""


def worker_timeout_of(loader_timeout: float, worker_timeout: float | None) -> float:
    """The seconds a rank waits for a worker's batch: the DataLoader's own ``timeout`` when the user set one, else
    ``worker_timeout`` (None or 0: no limit)."""
    if loader_timeout > 0:
        return float(loader_timeout)
    return float(worker_timeout or 0.0)


def check_worker_timeout(value: Any) -> float | None:
    """``DataLoaderConfiguration(worker_timeout=...)`` validated: seconds > 0, or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"DataLoaderConfiguration(worker_timeout=...) must be a number of seconds > 0, or None to "
                         f"wait for loader workers without a limit; got worker_timeout={value!r}.")
    return float(value)


class WorkerStacks:
    """Where a loader's workers write their stacks when asked, and the collecting of them.

    One folder per loader (created when workers first start, removed when the loader is collected); each worker
    writes ``{pid}.stack`` there. A worker opens its file at start, so a stuck worker needs nothing but the
    signal handler (faulthandler writes from the handler itself, without the GIL) to answer.
    """

    def __init__(self) -> None:
        self.directory: str | None = None

    def start_pass(self, persistent: bool) -> str:
        """The folder for this pass's workers; a new pass of non-persistent workers drops the last pass's files."""
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="ember-loader-stacks-")
            weakref.finalize(self, shutil.rmtree, self.directory, True)
        elif not persistent:
            for name in os.listdir(self.directory):
                os.remove(os.path.join(self.directory, name))
        return self.directory

    def collect(self, pids: list[int]) -> dict[int, str]:
        """Ask each worker for its stacks and return what each wrote (or why there is nothing), by pid."""
        if self.directory is None:
            return {}
        for pid in pids:
            try:
                os.kill(pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        paths = {pid: os.path.join(self.directory, f"{pid}.stack") for pid in pids}
        deadline = time.monotonic() + _DUMP_WAIT_S
        written: dict[int, str] = {}
        while time.monotonic() < deadline and len(written) < len(pids):
            time.sleep(0.1)
            for pid, path in paths.items():
                if pid not in written and os.path.exists(path) and os.path.getsize(path) > 0:
                    time.sleep(0.1)  # the handler writes in pieces: let it finish
                    with open(path, errors="replace") as handle:
                        written[pid] = handle.read()
        for pid in pids:
            written.setdefault(pid, "(no stack: the worker had not started its worker_init_fn, or is gone)\n")
        return written


def register_stack_dump(directory: str) -> TextIO:
    """In a worker: write every thread's stack to ``{directory}/{pid}.stack`` when ``STACK_SIGNAL`` arrives.

    Returns the open file, which the caller keeps (faulthandler writes to its descriptor)."""
    handle = open(os.path.join(directory, f"{os.getpid()}.stack"), "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
    return handle


def timeout_error(stacks: WorkerStacks, iterator: Any, seconds: float, user_set: bool) -> LoaderWorkerTimeout:
    """The error a rank raises when no worker sent a batch within ``seconds``, with every worker's stack."""
    workers = list(getattr(iterator, "_workers", []))
    alive = [worker.pid for worker in workers if worker.is_alive() and worker.pid is not None]
    dumped = stacks.collect(alive)
    text = "".join(f"\n--- loader worker pid {pid} ---\n{stack}" for pid, stack in dumped.items())
    setting = ("the DataLoader's own timeout=... (set by you)" if user_set else
               "DataLoaderConfiguration(worker_timeout=...) (for a Trainer: Trainer(accelerator=Accelerator("
               "dataloader_config=DataLoaderConfiguration(worker_timeout=...)))), or None for no limit")
    return LoaderWorkerTimeout(
        f"No DataLoader worker sent a batch within {seconds:g} s on this process: a worker is stuck (its stack is "
        f"below) or its reads are slower than the limit. If batches can legitimately take longer, raise {setting}."
        f"\nWorker stacks:{text or ' (no live workers)'}")


def is_worker_timeout(error: RuntimeError) -> bool:
    """Whether ``error`` is DataLoader's own "timed out" error (the limit set above was reached)."""
    return str(error).startswith("DataLoader timed out after")
