"""A limit on how long a process waits for a DataLoader worker's batch, and the stuck worker's stack when it is hit.

A DataLoader waits for a worker's batch without end by default (``timeout=0``). A worker that never answers (a
deadlock, a read that never returns) then holds its rank in ``_get_data`` forever, and every other rank in its next
collective: no error, no exit. A prepared loader therefore waits at most ``worker_timeout`` seconds
(``DataLoaderConfiguration(worker_timeout=...)``) when the user's DataLoader sets no ``timeout`` of its own (theirs
wins when set), then raises ``LoaderWorkerTimeout`` carrying the stacks of its workers, which each worker writes
on request (``faulthandler`` on ``STACK_SIGNAL``, registered when the worker starts).
Why a limit as well as a cure: issue 39 saw a rank of a 2-process resume wait in ``_get_data`` forever, once in a
while in CI. Its stuck worker was inside ``fork``; engine/data/worker_start.py now replaces such a worker within
seconds. Whatever else keeps a worker from answering ends the run at this limit with the worker's stack instead
of a silent wait.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import weakref
from typing import IO, Any, NamedTuple, TextIO

# A real-time signal: unlike SIGUSR1/SIGUSR2 (SLURM's and Lightning's preemption signals) nothing sends it to a
# job's processes, and a worker that has not registered the handler yet is merely ended by it.
STACK_SIGNAL = signal.SIGRTMIN + 6
DEFAULT_WORKER_TIMEOUT_S = 600.0
_DUMP_WAIT_S = 2.0  # how long a worker gets to write its stacks once asked
_MAX_STACK_BYTES = 1 << 20


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

    Each worker writes into a file it holds from its start, so a stuck worker needs nothing but the signal handler
    (faulthandler writes from the handler itself, without the GIL) to answer. Where the workers are forked (Linux's
    default start method), the files are unlinked temporary files the loader opens before the fork, one per worker
    id, which the workers inherit: nothing is left on disk even when the process is SIGKILLed (a named folder per
    loader left one behind for every killed run). A worker started by ``spawn`` or ``forkserver`` inherits no open
    file; those open ``{pid}.stack`` in a folder of this loader, removed when the loader is collected.
    """

    def __init__(self) -> None:
        self.files: list[IO[bytes]] = []
        self.directory: str | None = None

    def start_pass(self, persistent: bool, num_workers: int, forked: bool) -> StackTarget:
        """Where this pass's workers write; a new pass of non-persistent workers drops the last pass's stacks."""
        if forked:
            if len(self.files) != num_workers:
                self._close_files()
                self.files = [tempfile.TemporaryFile() for _ in range(num_workers)]  # noqa: SIM115 - kept open
                weakref.finalize(self, _close_all, list(self.files))
            elif not persistent:
                for handle in self.files:
                    os.ftruncate(handle.fileno(), 0)
            return StackTarget(descriptors=tuple(handle.fileno() for handle in self.files))
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="ember-loader-stacks-")
            weakref.finalize(self, shutil.rmtree, self.directory, True)
        elif not persistent:
            for name in os.listdir(self.directory):
                os.remove(os.path.join(self.directory, name))
        return StackTarget(directory=self.directory)

    def _close_files(self) -> None:
        _close_all(self.files)
        self.files = []

    def collect(self, workers: list[tuple[int, int]]) -> dict[int, str]:
        """Ask each worker ``(worker id, pid)`` for its stacks and return what each wrote (or why there is
        nothing), by pid."""
        if not self.files and self.directory is None:
            return {}
        for _, pid in workers:
            try:
                os.kill(pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _DUMP_WAIT_S
        written: dict[int, str] = {}
        while time.monotonic() < deadline and len(written) < len(workers):
            time.sleep(0.1)
            for worker_id, pid in workers:
                if pid not in written and self._read(worker_id, pid):
                    time.sleep(0.1)  # the handler writes in pieces: let it finish
                    written[pid] = self._read(worker_id, pid)
        for _, pid in workers:
            written.setdefault(pid, "(no stack: the worker had not started its worker_init_fn, or is gone)\n")
        return written

    def _read(self, worker_id: int, pid: int) -> str:
        if self.files:
            if worker_id >= len(self.files):
                return ""
            # pread: the worker's writes move the offset the two processes share, so read from 0 explicitly.
            return os.pread(self.files[worker_id].fileno(), _MAX_STACK_BYTES, 0).decode(errors="replace")
        assert self.directory is not None
        path = os.path.join(self.directory, f"{pid}.stack")
        try:
            with open(path, errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""


class StackTarget(NamedTuple):
    """Where the workers of one pass write their stacks: inherited descriptors by worker id, or a folder."""

    descriptors: tuple[int, ...] = ()
    directory: str | None = None


def _close_all(handles: list[IO[bytes]]) -> None:
    for handle in handles:
        handle.close()


def register_stack_dump(target: StackTarget, worker_id: int) -> TextIO | None:
    """In a worker: write every thread's stack where ``target`` says when ``STACK_SIGNAL`` arrives.

    Returns the file opened for it (a folder target), which the caller keeps: faulthandler writes to its
    descriptor. An inherited descriptor needs no file object."""
    if target.descriptors:
        if worker_id < len(target.descriptors):
            faulthandler.register(STACK_SIGNAL, file=target.descriptors[worker_id], all_threads=True, chain=False)
        return None
    assert target.directory is not None
    handle = open(os.path.join(target.directory, f"{os.getpid()}.stack"), "w")  # noqa: SIM115 - for the process's life
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
    return handle


def starts_by_fork(context: Any) -> bool:
    """Whether a DataLoader with ``multiprocessing_context=context`` forks its workers."""
    if context is None:
        return multiprocessing.get_start_method() == "fork"
    if isinstance(context, str):
        return context == "fork"
    return bool(context.get_start_method() == "fork")


def timeout_error(stacks: WorkerStacks, iterator: Any, seconds: float, user_set: bool) -> LoaderWorkerTimeout:
    """The error a rank raises when no worker sent a batch within ``seconds``, with every worker's stack."""
    workers = list(getattr(iterator, "_workers", []))  # DataLoader keeps them in worker-id order
    # A worker stuck before it registered the stack handler is ended by the signal: torch's SIGCHLD check would
    # then raise "killed by signal" in place of this error, without the stacks.
    unwatch_workers(iterator)
    alive = [(index, worker.pid) for index, worker in enumerate(workers)
             if worker.is_alive() and worker.pid is not None]
    dumped = stacks.collect(alive)
    text = "".join(f"\n--- loader worker pid {pid} ---\n{stack}" for pid, stack in dumped.items())
    setting = ("the DataLoader's own timeout=... (set by you)" if user_set else
               "DataLoaderConfiguration(worker_timeout=...) (for a Trainer: Trainer(accelerator=Accelerator("
               "dataloader_config=DataLoaderConfiguration(worker_timeout=...)))), or None for no limit")
    return LoaderWorkerTimeout(
        f"No DataLoader worker sent a batch within {seconds:g} s on this process: a worker is stuck (its stack is "
        f"below) or its reads are slower than the limit. If batches can legitimately take longer, raise {setting}."
        f"\nWorker stacks:{text or ' (no live workers)'}")


def unwatch_workers(iterator: Any) -> None:
    """Take ``iterator``'s workers off torch's SIGCHLD check (it raises in the main thread when one dies), before
    they are signalled or killed on purpose."""
    from torch.utils.data._utils import signal_handling

    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False


def is_worker_timeout(error: RuntimeError) -> bool:
    """Whether ``error`` is DataLoader's own "timed out" error (the limit set above was reached)."""
    return str(error).startswith("DataLoader timed out after")
