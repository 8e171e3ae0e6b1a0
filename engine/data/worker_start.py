"""The fork guard: a pass's forked loader workers are seen to start, and a worker stuck inside ``fork`` is replaced.

Issue 39 caught a rank of a 2-process resume waiting forever for its first batch of an epoch: the loader worker
it had just forked was still inside ``os.fork()`` (its only Python frame ``popen_fork.py``, line 66), with the
parent's thread states of the fork instant still listed, one of them a thread with no Python frame that was gone
from the parent moments later. A process that forks while another of its threads holds a lock the child needs
(gloo's and torch's threads run during training) can hang that way; torch's DataLoader then waits for the
child's batch without end, since the child is alive. The exact lock was not caught (it happens about once in
five full test runs under load, never in thousands of forks of a quiet reproduction), so the guard is general:

- each forked worker writes its id into a pipe as the first thing its ``worker_init_fn`` does (before the
  user's, before any data is read);
- the rank waits until every worker of the pass has, up to ``start_limit()`` seconds (30 by default; the
  environment variable ``EMBER_LOADER_WORKER_START_S`` sets it): a fork takes milliseconds even under load;
- a worker that has not started by then is SIGKILLed (no signal handler of the child's could run) and the pass's
  workers are started again from the same random states, so the batches are the ones the pass would have had,
  and a warning names the worker, its kernel wait state and the limit; after ``START_ATTEMPTS`` failed starts,
  the rank raises ``LoaderWorkerStartError``.

Workers started by ``spawn`` or ``forkserver`` are not guarded: they are not forked from the training process.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from engine.data.workers import LoaderWorkerTimeout

DEFAULT_START_LIMIT_S = 30.0
START_ATTEMPTS = 3
START_LIMIT_ENV = "EMBER_LOADER_WORKER_START_S"
_ID = struct.Struct("<I")  # one worker id: 4 bytes, written whole (a pipe write under PIPE_BUF is atomic)


class LoaderWorkerStartError(LoaderWorkerTimeout):
    """Forked DataLoader workers did not start, START_ATTEMPTS times in a row."""


def start_limit() -> float:
    """Seconds a rank waits for a pass's forked workers to start (``EMBER_LOADER_WORKER_START_S``, else 30)."""
    raw = os.environ.get(START_LIMIT_ENV)
    if raw is None:
        return DEFAULT_START_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{START_LIMIT_ENV} must be a number of seconds > 0 (how long a rank waits for a forked "
                         f"DataLoader worker to start); got {START_LIMIT_ENV}={raw!r}. Unset it for the default "
                         f"{DEFAULT_START_LIMIT_S:g} s.")
    return value


def announce_start(pipe: tuple[int, int], worker_id: int) -> None:
    """In a worker, first thing: say it started, and close its copies of the pipe (its own children's forks must
    not hold the rank's pipe open)."""
    read_fd, write_fd = pipe
    try:
        os.write(write_fd, _ID.pack(worker_id))
    finally:
        os.close(write_fd)
        os.close(read_fd)


def guarded_start(start: Callable[[tuple[int, int]], Any], restore: Callable[[], None]) -> Any:
    """``start(pipe)`` makes a pass's worker iterator (forking its workers, whose ``worker_init_fn`` calls
    ``announce_start(pipe, id)``); returns it once every worker has started.

    ``restore`` puts back every random state ``start`` draws from, before a start is tried again."""
    limit = start_limit()
    for attempt in range(1, START_ATTEMPTS + 1):
        pipe = os.pipe()
        try:
            iterator = start(pipe)
            workers = list(getattr(iterator, "_workers", []))
            stuck = _wait_for_starts(pipe[0], workers, limit)
        finally:
            os.close(pipe[0])
            os.close(pipe[1])
        if not stuck:
            return iterator
        described = "; ".join(f"worker {worker_id} (pid {pid}): {_wait_state(pid)}" for worker_id, pid in stuck)
        _end_workers(iterator, [pid for _, pid in stuck])
        if attempt == START_ATTEMPTS:
            raise LoaderWorkerStartError(
                f"Forked DataLoader workers did not start within {limit:g} s, {START_ATTEMPTS} times in a row "
                f"({described}). If forking a worker legitimately takes longer here, raise {START_LIMIT_ENV}; "
                f"else start the workers another way: DataLoader(multiprocessing_context='forkserver').")
        warnings.warn(
            f"A DataLoader worker had not started {limit:g} s after it was forked ({described}): a process forked "
            f"while another of its threads held a lock can hang inside fork. It was killed and this pass's workers "
            f"were started again from the same random states (attempt {attempt + 1} of {START_ATTEMPTS}); the "
            f"batches are unchanged. The limit is {START_LIMIT_ENV}.", RuntimeWarning, stacklevel=2)
        restore()
    raise AssertionError("unreachable")  # the loop returns or raises


def keep_random_states(generators: list[torch.Generator]) -> Callable[[], None]:
    """A function that puts back, as they are now, ``generators`` and the global torch, Python and NumPy RNGs:
    the draws a pass makes while it starts (the iterator's seed, a sampler's permutation)."""
    states = [g.get_state() for g in generators]
    global_states = (torch.get_rng_state(), random.getstate(), np.random.get_state())

    def restore() -> None:
        for generator, state in zip(generators, states):
            generator.set_state(state)
        torch.set_rng_state(global_states[0])
        random.setstate(global_states[1])
        np.random.set_state(global_states[2])

    return restore


def _wait_for_starts(read_fd: int, workers: list[Any], limit: float) -> list[tuple[int, int]]:
    """``(worker id, pid)`` of the workers that neither started nor ended within ``limit`` seconds."""
    pending = dict(enumerate(workers))
    deadline = time.monotonic() + limit
    unread = b""
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([read_fd], [], [], min(left, 0.5))
        if ready:
            unread += os.read(read_fd, 4096)
            whole = len(unread) - len(unread) % _ID.size
            for (worker_id,) in _ID.iter_unpack(unread[:whole]):
                pending.pop(worker_id, None)
            unread = unread[whole:]
        else:  # a worker that ended before starting is torch's to report, as "exited unexpectedly"
            pending = {worker_id: w for worker_id, w in pending.items() if w.is_alive()}
    return [(worker_id, w.pid) for worker_id, w in pending.items()]


def _wait_state(pid: int) -> str:
    """What the kernel says a process waits in (for the warning: ``futex_wait_queue`` is a lock)."""
    parts = []
    for name in ("wchan", "syscall"):
        try:
            with open(f"/proc/{pid}/{name}") as handle:
                parts.append(f"{name} {handle.read().strip()[:60] or '-'}")
        except OSError:
            pass
    return ", ".join(parts) or "no /proc entry"


def _end_workers(iterator: Any, stuck: list[int]) -> None:
    """SIGKILL the stuck workers and shut the iterator's others down, without torch's SIGCHLD check taking the
    kill for a crash."""
    from torch.utils.data._utils import signal_handling

    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for pid in stuck:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    iterator._shutdown_workers()
