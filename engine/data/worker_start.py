"""The fork guard: a pass's forked loader workers are seen to start, and a worker stuck inside ``fork`` is replaced.

Issue 39 caught a rank of a 2-process resume waiting forever for its first batch of an epoch: the loader worker it
had just forked was still inside ``os.fork()``. The cause, reproduced by benchmarks/fork_hang.py and read in the
stuck child with gdb: the child waits in ``PyOS_AfterFork_Child`` -> ``_PyThreadState_DeleteExcept`` for the lock
that guards the interpreter's list of thread states (``HEAD_LOCK``), which another thread of the parent held at
the instant of the fork. CPython before 3.11.10 / 3.12 takes that lock in the child before making it anew
(CPython gh-112275). The other thread is one of gloo's: each time a finished collective frees a tensor whose
Python object it holds, gloo's thread creates a Python thread state (pybind11's ``gil_scoped_acquire`` in
``TensorImpl::decref_pyobject``), taking the lock without the GIL; an FSDP2 run of tests/trainer/resume_script.py
does so hundreds of times a minute. torch's DataLoader then waits for the child's batch without end, since the
child is alive. Ember cannot hold or reset that lock from Python, so the guard is the cure on affected
interpreters (and a safety net on every other one, for any lock a fork can inherit):

- each forked worker writes its id into a pipe as the first thing its ``worker_init_fn`` does (before the
  user's, before any data is read);
- the rank waits until every worker of the pass has, up to ``start_limit()`` seconds (10 by default; the
  environment variable ``EMBER_LOADER_WORKER_START_S`` sets it), doubled at each new try: a fork takes
  milliseconds even under load;
- a worker that has not started by then is SIGKILLed (no signal handler of the child's could run) and the pass's
  workers are started again from the same random states, so the batches are the ones the pass would have had,
  and a warning names the worker, its kernel wait state, the limit and, on an affected Python, the fix; after
  ``START_ATTEMPTS`` failed starts, the rank raises ``LoaderWorkerStartError``.

Workers started by ``spawn`` or ``forkserver`` are not guarded: they are not forked from the training process.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from engine.data.workers import LoaderWorkerTimeout, unwatch_workers

DEFAULT_START_LIMIT_S = 10.0
START_ATTEMPTS = 3
START_LIMIT_ENV = "EMBER_LOADER_WORKER_START_S"
_ID = struct.Struct("<I")  # one worker id: 4 bytes, written whole (a pipe write under PIPE_BUF is atomic)


class LoaderWorkerStartError(LoaderWorkerTimeout):
    """Forked DataLoader workers did not start, START_ATTEMPTS times in a row."""


def start_limit() -> float:
    """Seconds a rank first waits for a pass's forked workers to start (``EMBER_LOADER_WORKER_START_S``, else 10)."""
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


def fork_lock_note() -> str:
    """On a Python whose fork can inherit a held thread-state lock (CPython gh-112275), what to upgrade to."""
    version = sys.version_info
    if version >= (3, 12) or (version[:2] == (3, 11) and version >= (3, 11, 10)):
        return ""
    shown = ".".join(str(part) for part in version[:3])
    return (f" This Python ({shown}) has CPython gh-112275 (a forked child can wait forever for the thread-state "
            f"lock another thread held at the fork, as gloo's threads do): Python 3.11.10 or 3.12+ fixes it.")


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
    first_limit = start_limit()
    for attempt in range(1, START_ATTEMPTS + 1):
        limit = first_limit * 2 ** (attempt - 1)  # a slow start under load gets more time, a stuck one no more
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
                f"Forked DataLoader workers did not start, {START_ATTEMPTS} times in a row (the last time within "
                f"{limit:g} s: {described}). If forking a worker legitimately takes longer here, raise "
                f"{START_LIMIT_ENV}; else start the workers another way: "
                f"DataLoader(multiprocessing_context='forkserver').{fork_lock_note()}")
        warnings.warn(
            f"A DataLoader worker had not started {limit:g} s after it was forked ({described}): a process forked "
            f"while another of its threads held a lock can hang inside fork. It was killed and this pass's workers "
            f"were started again from the same random states (attempt {attempt + 1} of {START_ATTEMPTS}); the "
            f"batches are unchanged. The limit is {START_LIMIT_ENV}.{fork_lock_note()}", RuntimeWarning, stacklevel=2)
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
    unwatch_workers(iterator)
    for pid in stuck:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    iterator._shutdown_workers()
