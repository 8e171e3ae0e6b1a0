"""A SIGKILL at any instant while an asynchronous save is in flight (between the snapshot and the commit
included) leaves the previous checkpoint intact, never exposes the one in flight, and a run resumed from what
is left ends bitwise equal to an uninterrupted one (DESIGN.md promises 1, 2 and 9).

The children are the savers of ``test_checkpoint_crash``, saving with ``async_save=True`` and scrambling the
weights right after each call returns (training goes on), so a checkpoint that holds anything but the state at
its call is caught too.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch

from tests.engine.test_checkpoint import Run, assert_same_run
from tests.engine.test_checkpoint_crash import _DIST_VARS, _build, _check, _context, _die_at, _stamp_next

_CHILD_TIMEOUT_S = 60


def _scramble(model: torch.nn.Module, stamp: Any) -> None:
    """What training does right after an asynchronous save returns: change the state being written."""
    stamp.number = -7
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(-7.0)


def _async_saver(project_dir: str, kill_at: int, ready: Any, seen: Any) -> None:
    """Child: one async save dying at file-system call ``kill_at`` (> 0), or async saves until killed (0)."""
    for name in _DIST_VARS:
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    acc, model, stamp = _build(project_dir)
    _stamp_next(acc, model, stamp)
    if kill_at == 0:
        ready.set()
        while True:
            acc.save_state(async_save=True)
            _scramble(model, stamp)
            _stamp_next(acc, model, stamp)  # the next save_state waits for the one in flight
    _die_at(kill_at, seen)
    acc.save_state(async_save=True)
    _scramble(model, stamp)
    acc.wait_for_checkpoint()


def _run(ctx: Any, project_dir: str, kill_at: int, delay: float | None = None) -> bool:
    """Start an async saver, let it die (or kill it after ``delay`` s); returns whether it was killed."""
    ready, seen = ctx.Event(), ctx.Value("i", 0)
    proc = ctx.Process(target=_async_saver, args=(project_dir, kill_at, ready, seen), daemon=True)
    proc.start()
    if delay is not None:
        assert ready.wait(_CHILD_TIMEOUT_S), "the saver did not start"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(_CHILD_TIMEOUT_S)
    assert proc.exitcode in (-signal.SIGKILL, 0), f"saver failed with exit code {proc.exitcode}"
    return proc.exitcode == -signal.SIGKILL


def test_sigkill_between_any_two_file_system_calls_of_an_async_save(tmp_path: Path) -> None:
    ctx = _context()
    project = str(tmp_path)
    parent = _build(project)
    for _ in range(2):  # two committed checkpoints first, so that the killed saves also prune
        assert _run(ctx, project, kill_at=10**9) is False
    newest = _check(project, parent, None)
    kills = after_commit = 0
    for kill_at in range(1, 300, 3):  # every third call of the save (the writer thread's included), in turn
        killed = _run(ctx, project, kill_at=kill_at)
        previous, newest = newest, _check(project, parent, newest)
        if not killed:
            break
        kills += 1
        after_commit += newest > previous
    assert kills > 8, kills
    assert 0 < after_commit < kills  # kills landed before the commit (nothing changed) and after it (pruning)


def test_sigkill_at_random_instants_of_repeated_async_saves(tmp_path: Path) -> None:
    ctx = _context()
    project = str(tmp_path)
    parent = _build(project)
    _run(ctx, project, kill_at=10**9)
    newest = _check(project, parent, None)
    base = tmp_path / "checkpoints"
    rng = random.Random(0)
    in_flight = 0
    for _ in range(8):
        _run(ctx, project, kill_at=0, delay=rng.uniform(0.0, 0.3))
        in_flight += any(n.startswith(".tmp-") for n in os.listdir(base))
        previous, newest = newest, _check(project, parent, None)
        assert newest >= previous
    assert in_flight >= 3  # the kills did land while a write was in flight


def _train_until_killed(project_dir: str, die_at: int) -> None:
    """Child: train with an async save after every batch; SIGKILL itself right after the save of ``die_at``
    returns, with that write (and maybe the one before) in flight."""
    for name in _DIST_VARS:
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    run = Run(project_dir, total_limit=2)

    def save() -> None:
        run.acc.save_state(async_save=True)
        if run.batches.n == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    run.train(after_batch=save)


def test_kill_and_resume_with_async_saves_is_bitwise_exact(tmp_path: Path) -> None:
    reference = Run()
    reference.train()
    expected = reference.snapshot()
    ctx = _context()
    for attempt, die_at in enumerate(random.Random(1).sample(range(3, 19), 3)):
        project = str(tmp_path / str(attempt))
        proc = ctx.Process(target=_train_until_killed, args=(project, die_at), daemon=True)
        proc.start()
        proc.join(_CHILD_TIMEOUT_S)
        assert proc.exitcode == -signal.SIGKILL
        resumed = Run(project)
        resumed.acc.load_state()
        assert 1 <= resumed.batches.n <= die_at
        resumed.train()
        assert_same_run(expected, resumed.snapshot())
